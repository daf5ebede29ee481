# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import shutil
import subprocess

import pytest
import yaml

from ansible_collections.npuops.ascend.plugins.filter import monitoring
from ansible_collections.npuops.ascend.plugins.plugin_utils.model import topology
from ansible_collections.npuops.ascend.tests.unit.plugins.filter.helpers import COLLECTION, inventory, tier_spec

RULES = os.path.join(COLLECTION, "roles", "monitoring", "files", "npuops-alerts.rules.yml")
RULE_TESTS = os.path.join(COLLECTION, "tests", "unit", "prometheus", "npuops-alerts.test.yml")
DASHBOARD = os.path.join(COLLECTION, "roles", "monitoring", "files", "npuops-dashboard.json")
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def pd_plan():
    groups, hv = inventory(16)
    groups["prefill"], groups["decode"] = groups["npu_nodes"][:8], groups["npu_nodes"][8:16]
    for h in hv:
        hv[h]["npuops_proxy_host"] = "node01"
    return topology.plan_topology(groups, hv, tier_spec("8p8d_pd"))


def dp_plan():
    groups, hv = inventory(4)
    return topology.plan_topology(groups, hv, tier_spec("4node_dp"))


def test_4node_dp_scrapes_the_leader_engine_and_every_exporter():
    config = monitoring.scrape_config(dp_plan(), {"self_address": "10.0.0.11:9090", "scrape_interval": "2s"})
    jobs = dict((j["job_name"], j) for j in config["scrape_configs"])
    assert sorted(jobs) == ["npu_exporter", "prometheus", "vllm"]
    assert jobs["vllm"]["static_configs"] == [
        {"targets": ["10.0.0.11:8000"],
         "labels": {"instance": "main", "role": "leader", "host": "node01", "dp_rank": "0", "group": "main/main"}}]
    assert jobs["npu_exporter"]["static_configs"] == [
        {"targets": ["10.0.0.%d:9911" % (11 + i)], "labels": {"host": "node%02d" % (i + 1)}} for i in range(4)]
    assert jobs["prometheus"]["static_configs"] == [{"targets": ["10.0.0.11:9090"]}]
    assert config["global"]["scrape_interval"] == "2s" and config["global"]["evaluation_interval"] == "15s"
    assert config["rule_files"] == ["/etc/npuops/prometheus/rules/*.yml"]


def test_pd_engines_are_labelled_prefill_and_decode_with_their_dp_rank():
    plan = pd_plan()
    targets = monitoring.engine_targets(plan)
    assert len(targets) == 16
    by_host = dict((t["labels"]["host"], t) for t in targets)
    assert by_host["node01"]["labels"] == {"instance": "main", "role": "prefill", "host": "node01", "dp_rank": "0",
                                           "group": "main/prefill"}
    assert by_host["node08"]["labels"]["dp_rank"] == "7"
    assert by_host["node09"]["labels"] == {"instance": "main", "role": "decode", "host": "node09", "dp_rank": "0",
                                           "group": "main/decode"}
    assert by_host["node16"]["targets"] == ["10.0.0.26:8000"]
    # the PD proxy has no /metrics: the exporter of its host checks its health instead
    assert monitoring.exporter_probes(plan, "node01") == [
        {"name": "proxy_main", "url": "http://10.0.0.11:8080/healthcheck"}]
    assert monitoring.exporter_probes(plan, "node02") == []


def test_gateway_targets_are_a_job_of_their_own():
    config = monitoring.scrape_config(dp_plan(), {"gateway_targets": [{"host": "gw1", "target": "10.0.0.5:8405"}]})
    jobs = dict((j["job_name"], j) for j in config["scrape_configs"])
    assert jobs["gateway"]["static_configs"] == [{"targets": ["10.0.0.5:8405"], "labels": {"host": "gw1"}}]
    assert "prometheus" not in jobs


