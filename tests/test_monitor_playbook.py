"""Monitoring on a 2-node simulated cluster (a leader and a headless worker) with a monitor host of its own (mon01, no
NPUs: Prometheus runs there, reached by the plays like every host of the plan): site.yml's monitor stage, then monitor.yml again (nothing changes); the
real Prometheus scrapes every engine and exporter with the plan's labels; simulator faults become alerts in
Prometheus's own alerts API (with host and device labels) and resolve after clear / recover; the exporter answers
within 2 s while npu-smi hangs; every dashboard panel's expression runs against the live Prometheus.

Fast settings keep the module short: scrape and rule evaluation every 2 s, every alert's `for:` 0s, the exporter
reading every 2 s with a 1 s timeout per command."""
import json
import re
import time
import urllib.parse
import urllib.request

import pytest

from npuops_sim.testing import REPO, bring_up, playbook, sim

pytestmark = pytest.mark.sim

FAST = {"npuops_monitor_scrape_interval": "2s", "npuops_monitor_evaluation_interval": "2s",
        "npuops_monitor_scrape_timeout": "2s", "npuops_monitor_alert_for": "0s",
        "npuops_monitor_exporter_interval": 2, "npuops_monitor_exporter_timeout": 1}
DASHBOARD = REPO + "/collections/ansible_collections/npuops/ascend/roles/monitoring/files/npuops-dashboard.json"
CORE_PANELS = ("Engines up", "NPU chips healthy", "Running and waiting requests", "Prompt and generation throughput",
               "KV cache usage per engine", "NPU health (1 healthy, 0 not, -1 read failed)", "HBM used", "Temperature",
               "Power", "Device links and net health")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = bring_up(tmp_path_factory, 2, "a3", "--monitors", "1")
    sim("weights", "--node", "1", "--size", "64M", "--files", "2")
    c.site = playbook(c, "site", "--tags", "weights,deploy,monitor", "-e", json.dumps(FAST), timeout=900)
    c.prometheus = "http://%s:9090" % c.ip("mon01")
    yield c
    sim("down", timeout=300)


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read().decode())


