# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy

from ansible_collections.npuops.ascend.plugins.filter import preflight
from ansible_collections.npuops.ascend.tests.unit.plugins.filter.helpers import tier_spec

REQ = {"min_driver": "25.5.0", "min_cann": "8.3.RC1"}
IMAGE = "quay.io/ascend/vllm-ascend:v0.23.0-a3"


def node(i, devices=16):
    chips = [{"card": d // 2, "chip": d % 2, "logic_id": d, "phy_id": d, "health": "OK", "hbm_used_mb": 3300,
              "hbm_total_mb": 65536} for d in range(devices)]
    addrs = dict((str(d), "10.9.%d.%d" % (i, d + 1)) for d in range(devices))
    return {
        "npu": {"generation": "A3", "chip_count": devices, "card_count": 8, "chips_per_card": 2,
                "driver_version": "25.5.1", "cann_version": None, "chips": chips, "processes": []},
        "npu_result": {"changed": False},
        "host_check": {"changed": False, "failed_checks": [], "hccn_addresses": addrs},
        "hccn_check": {"changed": False, "failed_checks": [], "ping": [],
                       "devices": [{"phy_id": d, "tls_switch": 0} for d in range(devices)]},
    }


def cluster(n=4):
    return dict(("node%02d" % (i + 1), node(i)) for i in range(n))


def report(results, **kw):
    return preflight.preflight_report(results, tier_spec("4node_dp"), image=kw.pop("image", IMAGE),
                                      requirements=REQ, **kw)


def checks(rep):
    return sorted((r["host"], r["check"], r["device"]) for r in rep["failures"])


def test_a_healthy_cluster_is_a_go():
    rep = report(cluster())
    assert rep["ok"] and rep["go"] and rep["failures"] == []
    assert rep["table"] == ["preflight: every check passed"]


def test_node_level_findings_name_host_and_device():
    c = cluster()
    c["node02"]["npu"]["chips"][9]["health"] = "Alarm"
    c["node03"]["npu"]["processes"] = [{"card": 2, "chip": 0, "pid": 77, "name": "python3", "memory_mb": 50000}]
    c["node04"]["npu"]["driver_version"] = "24.1.rc3.7"
    c["node01"]["npu"]["chips"][5]["hbm_used_mb"] = 40000
    rep = report(c)
    assert checks(rep) == [("node01", "hbm_free", 5), ("node02", "chip_health", 9), ("node03", "hbm_free", 4),
                           ("node04", "driver", None)]
    driver = [r for r in rep["failures"] if r["check"] == "driver"][0]
    assert driver["observed"] == "driver 24.1.rc3.7" and "25.5.0" in driver["expected"]
    assert not rep["go"]


def test_module_results_become_rows():
    c = cluster()
    c["node02"]["host_check"]["failed_checks"] = [{"check": "shm", "observed": "/dev/shm is 64 MiB",
                                                   "expected": "at least 16.0 GiB", "fix": "enlarge"}]
    c["node03"]["hccn_check"]["failed_checks"] = [{"check": "link", "phy_id": 7, "observed": "link status: DOWN",
                                                   "expected": "link status: UP", "fix": "cable"}]
    c["node04"]["npu_result"] = {"failed": True, "msg": "npu-smi info failed: dcmi module initialize failed"}
    c["node04"]["npu"] = None
    c["node01"]["hccn_check"] = {"unreachable": True, "msg": "ssh: connect to host timed out"}
    rep = report(c)
    assert checks(rep) == [("node01", "ssh", None), ("node02", "shm", None), ("node03", "link", 7),
                           ("node04", "npu_facts", None)]
    assert "dcmi" in [r for r in rep["failures"] if r["host"] == "node04"][0]["observed"]


def test_cluster_rules_tls_and_unique_addresses():
    c = cluster()
    c["node03"]["hccn_check"]["devices"][7]["tls_switch"] = 1
    c["node04"]["host_check"]["hccn_addresses"]["2"] = "10.9.0.3"  # node01 device 2's address
    rep = report(c)
    assert checks(rep) == [("node03", "tls", 7), ("node04", "hccn_unique", 2)]
    tls = [r for r in rep["failures"] if r["check"] == "tls"][0]
    assert tls["observed"] == "tls switch 1" and "as on the other 63 devices" in tls["expected"]


