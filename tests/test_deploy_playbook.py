"""playbooks/deploy.yml on a 4-node simulated cluster: what changes restarts, what is wrong fails fast, named."""
import ipaddress
import json
import re
import time

import pytest

from npuops_sim.testing import BIN, TEST_ENV, bring_up, run, sim

pytestmark = pytest.mark.sim
# an address on the test cluster's own management network that no node has
WRONG_LEADER = str(ipaddress.ip_network(TEST_ENV["SIM_MGMT_NET"]).network_address + 99)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = bring_up(tmp_path_factory, 4)
    sim("weights", "--node", "1", "--size", "64M", "--files", "2")
    run([BIN + "/ansible-playbook", "-i", c.inventory, "playbooks/weights.yml"], timeout=600)
    yield c
    sim("down", timeout=300)


def deploy(c, *extra, check=True):
    return run([BIN + "/ansible-playbook", "-i", c.inventory] + list(extra) + ["playbooks/deploy.yml"], check=check,
               timeout=600)


def started(c):
    out = {}
    for node in ("node01", "node02", "node03", "node04"):
        line = c.ssh(node, "podman inspect vllm --format '{{.Name}} {{.State.Status}} {{.State.StartedAt}}'",
                     check=False).stdout.strip()
        out[node] = line
    return out


def overrides(tmp_path, host, values):
    path = tmp_path / "override.yml"
    path.write_text(json.dumps({"all": {"hosts": {host: values}}}))
    return ["-i", str(path)]


def test_a_preset_change_restarts_the_engines_once_and_nothing_else(cluster):
    deploy(cluster)
    before = started(cluster)
    again = deploy(cluster)
    assert re.findall(r"changed=(\d+)", again.stdout) == ["0"] * 4 and started(cluster) == before
    changed = deploy(cluster, "-e", '{"npuops_model_overrides": {"weights_bytes": 4000000000, "max_num_seqs": 8}}')
    after = started(cluster)
    assert all(after[n] != before[n] and " running " in after[n] for n in after)
    assert "--max-num-seqs 8" in cluster.ssh("node03", "podman inspect vllm --format '{{.Config.Cmd}}'").stdout \
        .replace("[", "").replace("]", "")
    assert "changed: [node01]" in changed.stdout
    settled = deploy(cluster, "-e", '{"npuops_model_overrides": {"weights_bytes": 4000000000, "max_num_seqs": 8}}')
    assert re.findall(r"changed=(\d+)", settled.stdout) == ["0"] * 4 and started(cluster) == after


def test_a_duplicate_rank_fails_fast_naming_the_host_and_stops_everything(cluster, tmp_path):
    t0 = time.time()
    out = deploy(cluster, *overrides(tmp_path, "node03", {"npuops_vllm_overrides": {"data_parallel_start_rank": 1}}),
                 check=False)
    assert out.returncode != 0 and time.time() - t0 < 120
    assert "The deployment was stopped; engines that failed:" in out.stdout
    assert re.search(r"node0[23]: vllm: container vllm exited with code 1", out.stdout)
    assert "DP rank 1 is already taken" in out.stdout
    assert all(" running " not in s for s in started(cluster).values())


def test_a_wrong_leader_address_fails_fast_naming_the_host(cluster, tmp_path):
    t0 = time.time()
    out = deploy(cluster, *overrides(tmp_path, "node04", {"npuops_vllm_overrides": {
        "data_parallel_address": WRONG_LEADER}}), check=False)
    assert out.returncode != 0 and time.time() - t0 < 120
    assert re.search(r"node04: vllm: container vllm cannot reach %s:13389" % re.escape(WRONG_LEADER), out.stdout)
    assert all(" running " not in s for s in started(cluster).values())
    fixed = deploy(cluster)  # and the right inventory brings it all back
    assert "4node_dp is serving kimi-k3" in fixed.stdout


def test_plan_playbook_shows_what_runs_without_touching_nodes(cluster, tmp_path):
    out = tmp_path / "plan.json"
    run([BIN + "/ansible-playbook", "-i", cluster.inventory, "playbooks/plan.yml", "-e", "plan_output=%s" % out])
    plan = json.loads(out.read_text())
    argv = cluster.ssh("node02", "podman inspect vllm --format '{{json .Config.Cmd}}'").stdout
    assert json.loads(argv) == plan["hosts"]["node02"]["container"]["argv"]
