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


def test_what_the_image_really_holds_is_checked_and_one_instance_runs_one_image(cluster, tmp_path):
    """An image tagged main-a3 that holds vLLM 0.23.0 (a tag moved, a stale local build): preflight reads its package
    metadata on the node and names the versions and the parsers the command needs. Then one tag that names different
    images on the two nodes (pulled on different days): both are named. The tags are made here, in the simulator's
    image store and in each node's own, and removed after."""
    from npuops_sim import image
    stale = "localhost/npuops-sim/stale/vllm-ascend:main-a3"
    drift = "localhost/npuops-sim/drift/vllm-ascend:kimi-k3.1-pro-a3"
    image.podman("tag", "%s:v0.23.0-a3" % image.REPOSITORY, stale)
    try:
        # main-a3's line has no int8 KV: the operator overrides the field report's int8 to plan with it
        proc, report = preflight(cluster, tmp_path, "-e", json.dumps({
            "npuops_image": stale, "npuops_model_overrides": {"kv_cache_dtype": "auto"}}))
        assert proc.returncode != 0, proc.stdout[-3000:]
        rows = [f for f in report["failures"] if f["check"] == "image_versions"]
        for host in ("node01", "node02"):
            text = " ".join(f["observed"] for f in rows if f["host"] == host)
            assert "holds vLLM 0.23.0, vllm-ascend 0.23.0, torch_npu 2.10.0.post4, CANN 9.1.0 (read from the image)" \
                in text, report["failures"]
            for flag in ("--reasoning-parser kimi_k3", "--tool-call-parser kimi_k3", "--tokenizer-mode kimi_k3"):
                assert "needs %s" % flag in text, (host, flag)
        assert report["images"]["node01"]["versions"]["vllm"] == "0.23.0"
        assert not [f for f in report["failures"] if f["check"] == "image_digest"]  # one image on both

        cluster.ssh("node01", "podman tag %s:kimi-k3.1-pro-a3 %s" % (image.REPOSITORY, drift))
        cluster.ssh("node02", "podman tag %s:v0.32.0-a3 %s" % (image.REPOSITORY, drift))
        (tmp_path / "preflight.json").unlink()
        proc, report = preflight(cluster, tmp_path, "-e", "npuops_image=" + drift)
        assert proc.returncode != 0, proc.stdout[-3000:]
        digest = [f for f in report["failures"] if f["check"] == "image_digest"]
        assert len(digest) == 1 and digest[0]["host"] == "node02", report["failures"]
        assert "node02 runs %s" % drift in digest[0]["observed"] and ", node01 runs " in digest[0]["observed"]
        # node02's holds vLLM 0.32.0: no int8 KV there, which the field report's command needs; node01's serves it
        versions_rows = [f for f in report["failures"] if f["check"] == "image_versions"]
        assert [f["host"] for f in versions_rows] == ["node02"], report["failures"]
        assert "holds vLLM 0.32.0" in versions_rows[0]["observed"]
        assert "--kv-cache-dtype int8" in versions_rows[0]["observed"]
    finally:
        image.podman("rmi", stale, check=False)
        for node in ("node01", "node02"):
            cluster.ssh(node, "podman rmi %s" % drift, check=False)