def test_a_cut_between_two_nodes_is_one_fabric_row_per_side_and_other_ping_failures_stay():
    c = cluster()
    c["node02"]["hccn_check"]["ping"] = [{"phy_id": d, "target": "10.9.3.%d" % (d + 1), "ok": False}
                                         for d in range(16)] + [{"phy_id": 0, "target": "10.9.0.1", "ok": True}]
    c["node02"]["hccn_check"]["failed_checks"] = [
        {"check": "ping", "phy_id": d, "observed": "ping to 10.9.3.%d: 0/3 received" % (d + 1),
         "expected": "0% loss", "fix": "x"} for d in range(16)]
    c["node01"]["hccn_check"]["ping"] = [{"phy_id": 3, "target": "10.9.2.4", "ok": False},
                                         {"phy_id": 4, "target": "10.9.2.5", "ok": True}]
    c["node01"]["hccn_check"]["failed_checks"] = [{"check": "ping", "phy_id": 3, "observed": "ping to 10.9.2.4: "
                                                   "0/3 received", "expected": "0% loss", "fix": "x"}]
    rep = report(c)
    assert checks(rep) == [("node01", "ping", 3), ("node02", "fabric", None)]
    fabric = [r for r in rep["failures"] if r["check"] == "fabric"][0]
    assert fabric["observed"].startswith("all 16 pings from node02 to node04 failed")
    ping = [r for r in rep["failures"] if r["check"] == "ping"][0]
    assert ping["observed"].endswith("(node03 device 3)")


def test_tier_and_image_must_match_the_hardware():
    c = cluster(4)
    c["node01"]["npu"].update(generation="A2", chip_count=8)
    rep = report(c, image="quay.io/ascend/vllm-ascend:v0.23.0")
    found = checks(rep)
    assert ("node01", "chips", None) in found
    assert ("node02", "image", None) in found  # an A2 image on A3 nodes
    assert ("node01", "image", None) not in found


def test_capacity_errors_fail_and_warnings_do_not():
    cap = {"main": {"errors": ["weights need 187.5 GiB per die"], "warnings": []}}
    rep = report(cluster(), capacity=cap, plan={"instances": {"main": {"groups": {"main": {"leader": "node01"}}}}})
    assert checks(rep) == [("node01", "capacity", None)]
    warn = {"main": {"errors": [], "warnings": ["at full length only 2 sequences run"]}}
    rep = report(cluster(), capacity=warn)
    assert rep["go"] and rep["warnings"][0]["severity"] == "warning"


def test_not_strict_reports_but_goes():
    c = cluster()
    c["node02"]["npu"]["chips"][0]["health"] = "Warning"
    rep = report(c, strict=False)
    assert not rep["ok"] and rep["go"]


def test_ping_mesh_modes():
    addrs = dict(("n%d" % i, dict((str(d), "10.%d.0.%d" % (i, d)) for d in range(16))) for i in range(6))
    sample = preflight.ping_mesh(copy.deepcopy(addrs), "auto")
    assert all(len(v) == 16 for v in sample.values())  # 6 nodes: the covering sample
    small = dict(list(addrs.items())[:4])
    full = preflight.ping_mesh(small, "auto")
    assert all(len(v) == 48 for v in full.values())  # 4 nodes: full mesh, 3 peers per device


def test_image_generation_by_tag_suffix():
    assert preflight.image_generation("m.daocloud.io/quay.io/ascend/vllm-ascend:v0.23.0-a3-openeuler") == "A3"
    assert preflight.image_generation("quay.io/ascend/vllm-ascend:v0.23.0-openeuler") == "A2"