def test_monitor_hosts_default_to_the_first_node_and_every_host_of_the_plan_has_its_jobs():
    from ansible_collections.npuops.ascend.plugins.plugin_utils.model import topology
    assert topology.plan_monitor({"npu_nodes": ["node01", "node02"]}, {})["hosts"] == ["node01"]
    assert topology.plan_monitor({"npu_nodes": ["node01"], "monitor": ["mon1"]}, {})["hosts"] == ["mon1"]
    assert topology.plan_monitor({"npu_nodes": ["node01"], "obs": ["mon2"]},
                                 {"node01": {"npuops_monitor_group": "obs"}})["hosts"] == ["mon2"]
    plan = {"hosts": {"node01": {}, "node02": {}}, "instances": {"main": {"proxy": {"host": "node02"}}},
            "gateway": {"hosts": ["gw1", "gw2"]}, "monitor": {"hosts": ["mon1"]}, "load_host": "node01"}
    assert topology.plan_members(plan) == {"node01": ["engine", "load"], "node02": ["engine", "proxy"],
                                           "gw1": ["gateway"], "gw2": ["gateway"], "mon1": ["prometheus"]}


def test_alert_settings_change_for_and_thresholds():
    rules = dict((r["alert"], r) for r in monitoring.alert_rules({"alert_for": "0s", "slo_ttft_p99_s": 0.5})
                 ["groups"][0]["rules"] if "alert" in r)
    assert set(r["for"] for r in rules.values()) == {"0s"}
    assert rules["NpuopsTtftP99High"]["expr"].endswith("> 0.5")
    defaults = dict((r["alert"], r) for r in monitoring.alert_rules()["groups"][0]["rules"] if "alert" in r)
    assert defaults["NpuopsEngineDown"]["for"] == "1m" and defaults["NpuopsKvCacheHigh"]["for"] == "5m"


def test_the_shipped_rules_file_is_the_rendering_with_the_defaults():
    with open(RULES) as f:
        shipped = yaml.safe_load(f)
    assert shipped == monitoring.alert_rules()


def test_every_alert_has_a_promtool_test():
    with open(RULE_TESTS) as f:
        tests = yaml.safe_load(f)
    tested = set(case["alertname"] for t in tests["tests"] for case in t.get("alert_rule_test") or [] if case["exp_alerts"])
    rules = monitoring.alert_rules()["groups"][0]["rules"]
    alerts = set(r["alert"] for r in rules if "alert" in r)
    assert len(alerts) == 16 and tested == alerts
    # and every recording rule has an expected value (promql_expr_test) on the series it is about
    evaluated = set(case["expr"].split("{")[0] for t in tests["tests"] for case in t.get("promql_expr_test") or [])
    records = set(r["record"] for r in rules if "record" in r)
    assert records == {"npuops:spec_decode_acceptance_rate:rate5m", "npuops:spec_decode_mean_acceptance_length:rate5m"}
    assert records <= evaluated


def promtool(*args):
    return subprocess.run([PROMTOOL] + list(args), capture_output=True, text=True, timeout=120, check=False)


