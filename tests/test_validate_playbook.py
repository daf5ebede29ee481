"""playbooks/validate.yml on the 2-node TP16xPP2 simulated cluster: a healthy service passes every check,
one node without /etc/hccn.conf makes it answer garbage and the chat check fails."""
import pytest

from npuops_sim.testing import assert_validate_catches_missing_hccn_conf, bring_up, playbook, sim

pytestmark = pytest.mark.sim


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = bring_up(tmp_path_factory, 2)
    sim("weights", "--node", "1", "--size", "64M", "--files", "2")
    playbook(c, "weights")
    playbook(c, "deploy")
    yield c
    sim("down", timeout=300)


def test_a_healthy_2node_service_passes_every_check(cluster):
    out = playbook(cluster, "validate").stdout
    for check in ("health", "models", "chat", "reasoning", "tool_call", "image", "long_prompt", "stream"):
        assert "%-12s ok " % check in out, out[-3000:]
    assert "FAIL" not in out


def test_garbage_from_a_2node_service_fails_the_chat_check(cluster):
    assert_validate_catches_missing_hccn_conf(cluster, "node02")