def query(c, expr):
    out = get(c.prometheus + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert out["status"] == "success", out
    return out["data"]["result"]


def wait(what, check, timeout, interval=1.0):
    deadline = time.time() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.time() > deadline:
            raise AssertionError("%s: not within %ss" % (what, timeout))
        time.sleep(interval)


def firing(c):
    alerts = get(c.prometheus + "/api/v1/alerts")["data"]["alerts"]
    return [a for a in alerts if a["state"] == "firing"]


def test_site_runs_the_monitor_stage_and_prometheus_scrapes_every_engine_and_exporter(cluster):
    assert re.search(r"Install and configure Prometheus", cluster.site.stdout)
    targets = wait("every target up", lambda: (lambda t: t if t and all(x["health"] == "up" for x in t) else None)(
        get(cluster.prometheus + "/api/v1/targets")["data"]["activeTargets"]), 30)
    by_job = {}
    for t in targets:
        by_job.setdefault(t["labels"]["job"], []).append(t["labels"])
    assert sorted(by_job) == ["npu_exporter", "prometheus", "vllm"]
    assert sorted(x["host"] for x in by_job["npu_exporter"]) == ["node01", "node02"]
    # the 2-node PP tier: the leader serves HTTP, its /metrics reports the engine
    assert [dict((k, x[k]) for k in ("instance", "role", "host", "dp_rank")) for x in by_job["vllm"]] == [
        {"instance": "main", "role": "leader", "host": "node01", "dp_rank": "0"}]
    running = query(cluster, 'vllm:num_requests_running{instance="main",role="leader",host="node01",dp_rank="0"}')
    assert running and all(r["metric"]["job"] == "vllm" for r in running)
    assert query(cluster, 'vllm:kv_cache_usage_perc{instance="main",host="node01"}')
    hbm = query(cluster, 'npu_chip_info_hbm_total_memory{host="node02",id="5"}')
    assert [r["value"][1] for r in hbm] == ["65536"]
    assert [r["value"][1] for r in query(cluster, 'machine_npu_nums{host="node02"}')] == ["16"]
    assert [r["value"][1] for r in query(cluster, 'npu_chip_info_link_status{host="node02",id="15"}')] == ["1"]
    # what each engine's image holds, read on the node from its package metadata (the 2-node tier runs the field
    # report's image: vLLM 0.23.0 and vllm-ascend 0.23.0 in the simulator's table); one image on both nodes
    images = wait("the image info of both engines", lambda: (lambda r: r if len(r) == 2 else None)(
        query(cluster, 'npuops_image_info{container="vllm"}')), 60)
    assert {(r["metric"]["host"], r["metric"]["vllm"], r["metric"]["vllm_ascend"], r["metric"]["cann"])
            for r in images} == {("node01", "0.23.0", "0.23.0", "9.1.0"), ("node02", "0.23.0", "0.23.0", "9.1.0")}
    assert len(set(r["metric"]["image_id"] for r in images)) == 1


def test_monitor_again_changes_nothing(cluster):
    out = playbook(cluster, "monitor", "-e", json.dumps(FAST)).stdout
    for node in ("node01", "node02", "mon01"):
        assert re.search(r"%s\s+: ok=\d+\s+changed=0 " % node, out), out[-2000:]
    assert "Prometheus: http://%s:9090" % cluster.ip("mon01") in out


def test_every_dashboard_panel_runs_and_the_core_panels_have_data(cluster):
    with open(DASHBOARD) as f:
        panels = [p for p in json.load(f)["panels"] if p["type"] != "row"]
    empty = []
    for p in panels:
        for t in p["targets"]:
            expr = t["expr"].replace("$instance", ".*").replace("$host", ".*").replace("$__rate_interval", "30s")
            result = query(cluster, expr)  # asserts success: no expression errors
            if not result and p["title"] in CORE_PANELS:
                empty.append((p["title"], expr))
    assert not empty, empty
    assert len(panels) >= 18


def exporter_scrape(c, node):
    t0 = time.time()
    with urllib.request.urlopen("http://%s:9911/metrics" % c.ip(node), timeout=2) as r:
        body = r.read().decode()
    return time.time() - t0, body


def test_faults_raise_alerts_with_host_and_device_labels_and_resolve(cluster):
    """node02: a chip alarm, a link down and its headless worker killed (no /metrics of its own, so only its node's
    exporter can tell it died), which ends the leader on node01 too (vLLM's EngineDeadError: a DP rank went away);
    node01: npu-smi hangs. Every alert names its host (and device); recover brings the engines back and every alert
    resolves."""
    running = cluster.ssh("node02", "podman inspect -f '{{.State.Running}}' vllm").stdout.strip()
    assert running == "true", cluster.ssh("node02", "podman logs --tail 20 vllm", check=False).stdout
    cluster.ssh("node02", "podman kill vllm")
    sim("fault", "--node", "2", "--fault", "chip_alarm", "--device", "3")
    sim("fault", "--node", "2", "--fault", "link_down", "--device", "5")
    sim("fault", "--node", "1", "--fault", "npu_smi_hang")
    t0 = time.time()
    try:
        # the exporter answers within 2 s while npu-smi hangs, and reports the failed read
        def read_failed():
            took, body = exporter_scrape(cluster, "node01")
            assert took < 2.0, took
            # the failed read, and the chips it describes with health -1 (MindCluster's "the read failed")
            return ('npuops_npu_exporter_read_error{source="npu-smi info"} 1' in body
                    and re.search(r'npu_chip_info_health_status\{id="0",[^}]*\} -1', body) and body)
        body = wait("node01's exporter reports the hung npu-smi", read_failed, 30, interval=0.5)
        assert "npu_chip_info_hbm_used_memory{" not in body

        expected = {("NpuopsNpuChipUnhealthy", "node02", "3"), ("NpuopsNpuLinkDown", "node02", "5"),
                    ("NpuopsNpuNetUnhealthy", "node02", "5"), ("NpuopsEngineDown", "node01", None),
                    ("NpuopsNpuReadFailed", "node01", None), ("NpuopsEngineContainerDown", "node02", None)}

        def all_fired():
            seen = set((a["labels"]["alertname"], a["labels"].get("host"), a["labels"].get("id"))
                       for a in firing(cluster))
            return expected <= seen and seen
        seen = wait("the alerts fire", all_fired, 120)
        took = time.time() - t0
        assert took < 120, took
        down = [a for a in firing(cluster) if a["labels"]["alertname"] == "NpuopsEngineDown"][0]["labels"]
        assert (down["instance"], down["role"], down["dp_rank"]) == ("main", "leader", "0")
        worker = [a for a in firing(cluster) if a["labels"]["alertname"] == "NpuopsEngineContainerDown"
                  and a["labels"].get("host") == "node02"][0]["labels"]
        assert worker.get("container") == "vllm", worker
        # a healthy chip / device of the same hosts raises nothing
        assert ("NpuopsNpuChipUnhealthy", "node02", "2") not in seen
        assert ("NpuopsNpuLinkDown", "node02", "4") not in seen
    finally:
        for node in ("1", "2"):
            sim("fault", "--node", node, "--fault", "clear")
        playbook(cluster, "recover", timeout=600)

    def resolved():
        left = [a["labels"]["alertname"] for a in firing(cluster)
                if a["labels"]["alertname"] in ("NpuopsNpuChipUnhealthy", "NpuopsNpuLinkDown", "NpuopsNpuNetUnhealthy",
                                                "NpuopsEngineDown", "NpuopsNpuReadFailed", "NpuopsInstanceNotAnswering",
                                                "NpuopsEngineContainerDown")]
        return not left
    wait("the alerts resolve after clear / recover", resolved, 120)