def test_promtool_checks_the_shipped_rules():
    proc = promtool("check", "rules", RULES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 18 rules found" in proc.stdout


def test_promtool_unit_tests_of_every_rule_pass():
    proc = promtool("test", "rules", RULE_TESTS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_promtool_accepts_a_rendered_scrape_configuration(tmp_path):
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    shutil.copy(RULES, str(rules_dir / "npuops.yml"))
    config = monitoring.scrape_config(pd_plan(), {"rule_files": [str(rules_dir / "*.yml")],
                                                  "self_address": "10.0.0.11:9090"})
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    proc = promtool("check", "config", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_dashboard_goes_cluster_instance_engine_npu():
    with open(DASHBOARD) as f:
        dash = json.load(f)
    rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
    assert rows == ["Cluster", "Instance", "Engine", "NPU"]
    exprs = [t["expr"] for p in dash["panels"] if p["type"] != "row" for t in p["targets"]]
    for needle in ("vllm:time_to_first_token_seconds_bucket", "vllm:request_time_per_output_token_seconds_bucket",
                   "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                   "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                   "npu_chip_info_health_status", "npu_chip_info_hbm_used_memory", "npu_chip_info_temperature",
                   "npu_chip_info_power"):
        assert any(needle in e for e in exprs), needle
    assert [v["name"] for v in dash["templating"]["list"]] == ["datasource", "instance", "host"]


@pytest.mark.parametrize("name", ["alert_rules", "scrape_config"])
def test_filters_are_registered(name):
    names = monitoring.FilterModule().filters()
    assert {"alert_rules": "prometheus_alert_rules", "scrape_config": "prometheus_scrape_config"}[name] in names


def test_the_outcome_carries_the_prometheus_urls():
    from ansible_collections.npuops.ascend.plugins.filter import outcome
    out = outcome.rollout_outcome(dp_plan(), {"served_model_name": "kimi-k3"},
                                  {"monitor": {"prometheus_urls": ["http://10.0.0.11:9090"], "exporter_port": 9911}})
    assert out["monitor"] == {"prometheus": ["http://10.0.0.11:9090"]}
    assert outcome.rollout_outcome(dp_plan(), {})["monitor"] is None


def test_the_operators_rules_are_added_and_replace_a_shipped_one_of_the_same_name():
    own = {"alert": "MyQueueLong", "expr": "sum(vllm:num_requests_waiting) > 100", "for": "5m"}
    quieter = {"alert": "NpuopsKvCacheHigh", "expr": "vllm:kv_cache_usage_perc > 0.99", "for": "15m"}
    rules = monitoring.alert_rules(None, [own, quieter])["groups"][0]["rules"]
    alerts = [r for r in rules if "alert" in r]
    by_name = dict((r["alert"], r) for r in alerts)
    assert by_name["MyQueueLong"] == own and by_name["NpuopsKvCacheHigh"] == quieter
    assert len(alerts) == 17 and [r["alert"] for r in alerts].count("NpuopsKvCacheHigh") == 1
    with pytest.raises(monitoring.AnsibleFilterError, match="is not a Prometheus rule"):
        monitoring.alert_rules(None, [{"alert": "NoExpr"}])


def test_a_rule_naming_an_unknown_setting_is_an_error(monkeypatch):
    from ansible_collections.npuops.ascend.plugins.plugin_utils import catalog
    monkeypatch.setattr(catalog, "load", lambda name: {"alerts": [
        {"alert": "X", "expr": "up > <<no_such_setting>>", "for": "1m", "severity": "warning", "summary": "x"}]})
    with pytest.raises(monitoring.AnsibleFilterError, match="<<no_such_setting>> is not a monitoring setting"):
        monitoring.alert_rules()


def test_the_memcache_metaservice_is_scraped_at_its_metrics_url():
    groups, hv = inventory(16)
    groups["prefill"], groups["decode"] = groups["npu_nodes"][:8], groups["npu_nodes"][8:16]
    for h in hv:
        hv[h].update(npuops_proxy_host="node01", npuops_kv_pool="memcache")
    config = monitoring.scrape_config(topology.plan_topology(groups, hv, tier_spec("8p8d_pd")))
    jobs = dict((j["job_name"], j) for j in config["scrape_configs"])
    # the MetaService runs on the proxy host; its metrics_url (mmc-meta.conf) is the pool host's address, port 8090
    assert jobs["memcache_meta"] == {"job_name": "memcache_meta", "metrics_path": "/metrics", "static_configs": [
        {"targets": ["10.0.0.11:8090"], "labels": {"instance": "main", "host": "node01"}}]}
    assert "memcache_meta" not in [j["job_name"] for j in monitoring.scrape_config(pd_plan())["scrape_configs"]]
