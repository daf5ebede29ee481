"""Upstream's current PD topology: 4 prefill + 4 decode nodes on 8 simulated A3 nodes (tier 4p4d_pd, the v0.26.0rc and
v0.27.1rc lines' Kimi-K3 page), on a v0.27.1rc image: the plan takes that line's recipe, with its own correction (the
image's jemalloc preload cleared, vllm-ascend #17155). One decode node carries an older Mooncake: below HDK 26.0
fabric memory then lacks a prerequisite, so preflight names the node and the instance moves its KV over RoCE, and the
deploys that run without preflight keep that. A node whose containers would preload jemalloc fails preflight, named.
One cluster for the module; the tests run in file order."""
import json

import pytest

from npuops_sim.testing import bring_up, plan_of, playbook, sim

pytestmark = pytest.mark.sim

NODES = ["node%02d" % i for i in range(1, 9)]
QUICK = json.dumps({"npuops_serve_settle_seconds": 3})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = bring_up(tmp_path_factory, 8, "a3", "--tier", "4p4d_pd")
    sim("weights", "--node", "1", "--size", "16M", "--files", "2")
    yield c
    sim("down", timeout=300)


def env_of(cluster, node):
    return dict(line.split("=", 1) for line in json.loads(cluster.ssh(
        node, "podman inspect --format '{{json .Config.Env}}' vllm").stdout))


def test_4p4d_on_a_v0271rc_image_deploys_its_lines_recipe_and_validates_through_the_proxy(cluster, tmp_path):
    """site.yml from bare nodes; node05 (decode) carries Mooncake 0.3.10 on HDK 25.5.1: preflight names it (fabric
    memory needs HDK >= 26.0, or >= 25.5 with Mooncake >= 0.3.11) and every engine of the instance moves KV over RoCE
    instead (deviations fabric_mem_fallback, fabric_mem_fallback_roce); validate goes through the proxy."""
    plan = plan_of(cluster, tmp_path)
    assert plan["tier"] == "4p4d_pd" and plan["instances"]["main"]["shape"] == "4P4D" and len(plan["hosts"]) == 8
    choice = plan["instances"]["main"]["recipe"]
    assert (choice["recipe"], choice["line"]) == ("vllm_ascend_kimi_k3_4p4d_a3", "0.27.1rc")
    sim("fault", "--node", "5", "--fault", "old_mooncake")
    out = playbook(cluster, "site", "--skip-tags", "bench,accuracy,monitor", "-e", QUICK).stdout
    flat = " ".join(out.split())
    assert "fabric_mem (service)" in out and "HDK 25.5.1 < 26.0 with Mooncake 0.3.10 < 0.3.11" in flat, out[-4000:]
    assert "instance main moves KV over RoCE instead of fabric memory" in flat
    for node in NODES:
        env = env_of(cluster, node)
        assert "ASCEND_ENABLE_USE_FABRIC_MEM" not in env and env["HCCL_INTRA_ROCE_ENABLE"] == "1", (node, env)
        assert env["LD_PRELOAD"] == ""  # the v0.27.1rc line: no jemalloc preload (#17155)
    assert env_of(cluster, "node05")["HCCL_OP_EXPANSION_MODE"] == "AIV"
    assert "HCCL_OP_EXPANSION_MODE" not in env_of(cluster, "node01")
    checks = playbook(cluster, "validate").stdout
    assert "FAIL" not in checks and "chat         ok " in checks, checks[-3000:]


def test_a_deploy_without_preflight_keeps_the_fallback_and_restarts_nothing(cluster):
    before = cluster.started(NODES)
    out = playbook(cluster, "deploy", "-e", QUICK).stdout
    assert cluster.started(NODES) == before, out[-3000:]
    assert "HCCL_INTRA_ROCE_ENABLE" in env_of(cluster, "node02")


def test_a_node_whose_containers_preload_jemalloc_fails_preflight_on_the_v0271rc_line(cluster, tmp_path):
    """The node's container engine mounts an /etc/ld.so.preload naming jemalloc into every container: the engine's
    environment cannot clear that (as it clears an LD_PRELOAD), so preflight fails naming the host."""
    sim("fault", "--node", "3", "--fault", "jemalloc_preload")
    try:
        proc = playbook(cluster, "preflight", "-e", "npuops_reports_dir=%s" % tmp_path, check=False)
    finally:
        sim("fault", "--node", "3", "--fault", "clear")
    flat = " ".join(proc.stdout.split())
    assert proc.returncode != 0 and "Preflight: 1 check(s) failed on node03" in flat, flat[-3000:]
    report = json.loads((tmp_path / "preflight.json").read_text())
    [row] = report["failures"]
    assert (row["host"], row["check"], row["observed"]) == (
        "node03", "jemalloc", "/etc/ld.so.preload: /usr/lib64/libjemalloc.so.2"), row
    assert "does not support a jemalloc preload (vllm-ascend #17155)" in row["fix"]
