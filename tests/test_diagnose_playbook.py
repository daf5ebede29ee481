"""diagnose on a 4-node simulated cluster (4node_dp, the tutorial's recipe): a deploy whose engines do not come up
names the cause, the host and the fix before it stops them, within a minute of the failure; diagnose.yml reads a
running service the same way. Faults as the operator meets them: a node's device NIC down, TLS switches that differ,
the fabric between two nodes cut, a port taken, a wrong NIC name in the inventory, a small /dev/shm, a missing
/etc/hccn.conf."""
import json
import re
import shlex
import time

import ansible_runner
import pytest

from npuops_sim.testing import BIN, REPO, bring_up, env, run, sim

pytestmark = pytest.mark.sim
DOWNTIME = ["-e", '{"npuops_rollout_allow_downtime": true}']
RPC_PORT = 13345  # the tutorial's --data-parallel-rpc-port (its recipe's ports)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = bring_up(tmp_path_factory, 4)
    sim("weights", "--node", "1", "--size", "64M", "--files", "2")
    run([BIN + "/ansible-playbook", "-i", c.inventory, "playbooks/weights.yml"], timeout=600)
    yield c
    sim("down", timeout=300)


@pytest.fixture
def faults():
    """The faults a test sets, cleared after it whatever happens."""
    nodes = []

    def add(node, fault, *args):
        sim("fault", "--node", str(node), "--fault", fault, *args)
        nodes.append(node)
    yield add
    for node in sorted(set(nodes)):
        sim("fault", "--node", str(node), "--fault", "clear")


def hccl_timeout(tmp_path, seconds=5):
    """HCCL_CONNECT_TIMEOUT short enough that the ranks give up inside the deploy's settle phase (CANN's default
    is 120 s)."""
    inv = tmp_path / "hccl.yml"
    inv.write_text(json.dumps({"all": {"vars": {"npuops_env_overrides": {"HCCL_CONNECT_TIMEOUT": str(seconds)}}}}))
    return [str(inv)]


def failed_deploy(c, tmp_path, *extra, inventories=()):
    """deploy.yml through ansible-runner, as a platform runs it: -> (seconds, stdout, npuops.diagnosis)."""
    data = tmp_path / "runner"
    data.mkdir()
    t0 = time.time()
    r = ansible_runner.run(private_data_dir=str(data), project_dir=REPO, playbook="playbooks/deploy.yml",
                           inventory=[c.inventory] + list(inventories), cmdline=shlex.join(list(extra) + DOWNTIME), quiet=True, timeout=600,
                           envvars=dict((k, v) for k, v in env().items() if k in ("ANSIBLE_CONFIG", "PATH",
                                                                                  "PYTHONPATH")))
    took = time.time() - t0
    text = re.sub(r"\x1b\[[0-9;]*m", "", r.stdout.read())
    assert r.rc != 0, text[-3000:]
    stats = [e for e in r.events if e.get("event") == "playbook_on_stats"][0]["event_data"]["artifact_data"]
    diagnosis = (stats.get("npuops") or {}).get("diagnosis")
    assert diagnosis, text[-4000:]
    assert "Diagnosis (most likely first):" in text
    return took, text, diagnosis


def causes(diagnosis):
    return [(f["cause"], f["host"]) for f in diagnosis]


def running(c):
    return dict((n, c.ssh(n, "podman inspect --format '{{.State.Status}}' vllm", check=False).stdout.strip())
                for n in ("node01", "node02", "node03", "node04"))


@pytest.mark.parametrize("case", ["port_busy", "no_shm", "wrong_nic"])
def test_a_start_that_fails_on_one_node_names_the_cause_the_host_and_the_fix(cluster, faults, tmp_path, case):
    """node01's DP RPC port taken, the containers' /dev/shm at Docker's 64 MB, node04's NIC name wrong in the inventory: the
    deploy fails, names the cause on its host with the evidence and the fix within a minute of the failure, and
    nothing of the run stays up."""
    extra, inventories = [], []
    if case == "port_busy":
        faults(1, "port_busy", "--port", str(RPC_PORT))
        expected = ("port_in_use", "node01", "Address already in use", "ss -ltnp")
    elif case == "no_shm":
        # the container gets its own /dev/shm (--shm-size): Docker's default 64 MB on every node; the engine with
        # the most local workers that reaches the shared-memory broadcast first fails
        extra = ["-e", "npuops_serve_shm_size=64m"]
        expected = ("shm_too_small", None, "No available shared memory broadcast block", "npuops_serve_shm_size")
    else:
        wrong_nic = tmp_path / "nic.yml"
        wrong_nic.write_text(json.dumps({"all": {"hosts": {"node04": {"npuops_nic": "enp189s0f9"}}}}))
        inventories = [str(wrong_nic)]
        expected = ("nic_or_ip_wrong", "node04", "Unable to find interface for: [enp189s0f9]", "npuops_nic")
    took, out, diagnosis = failed_deploy(cluster, tmp_path, *extra, inventories=inventories)
    cause, host, evidence, fix = expected
    host = host or diagnosis[0]["host"]  # a small /dev/shm is on every node: whichever failed first
    assert causes(diagnosis)[0] == (cause, host), (causes(diagnosis), out[-4000:])
    assert evidence in diagnosis[0]["evidence"] and fix in diagnosis[0]["fix"], diagnosis[0]
    assert re.search(r"1\. %s - first on %s at \d{4}-" % (cause, host), out), out[-4000:]
    assert took < 90, took  # the engines start, one fails at once, the diagnosis, the stop
    assert all(state != "running" for state in running(cluster).values()), running(cluster)


