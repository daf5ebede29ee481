"""playbooks/preflight.yml on a 2-node simulated cluster (the checks are per node and per pair of nodes, whatever the
tier): healthy clusters pass; a fault fails it, named."""
import json
import time

import pytest

from npuops_sim.testing import BIN, bring_up, run, sim

pytestmark = pytest.mark.sim


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = bring_up(tmp_path_factory, 2)
    yield c
    sim("down", timeout=300)


def preflight(cluster, tmp_path, *extra):
    proc = run([BIN + "/ansible-playbook", "-i", cluster.inventory, "playbooks/preflight.yml",
                "-e", "npuops_reports_dir=%s" % tmp_path] + list(extra), check=False, timeout=600)
    report = json.loads((tmp_path / "preflight.json").read_text())
    return proc, report


def test_healthy_nodes_pass_and_the_report_is_written(cluster, tmp_path):
    proc, report = preflight(cluster, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert report["ok"] and report["go"] and report["failures"] == []
    assert report["hosts"] == ["node01", "node02"]
    assert report["plan"]["hosts"]["node02"]["reach"][0]["port"] == 29500  # the worker dials the leader's master port
    assert report["capacity"]["main"]["errors"] == []


def test_a_fault_fails_the_play_with_one_table_and_strict_false_only_reports(cluster, tmp_path):
    sim("fault", "--node", "1", "--fault", "chip_alarm", "--device", "9")
    sim("fault", "--node", "2", "--fault", "no_shm")
    wrong_nic = tmp_path / "nic.yml"  # node02's NIC misnamed in the inventory: one row, not one per check
    wrong_nic.write_text(json.dumps({"all": {"hosts": {"node02": {"npuops_nic": "eth9"}}}}))
    try:
        proc, report = preflight(cluster, tmp_path, "-i", str(wrong_nic))
        assert proc.returncode != 0
        assert "Preflight: 3 check(s) failed on node01, node02" in proc.stdout, proc.stdout[-3000:]
        assert sorted((f["host"], f["check"], f["device"] or 0) for f in report["failures"]) == [
            ("node01", "chip_health", 9), ("node02", "nic", 0), ("node02", "shm", 0)]
        lenient, report = preflight(cluster, tmp_path, "-e", '{"npuops_preflight_strict": false}')
        assert lenient.returncode == 0 and not report["ok"] and report["go"]
    finally:
        sim("fault", "--node", "1", "--fault", "clear")
        sim("fault", "--node", "2", "--fault", "clear")


def test_a_hung_npu_smi_is_a_failed_row_of_that_host_and_the_others_still_report(cluster, tmp_path):
    sim("fault", "--node", "2", "--fault", "npu_smi_hang")
    try:
        t0 = time.time()
        proc, report = preflight(cluster, tmp_path, "-e", '{"npuops_preflight_command_timeout": 5}')
        took = time.time() - t0
    finally:
        sim("fault", "--node", "2", "--fault", "clear")
    assert proc.returncode != 0 and took < 150, took
    assert [(f["host"], f["check"]) for f in report["failures"]] == [("node02", "npu_facts")]
    assert "npu-smi info did not answer within 5s" in report["failures"][0]["observed"]
    assert report["hosts"] == ["node01", "node02"]  # the other node's checks came back