def test_the_services_own_engine_ports_and_npu_memory_are_not_conflicts_but_a_stranger_is():
    c = cluster()
    c["node01"]["npu"]["processes"] = [{"card": 0, "chip": 0, "pid": 4475, "name": "python3", "memory_mb": 52000},
                                       {"card": 0, "chip": 1, "pid": 999, "name": "train.py", "memory_mb": 30000}]
    c["node01"]["host_check"].update(service_pids=[4475, 4476], held_by_service=[{"port": 8000,
                                                                                  "owner": "4475 (python3)"}])
    c["node02"]["host_check"]["failed_checks"] = [{"check": "port_free", "observed": "port 8000 is in use by 77 (nc)",
                                                   "expected": "port 8000 free", "fix": "stop it", "port": 8000}]
    rep = report(c)
    assert checks(rep) == [("node01", "hbm_free", 1), ("node02", "port_free", None)]
    assert sorted((r["host"], r["check"], r["device"]) for r in rep["service"]) == [
        ("node01", "hbm_free", 0), ("node01", "port_free", None)]
    assert any("port_free (service)" in line and "held by the service" in line for line in rep["table"])


def test_workers_dial_the_live_listener_where_the_leader_serves():
    hv = {"node01": {"r": {"held_by_service": [{"port": 13389, "owner": "4475 (python3)"}]}}, "node05": {"r": {}}}
    reach = [{"host": "node01", "address": "10.0.0.11", "port": 13389}]
    assert preflight.reach_targets(reach, hv, "r") == [dict(reach[0], live=True)]
    reach = [{"host": "node05", "address": "10.0.0.15", "port": 13389}]
    assert preflight.reach_targets(reach, hv, "r") == [dict(reach[0], live=False)]


def test_a_failed_reach_check_is_a_row_of_the_worker():
    c = cluster()
    c["node03"]["reach_check"] = {"changed": False, "failed_checks": [{
        "check": "reach", "observed": "10.0.0.11:13389 (node01) timed out", "expected": "TCP connect", "fix": "open"}]}
    assert checks(report(c)) == [("node03", "reach", None)]


def test_gather_reads_the_npu_discovery_from_host_check():
    """host_check (npu_facts: true) carries the NPU facts, or npu_error: a failed discovery becomes the npu_facts
    row of that host while its other checks still count."""
    hostvars = {
        "node01": {"ansible_facts": {"npu": {"chip_count": 16}}, "npuops_host_result": {"ok": True}},
        "node02": {"npuops_host_result": {"ok": True, "npu_error": "npu-smi info did not answer within 5s"}},
        "node03": {"npuops_host_result": {"unreachable": True, "msg": "timed out"}},
    }
    gathered = preflight.preflight_gather(hostvars, ["node01", "node02", "node03"])
    assert gathered["node01"]["npu"] == {"chip_count": 16} and gathered["node01"]["npu_result"] == {"ok": True}
    assert gathered["node02"]["npu"] is None
    assert gathered["node02"]["npu_result"] == {"failed": True, "msg": "npu-smi info did not answer within 5s"}
    assert gathered["node03"]["npu_result"] == {"unreachable": True, "msg": "timed out"}
    c = cluster()
    c["node02"]["npu"], c["node02"]["npu_result"] = None, gathered["node02"]["npu_result"]
    rep = report(c)
    assert checks(rep) == [("node02", "npu_facts", None)]
    assert rep["failures"][0]["observed"] == "npu-smi info did not answer within 5s"


def test_image_rows_name_what_the_image_holds_and_nodes_with_another_image():
    from ansible_collections.npuops.ascend.plugins.filter import preflight as pf

    def held(vllm, ident, image="q/vllm-ascend:main-a3"):
        return {"host_check": {"image": {"image": image, "present": True, "id": ident, "digest": None, "error": None,
                                         "versions": {"vllm": vllm, "vllm_ascend": "0.23.0" if vllm == "0.23.0"
                                                      else "main", "torch_npu": "t", "torch": "t", "cann": "9.1.0"}}}}
    needs = {"reasoning_parser": "kimi_k3"}
    containers = dict((h, {"engine": {"image": "q/vllm-ascend:main-a3", "recipe": "r", "needs": needs}})
                      for h in ("n1", "n2", "n3"))
    plan = {"instances": {"main": {"hosts": ["n1", "n2", "n3"]}}}
    rows, images = pf.image_rows({"n1": held("0.27.1", "A"), "n2": held("0.27.1", "A"), "n3": held("0.23.0", "B")},
                                 plan, containers)
    errors = [(r["host"], r["check"]) for r in rows if r["severity"] == "error"]
    assert sorted(errors) == [("n3", "image_digest"), ("n3", "image_versions")]
    digest = [r for r in rows if r["check"] == "image_digest"][0]
    assert digest["observed"] == "n3 runs q/vllm-ascend:main-a3 B, n1 runs A"
    assert "pull the same image on n1 and n3" in digest["fix"]
    assert images["n3"]["versions"]["vllm"] == "0.23.0"


