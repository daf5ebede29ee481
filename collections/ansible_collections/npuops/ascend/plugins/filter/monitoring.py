# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Monitoring from the plan: Prometheus's scrape configuration, the exporters' probes, the alert rules.

scrape_config: every serving engine's /metrics (job vllm) labelled instance (the npuops instance), role (leader /
worker, or prefill / decode for a PD pair), host, dp_rank; every node's NPU exporter (job npu_exporter, label host);
the gateway's HAProxy exporter when there is one (job gateway); Prometheus itself. A headless DP / PP worker has no
HTTP server: its engines are reported by its leader's /metrics (label engine = the DP rank within the process).

alert_rules: the shipped rules (data/alerts.yml; their `for:` durations and thresholds from settings) and the
operator's own; promtool unit tests in tests/unit/prometheus cover every shipped one. The metric names are vLLM's (vllm/v1/metrics/loggers.py) and MindCluster
NPU Exporter's (npu_collector.go), as the exporter exports them.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from ansible.errors import AnsibleFilterError

from ansible_collections.npuops.ascend.plugins.module_utils import npu_exporter
from ansible_collections.npuops.ascend.plugins.plugin_utils import catalog

PROMETHEUS_PORT = 9090
PROMETHEUS_PID_FILE = "/run/npuops/prometheus.pid"  # the monitoring role's managed_process pid_file

DEFAULTS = {
    "scrape_interval": "15s",
    "evaluation_interval": "15s",
    "scrape_timeout": "10s",
    "exporter_port": npu_exporter.DEFAULT_PORT,
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
    pools = [(name, inst["kv_pool"]) for name, inst in sorted(plan["instances"].items()) if inst.get("kv_pool")]
    if pools:
        # the memcache KV pool's MetaService exports Prometheus text at GET /metrics on its metrics_url (MemCache's
        # mmc_http_server.cpp, doc/memcache_restful_api.md)
        targets = [{"targets": [pool["metrics_url"]], "labels": {"instance": name, "host": pool["host"]}}
                   for name, pool in pools]
        jobs.append({"job_name": "memcache_meta", "metrics_path": "/metrics", "static_configs": targets})
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


SETTING = re.compile(r"<<(\w+)>>")


def _fill(text, s):
    """The rule text with each <<setting>> replaced by its value; an unknown setting is an error, not a blank."""
    def value(m):
        if m.group(1) not in s:
            raise AnsibleFilterError("alert rules: <<%s>> is not a monitoring setting (%s)" % (m.group(1), ", ".join(
                sorted(k for k in s if not isinstance(s[k], (list, dict))))))
        return str(s[m.group(1)])
    return SETTING.sub(value, text)


def alert_rules(settings=None, extra_rules=None):
    """The npuops alert rules (data/alerts.yml, settings filled in) as a Prometheus rule file, plus the operator's
    `extra_rules` (Prometheus rule mappings); an extra rule with a shipped rule's name replaces it."""
    s = _settings(settings)
    shipped = catalog.load("alerts")
    rules = [{"record": r["record"], "expr": " ".join(_fill(r["expr"], s).split())} for r in shipped.get("records") or []]
    for r in shipped["alerts"]:
        rules.append({"alert": r["alert"], "expr": " ".join(_fill(r["expr"], s).split()),
                      "for": s["alert_for"] or r["for"], "labels": {"severity": r["severity"]},
                      "annotations": {"summary": _fill(r["summary"], s),
                                      "runbook": "docs/monitoring.md#%s" % r["alert"].lower()}})
    by_name = dict((r["alert"], i) for i, r in enumerate(rules) if "alert" in r)
    for extra in extra_rules or []:
        if not isinstance(extra, dict) or not (extra.get("alert") or extra.get("record")) or not extra.get("expr"):
            raise AnsibleFilterError("npuops_monitor_extra_rules: %r is not a Prometheus rule (alert or record, and "
                                     "expr)" % (extra,))
        if extra.get("alert") in by_name:
            rules[by_name[extra["alert"]]] = extra
        else:
            rules.append(extra)
    return {"groups": [{"name": "npuops", "rules": rules}]}


class FilterModule(object):
    def filters(self):
        return {"prometheus_scrape_config": scrape_config, "prometheus_alert_rules": alert_rules,
                "npu_exporter_probes": exporter_probes}
