# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Monitoring from the plan: Prometheus's scrape configuration, the exporters' probes, the alert rules.

scrape_config: every serving engine's /metrics (job vllm) labelled instance (the npuops instance), role (leader /
worker, or prefill / decode for a PD pair), host, dp_rank; every node's NPU exporter (job npu_exporter, label host);
the gateway's HAProxy exporter when there is one (job gateway); Prometheus itself. A headless DP / PP worker has no
HTTP server: its engines are reported by its leader's /metrics (label engine = the DP rank within the process).

alert_rules: the shipped rules (their `for:` durations and thresholds from settings); promtool unit tests in
tests/unit/prometheus cover every one. The metric names are vLLM's (vllm/v1/metrics/loggers.py) and MindCluster
NPU Exporter's (npu_collector.go), as the exporter exports them.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DEFAULTS = {
    "scrape_interval": "15s",
    "evaluation_interval": "15s",
    "scrape_timeout": "10s",
    "exporter_port": 9911,
    "rule_files": ["/etc/npuops/prometheus/rules/*.yml"],
    "gateway_targets": [],
    # alert settings
    "alert_for": None,  # one duration for every rule (tests: "0s"), else each rule's own
    "slo_ttft_p99_s": 2.0,
    "kv_usage_high": 0.95,
    "hbm_full_ratio": 0.95,
    "prefix_hit_min_ratio": 0.5,
    "prefix_queries_min_rate": 50,
    "stall_window": "2m",
}


def _settings(settings):
    s = dict(DEFAULTS)
    s.update(dict((k, v) for k, v in (settings or {}).items() if v is not None))
    return s


def engine_role(entry):
    """leader / worker, or prefill / decode for the two sides of a PD pair."""
    kv = entry.get("kv_role")
    if kv == "kv_producer":
        return "prefill"
    if kv == "kv_consumer":
        return "decode"
    return entry["role"]


def engine_targets(plan):
    """[{targets, labels}] of every engine that serves HTTP, host by host in plan order."""
    out = []
    for host in sorted(plan["hosts"]):
        e = plan["hosts"][host]
        if not e.get("serves_http"):
            continue
        out.append({"targets": ["%s:%d" % (e["node_ip"], e["api_port"])],
                    "labels": {"instance": e["instance"], "role": engine_role(e), "host": host,
                               "dp_rank": str(e.get("dp_start_rank", 0)), "group": e["group_key"]}})
    return out


def exporter_targets(plan, port, hosts=None):
    out = []
    for host in sorted(hosts if hosts is not None else plan["hosts"]):
        e = plan["hosts"].get(host)
        if e is None:
            continue
        out.append({"targets": ["%s:%d" % (e["node_ip"], int(port))], "labels": {"host": host}})
    return out


def exporter_probes(plan, host):
    """The health checks `host`'s exporter runs: the PD proxy of every instance whose proxy is there."""
    probes = []
    for name in sorted(plan["instances"]):
        proxy = plan["instances"][name].get("proxy")
        if proxy and proxy["host"] == host:
            probes.append({"name": "proxy_%s" % name,
                           "url": "http://%s:%d%s" % (proxy["address"], proxy["port"], proxy.get("health") or "/")})
    return probes


def scrape_config(plan, settings=None):
    """prometheus.yml as data (the role writes it with to_nice_yaml and checks it with promtool)."""
    s = _settings(settings)
    jobs = [
        {"job_name": "prometheus", "static_configs": [{"targets": [s["self_address"]]}]} if s.get("self_address")
        else None,
        {"job_name": "vllm", "metrics_path": "/metrics", "static_configs": engine_targets(plan)},
        {"job_name": "npu_exporter", "metrics_path": "/metrics",
         "static_configs": exporter_targets(plan, s["exporter_port"], s.get("exporter_hosts"))},
    ]
    if s["gateway_targets"]:
        jobs.append({"job_name": "gateway", "metrics_path": "/metrics",
                     "static_configs": [{"targets": [t["target"]], "labels": {"host": t["host"]}}
                                        for t in s["gateway_targets"]]})
    return {
        "global": {"scrape_interval": s["scrape_interval"], "evaluation_interval": s["evaluation_interval"],
                   "scrape_timeout": s["scrape_timeout"], "external_labels": {"npuops_tier": plan.get("tier") or ""}},
        "rule_files": list(s["rule_files"]),
        "scrape_configs": [j for j in jobs if j],
    }


def _rule(name, expr, for_, severity, summary, action, s):
    """One alert. `action` (the first thing to do) is written in docs/monitoring.md, where the annotation points."""
    del action  # kept next to the rule for the reader; the operator reads it in the runbook
    return {"alert": name, "expr": " ".join(expr.split()), "for": s["alert_for"] or for_,
            "labels": {"severity": severity},
            "annotations": {"summary": summary, "runbook": "docs/monitoring.md#%s" % name.lower()}}


