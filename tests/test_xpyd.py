"""xPyD: the prefill/decode tier at another ratio than 8P8D, taken from the inventory (npuops_prefill_nodes /
npuops_decode_nodes; the A3 planning article: prefill and decode scale independently). Four prefill and two decode
nodes on six simulated A3 nodes: the ranks, the connector's description of both sides and the proxy's lists follow
from 4 and 2, and the service validates through its proxy."""
import json

import pytest

from npuops_sim.testing import bring_up, playbook, sim

pytestmark = pytest.mark.sim


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = bring_up(tmp_path_factory, 6, "a3", "--tier", "8p8d_pd", "--prefill-nodes", "4")
    sim("weights", "--node", "1", "--size", "16M", "--files", "2")
    yield c
    sim("down", timeout=300)


def test_4p2d_deploys_with_its_own_ranks_and_lists_and_validates_through_the_proxy(cluster, tmp_path):
    out = tmp_path / "plan.json"
    playbook(cluster, "plan", "-e", "plan_output=%s" % out)
    plan = json.loads(out.read_text())
    assert plan["tier"] == "8p8d_pd" and plan["instances"]["main"]["shape"] == "4P2D" and len(plan["hosts"]) == 6
    playbook(cluster, "weights")
    playbook(cluster, "deploy")
    both = {"prefill": {"dp_size": 4, "tp_size": 16}, "decode": {"dp_size": 2, "tp_size": 16}}
    for node, size, rank in (("node04", "4", "3"), ("node06", "2", "1")):
        argv = json.loads(cluster.ssh(node, "podman inspect --format '{{json .Config.Cmd}}' vllm").stdout)
        assert argv[argv.index("--data-parallel-size") + 1] == size
        assert argv[argv.index("--data-parallel-rank") + 1] == rank
        assert json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_connector_extra_config"] == both
    proxy = json.loads(cluster.ssh("node01", "podman inspect --format '{{json .Config.Cmd}}' vllm-pd-proxy").stdout)
    addresses = [cluster.ip("node%02d" % i) for i in range(1, 7)]
    assert proxy[proxy.index("--prefiller-hosts") + 1:proxy.index("--prefiller-ports")] == addresses[:4]
    assert proxy[proxy.index("--decoder-hosts") + 1:proxy.index("--decoder-ports")] == addresses[4:]
    checks = playbook(cluster, "validate").stdout
    assert "FAIL" not in checks and "chat         ok " in checks, checks[-3000:]
    assert plan["endpoint"] == "http://%s:8080" % addresses[0]  # the proxy is the front door validate went through