@pytest.mark.parametrize("fault, args, cause, fix", [
    ("link_down", ("--device", "3"), "hccl_connect_timeout", r"^node02: device NIC link down on NPU 3"),
    ("tls_mismatch", ("--device", "5"), "tls_mismatch", r"node02 tls 0,0,0,0,0,1,0"),
])
def test_an_hccl_timeout_is_told_apart_by_the_nodes_facts(cluster, faults, tmp_path, fault, args, cause, fix):
    """Every rank prints the same EI0006 when the group cannot build its communicator; the devices' link and TLS
    switch, read by diagnose on every node, say which node and why."""
    faults(2, fault, *args)
    _took, out, diagnosis = failed_deploy(cluster, tmp_path, inventories=hccl_timeout(tmp_path))
    assert diagnosis[0]["cause"] == cause, (causes(diagnosis), out[-4000:])
    assert "EI0006" in diagnosis[0]["evidence"] or "communication link" in diagnosis[0]["evidence"]
    assert re.search(fix, diagnosis[0]["fix"]), diagnosis[0]
    # the same timeout on more than one node: the facts, not which nodes logged it, name node02 (on a loaded
    # machine the deploy may stop the group before every rank - node02's own included - has printed its EI0006)
    assert len(diagnosis[0]["hosts"]) >= 2, diagnosis[0]
    assert diagnosis[0]["host"] == "node02" and re.search(r"1\. %s - on node02 by its devices' facts" % cause, out), \
        out[out.find("Diagnosis"):][:3000]


def test_the_headline_names_the_node_whose_device_link_is_down_not_the_first_that_waited(cluster, faults, tmp_path):
    """issue 38: with node03's NPU 3 link down the other nodes' ranks print EI0006 first; the first finding - its host
    and the headline the deploy prints - names node03, with the device and the fix."""
    faults(3, "link_down", "--device", "3")
    _took, out, diagnosis = failed_deploy(cluster, tmp_path, inventories=hccl_timeout(tmp_path))
    top = diagnosis[0]
    assert (top["cause"], top["host"]) == ("hccl_connect_timeout", "node03"), (causes(diagnosis), out[-4000:])
    assert top["fix"].startswith("node03: device NIC link down on NPU 3 (hccn_tool -i 3 -link -g)"), top
    assert re.search(r"1\. hccl_connect_timeout - on node03 by its devices' facts", out), \
        out[out.find("Diagnosis"):][:3000]


@pytest.mark.parametrize("node, peer", [(1, 3), (2, 3)])
def test_the_fabric_cut_between_two_nodes_is_an_hccl_connect_timeout(cluster, faults, tmp_path, node, peer):
    """Cut between the leader and a worker, or between two workers (EP's all-to-all reaches every pair of nodes)."""
    faults(node, "fabric_cut", "--peer", str(peer))
    _took, out, diagnosis = failed_deploy(cluster, tmp_path, inventories=hccl_timeout(tmp_path))
    assert diagnosis[0]["cause"] == "hccl_connect_timeout", (causes(diagnosis), out[-4000:])
    assert "HCCL_CONNECT_TIMEOUT" in diagnosis[0]["fix"]


def test_a_missing_hccn_conf_fails_the_deploy_and_diagnose_names_it(cluster, faults, tmp_path):
    """Without /etc/hccn.conf node02's engine starts and answers garbage (vllm-ascend issues 7711, 4866): /health
    says up, the deploy's known question does not. The deploy fails and names the file on node02 from HCCL's
    warning in its log; diagnose.yml, run afterwards on the stopped containers, says the same."""
    faults(2, "hccn_conf_missing")
    took, out, diagnosis = failed_deploy(cluster, tmp_path)
    assert "the engines answering right" in out and "wrong answer" in out, out[-4000:]
    assert causes(diagnosis)[0] == ("hccn_conf_missing", "node02"), (causes(diagnosis), out[-4000:])
    assert "'device ip' is not set correctly" in diagnosis[0]["evidence"]
    assert "mount /etc/hccn.conf read-only" in diagnosis[0]["fix"]
    assert took < 120, took
    assert all(state != "running" for state in running(cluster).values()), running(cluster)
    later = run([BIN + "/ansible-playbook", "-i", cluster.inventory, "playbooks/diagnose.yml"], timeout=300).stdout
    assert re.search(r"1\. hccn_conf_missing - first on node02 ", later), later[-3000:]


def test_diagnose_on_a_live_service_names_a_device_link_down_its_host_and_the_fix(cluster, faults):
    """issue 38: a service that runs, its logs quiet, and node03's NPU 3 loses its link - diagnose.yml reads the
    links (hccn_tool) and names the host, the device and the fix (before: "no error line in the logs")."""
    run([BIN + "/ansible-playbook", "-i", cluster.inventory] + DOWNTIME + ["playbooks/deploy.yml"], timeout=900)
    assert all(state == "running" for state in running(cluster).values()), running(cluster)
    faults(3, "link_down", "--device", "3")
    out = run([BIN + "/ansible-playbook", "-i", cluster.inventory, "playbooks/diagnose.yml"], timeout=300).stdout
    diagnosis = out[out.find("Diagnosis (most likely first)"):][:3000]
    assert re.search(r"1\. device_link_down - on node03 by its devices' facts at \d{4}-", out), diagnosis
    assert "fix: node03: device NIC link down on NPU 3 (hccn_tool -i 3 -link -g)" in out, diagnosis
    assert "no error line" not in diagnosis, diagnosis