def alert_rules(settings=None):
    """The npuops alert rules as a Prometheus rule file (data)."""
    s = _settings(settings)
    w = s["stall_window"]
    kv = ("max by (instance, host, role, dp_rank) "
          "(vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc)")
    rules = [
        _rule("NpuopsEngineDown", 'up{job="vllm"} == 0', "1m", "critical",
              "vLLM engine {{ $labels.instance }}/{{ $labels.role }} on {{ $labels.host }} does not answer /metrics",
              "status.yml names why (container exited, host unreachable, frozen); recover.yml restarts it", s),
        _rule("NpuopsInstanceNotAnswering", 'max by (instance) (up{job="vllm"}) == 0', "1m", "critical",
              "no engine of instance {{ $labels.instance }} answers",
              "run status.yml, then recover.yml; with replicas the gateway sends traffic elsewhere meanwhile", s),
        _rule("NpuopsRequestsStalled",
              "sum by (instance, host) (vllm:num_requests_waiting) > 0 and "
              "sum by (instance, host) (rate(vllm:generation_tokens_total[%s])) == 0" % w, "2m", "critical",
              "{{ $labels.instance }} on {{ $labels.host }}: requests wait and no token is generated",
              "a wedged engine (HCCL hang, stuck rank): read logs.yml, then recover.yml restarts the instance", s),
        _rule("NpuopsKvCacheHigh", "%s > %s" % (kv, s["kv_usage_high"]), "5m", "warning",
              "KV cache of {{ $labels.instance }} on {{ $labels.host }} (dp_rank {{ $labels.dp_rank }}) is more than "
              "%s used" % s["kv_usage_high"],
              "requests will queue or be preempted: lower max_num_seqs / context, or add an instance", s),
        _rule("NpuopsPreemptions",
              "sum by (instance, host) (rate(vllm:num_preemptions_total[5m])) > 0", "5m", "warning",
              "{{ $labels.instance }} on {{ $labels.host }} preempts requests",
              "the KV cache is too small for the load: lower concurrency or max_model_len, or add capacity", s),
        _rule("NpuopsTtftP99High",
              "histogram_quantile(0.99, sum by (instance, le) "
              "(rate(vllm:time_to_first_token_seconds_bucket[5m]))) > %s" % s["slo_ttft_p99_s"], "5m", "warning",
              "TTFT p99 of {{ $labels.instance }} is above the SLO of %ss" % s["slo_ttft_p99_s"],
              "look at waiting requests and prefill throughput on the dashboard; scale prefill or cap prompts", s),
        _rule("NpuopsPrefixHitRateCollapse",
              "(sum by (instance) (rate(vllm:prefix_cache_hits_total[10m])) / "
              "sum by (instance) (rate(vllm:prefix_cache_queries_total[10m]))) < %s * "
              "(sum by (instance) (rate(vllm:prefix_cache_hits_total[1h] offset 10m)) / "
              "sum by (instance) (rate(vllm:prefix_cache_queries_total[1h] offset 10m))) and "
              "sum by (instance) (rate(vllm:prefix_cache_queries_total[10m])) > %s"
              % (s["prefix_hit_min_ratio"], s["prefix_queries_min_rate"]), "10m", "warning",
              "prefix cache hit rate of {{ $labels.instance }} fell under %s of its last hour under load"
              % s["prefix_hit_min_ratio"],
              "multi-turn sessions no longer reach the engine holding their prefix: check the gateway's "
              "affinity, a restart that emptied the cache, or a prompt template change", s),
        _rule("NpuopsNpuChipUnhealthy", "npu_chip_info_health_status == 0", "1m", "critical",
              "NPU {{ $labels.id }} on {{ $labels.host }} is not healthy",
              "npu-smi info -t health -i <card> -c <chip> names the error code; drain the node and follow "
              "Huawei's fault handling for the code", s),
        _rule("NpuopsNpuReadFailed", "npuops_npu_exporter_read_error == 1", "2m", "warning",
              "{{ $labels.source }} fails or hangs on {{ $labels.host }}",
              "a hung npu-smi means a wedged driver: check dmesg and the device state; the chip metrics of "
              "the node are stale meanwhile", s),
        _rule("NpuopsHbmFullOnIdleEngine",
              "(npu_chip_info_hbm_used_memory / npu_chip_info_hbm_total_memory > %s) and on (host) "
              '(sum by (host) (vllm:num_requests_running) == 0)' % s["hbm_full_ratio"], "10m", "warning",
              "NPU {{ $labels.id }} on {{ $labels.host }}: HBM nearly full while its engine runs no request",
              "more than the engine's budget is held: npu_chip_info_process_info names the pids; a leftover "
              "process or a leak - stop it, or restart the engine", s),
        _rule("NpuopsNpuLinkDown", "npu_chip_info_link_status == 0", "1m", "critical",
              "NPU {{ $labels.id }} on {{ $labels.host }}: device link down",
              "hccn_tool -i <id> -link -g; check the optical module, cable and switch port "
              "(hccn_tool -i <id> -lldp -g names the port)", s),
        _rule("NpuopsNpuNetUnhealthy", "npu_chip_info_network_status == 0", "1m", "critical",
              "NPU {{ $labels.id }} on {{ $labels.host }}: net health is not Success",
              "hccn_tool -i <id> -net_health -g; the netdetect address must be reachable from the device", s),
        _rule("NpuopsExporterDown", 'up{job="npu_exporter"} == 0', "2m", "warning",
              "the NPU exporter on {{ $labels.host }} does not answer",
              "monitor.yml restarts it; if the node is down, the engine alerts say so too", s),
        _rule("NpuopsGatewayBackendDown",
              '(haproxy_server_status{state="DOWN"} == 1) or (npuops_probe_success == 0)', "1m", "critical",
              "gateway backend {{ $labels.server }}{{ $labels.probe }} on "
              "{{ $labels.host }} is down",
              "the gateway no longer sends traffic there: status.yml names the instance; recover.yml", s),
    ]
    return {"groups": [{"name": "npuops", "rules": rules}]}


def monitor_hosts(groups, group="monitor"):
    """The hosts of group `monitor`, or the first NPU node."""
    hosts = list(groups.get(group) or [])
    if hosts:
        return hosts
    nodes = list(groups.get("npu_nodes") or [])
    return nodes[:1]


class FilterModule(object):
    def filters(self):
        return {"prometheus_scrape_config": scrape_config, "prometheus_alert_rules": alert_rules,
                "npu_exporter_probes": exporter_probes, "monitor_hosts": monitor_hosts}
