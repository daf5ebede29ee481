"""The 8 x Atlas 800 A2 tier (8node_a2_dp, the vLLM-Ascend Kimi-K3 page's A2 deployment: DP8 / TP8 / EP64) on eight
simulated A2 nodes: the recipe's `source` lines run before its command in every engine's container, the engines
come up as one DP8 group, and the service validates; preflight passes on A2 hardware."""
import json

import pytest

from npuops_sim.testing import bring_up, plan_of, playbook, sim

pytestmark = pytest.mark.sim


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = bring_up(tmp_path_factory, 8, "a2")
    sim("weights", "--node", "1", "--size", "16M", "--files", "2")
    yield c
    sim("down", timeout=300)


def test_the_a2_tier_deploys_its_recipe_on_eight_a2_nodes_and_validates(cluster, tmp_path):
    plan = plan_of(cluster, tmp_path)
    assert plan["tier"] == "8node_a2_dp" and len(plan["hosts"]) == 8
    # A2 with 8 dies per node, the image without -a3, every device's network, the capacity of the recipe
    playbook(cluster, "preflight", "-e", "npuops_reports_dir=%s" % tmp_path)
    report = json.loads((tmp_path / "preflight.json").read_text())
    assert report["ok"] and report["go"] and report["failures"] == [], report["failures"]
    assert report["capacity"]["main"]["errors"] == [] and report["capacity"]["main"]["dies"] == 64
    playbook(cluster, "weights")
    playbook(cluster, "deploy")
    for node, start_rank in (("node01", None), ("node05", "4")):
        argv = json.loads(cluster.ssh(node, "podman inspect --format '{{json .Config.Cmd}}' vllm").stdout)
        # the page's two `source` lines (CANN toolkit, vllm-ascend's custom operators), then `vllm serve`
        assert argv[:2] == ["/bin/bash", "-c"] and argv[2].startswith(
            "source /usr/local/Ascend/ascend-toolkit/set_env.sh && source /vllm-workspace/vllm-ascend/vllm_ascend/"
            "_cann_ops_custom/vendors/custom_transformer/bin/set_env.bash && exec"), argv[:4]
        assert argv[4:6] == ["vllm", "serve"] and argv[argv.index("--tensor-parallel-size") + 1] == "8"
        if start_rank:  # a headless DP worker with its own start rank
            assert "--headless" in argv and argv[argv.index("--data-parallel-start-rank") + 1] == start_rank
        else:
            assert "--headless" not in argv
        env = cluster.ssh(node, "cat /proc/$(podman inspect --format '{{.State.Pid}}' vllm)/environ | tr '\\0' '\\n'"
                          ).stdout.splitlines()
        # what the sourced scripts set reaches the engine
        assert any(e.startswith("ASCEND_CUSTOM_OPP_PATH=/vllm-workspace/vllm-ascend/vllm_ascend/_cann_ops_custom/")
                   for e in env), env
        assert "PYTHONPATH=/vllm-workspace/vllm-ascend" in env and "ASCEND_RT_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in env
    checks = playbook(cluster, "validate").stdout
    assert "FAIL" not in checks and "chat         ok " in checks, checks[-3000:]