def _line_case(driver, mooncake, preload=None, env_ld=""):
    plan = {"instances": {"main": {"hosts": ["n1", "n2"]}}}
    containers = dict((h, {"engine": {"image": "quay.io/ascend/vllm-ascend:v0.27.1rc1-a3",
                                      "env": {"ASCEND_ENABLE_USE_FABRIC_MEM": "1", "LD_PRELOAD": env_ld}}})
                      for h in ("n1", "n2"))
    results = dict((h, {"npu": {"driver_version": "26.0.1" if h == "n1" else driver}}) for h in ("n1", "n2"))
    held = dict((h, {"present": True, "versions": {"cann": "9.1.0", "mooncake": mooncake if h == "n2" else
                                                   "0.3.11.post1"}, "preload": preload if h == "n2" else None})
                for h in ("n1", "n2"))
    return preflight.line_rows(results, plan, containers, held)


def test_a_node_short_of_what_fabric_memory_needs_moves_its_instance_to_roce_named_but_not_failed():
    rows, off = _line_case("25.5.1", "0.3.11.post1")
    assert rows == [] and off == []
    rows, off = _line_case("25.5.1", "0.3.10")
    assert off == ["main"] and [(r["host"], r["check"], r["severity"]) for r in rows] == [("n2", "fabric_mem",
                                                                                           "service")]
    assert rows[0]["observed"] == "HDK 25.5.1 < 26.0 with Mooncake 0.3.10 < 0.3.11"
    assert rows[0]["fix"].startswith("instance main moves KV over RoCE instead of fabric memory")


def test_a_jemalloc_preload_fails_on_a_line_that_refuses_it_unless_the_environment_clears_it():
    rows, _off = _line_case("26.0.1", "0.3.11", preload={"env": "/usr/lib64/libjemalloc.so.2", "file": None})
    assert [(r["host"], r["check"], r["severity"]) for r in rows] == [("n2", "jemalloc", "service")]
    rows, _off = _line_case("26.0.1", "0.3.11", preload={"env": None, "file": "/usr/lib64/libjemalloc.so.2"})
    assert [(r["host"], r["check"], r["severity"], r["observed"]) for r in rows] == [
        ("n2", "jemalloc", "error", "/etc/ld.so.preload: /usr/lib64/libjemalloc.so.2")]
    # an operator's override that leaves the image's preload in place: a failure too
    rows, _off = _line_case("26.0.1", "0.3.11", preload={"env": "/usr/lib64/libjemalloc.so.2", "file": None},
                            env_ld="/usr/lib64/libjemalloc.so.2")
    assert [(r["check"], r["severity"]) for r in rows] == [("jemalloc", "error")]


def test_the_kept_finding_on_fabric_memory_is_read_back():
    import base64
    import json
    slurped = {"results": [
        {"item": {"key": "a"}, "content": base64.b64encode(json.dumps({"fabric_mem": False}).encode()).decode()},
        {"item": {"key": "b"}, "content": base64.b64encode(json.dumps({"fabric_mem": True}).encode()).decode()},
        {"item": {"key": "c"}, "failed": True, "msg": "file not found"},
        {"item": {"key": "d"}, "content": base64.b64encode(b"not json").decode()}]}
    assert preflight.fabric_mem_off(slurped) == ["a"]
    plan = {"instances": {"a": {"hosts": ["n1", "n2"]}, "b": {"hosts": ["n3"]}}}
    containers = {"n1": {"engine": {"env": {}}}, "n2": {"engine": {"env": {"ASCEND_ENABLE_USE_FABRIC_MEM": "1"}}},
                  "n3": {"engine": {"env": {}}}}
    assert preflight.fabric_mem_instances(containers, plan) == {
        "a": {"host": "n1", "path": "/var/lib/npuops/instances/a-fabric-mem.json"}}
