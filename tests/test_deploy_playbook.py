"""playbooks/deploy.yml on a 4-node simulated cluster: what changes restarts, check mode shows it first, what is
wrong fails fast, named, and leaves nothing of the run behind."""
import ipaddress
import json
import re
import shlex
import subprocess
import time

import pytest

from npuops_sim.testing import BIN, REPO, TEST_ENV, bring_up, env, run, sim

pytestmark = pytest.mark.sim
# an address on the test cluster's own management network that no node has
WRONG_LEADER = str(ipaddress.ip_network(TEST_ENV["SIM_MGMT_NET"]).network_address + 99)
NODES = ("node01", "node02", "node03", "node04")
DOWNTIME = ["-e", '{"npuops_rollout_allow_downtime": true}']
# the preset change the second test makes, which later tests keep
CHANGE = ["-e", '{"npuops_model_overrides": {"weights_bytes": 4000000000, "max_num_seqs": 8}}']


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = bring_up(tmp_path_factory, 4)
    sim("weights", "--node", "1", "--size", "64M", "--files", "2")
    run([BIN + "/ansible-playbook", "-i", c.inventory, "playbooks/weights.yml"], timeout=600)
    yield c
    sim("down", timeout=300)


def deploy(c, *extra, check=True, timeout=600):
    return run([BIN + "/ansible-playbook", "-i", c.inventory] + list(extra) + ["playbooks/deploy.yml"], check=check,
               timeout=timeout)


def started(c):
    return c.started(NODES)


def overrides(tmp_path, host, values):
    path = tmp_path / "override.yml"
    path.write_text(json.dumps({"all": {"hosts": {host: values}}}))
    return ["-i", str(path)]


def recap(out):
    return dict(re.findall(r"^(node\d\d)\s+: ok=\d+\s+changed=(\d+)", out, re.M))


def test_a_preset_change_restarts_the_engines_once_and_nothing_else(cluster):
    deploy(cluster)
    before = started(cluster)
    change = CHANGE
    refused = deploy(cluster, *change, check=False)
    assert refused.returncode != 0 and "the update interrupts service" in refused.stdout
    assert started(cluster) == before  # refused before anything was touched
    changed = deploy(cluster, *(change + DOWNTIME))
    after = started(cluster)
    assert all(after[n] != before[n] and " running " in after[n] for n in after)
    assert "--max-num-seqs 8" in cluster.ssh("node03", "podman inspect vllm --format '{{.Config.Cmd}}'").stdout \
        .replace("[", "").replace("]", "")
    assert "node01 (recreate): --max-num-seqs: 16 -> 8" in changed.stdout
    settled = deploy(cluster, *change)
    assert recap(settled.stdout) == dict((n, "0") for n in NODES) and started(cluster) == after


def test_check_mode_on_a_live_cluster_names_the_flag_on_exactly_the_affected_hosts(cluster, tmp_path):
    before = started(cluster)
    out = deploy(cluster, "--check", "--diff", *(CHANGE + overrides(tmp_path, "node03", {"npuops_env_overrides": {
        "HCCL_BUFFSIZE": 2048}})))
    assert "node03 (recreate): env HCCL_BUFFSIZE: 1024 -> 2048" in out.stdout, out.stdout[-6000:]
    for node in ("node01", "node02", "node04"):
        assert "%s (restart with its group main/main)" % node in out.stdout
        assert "%s (recreate)" % node not in out.stdout
    assert re.search(r'-\s+"?HCCL_BUFFSIZE"?: .?1024', out.stdout) and re.search(r'\+\s+"?HCCL_BUFFSIZE"?: .?2048',
                                                                                 out.stdout)
    assert started(cluster) == before  # check mode changed nothing


def test_a_duplicate_rank_fails_fast_naming_the_host_and_stops_everything(cluster, tmp_path):
    t0 = time.time()
    out = deploy(cluster, *(overrides(tmp_path, "node03", {"npuops_vllm_overrides": {"data_parallel_start_rank": 1}})
                            + CHANGE + DOWNTIME), check=False)
    assert out.returncode != 0 and time.time() - t0 < 120
    assert "the engines this run started that had not come up were stopped:" in out.stdout
    assert re.search(r"node0[23]: vllm: container vllm exited with code 1", out.stdout)
    assert "DP rank 1 is already taken" in out.stdout
    assert all(" running " not in s for s in started(cluster).values())


def test_check_mode_after_a_failed_deploy_shows_what_it_would_start_and_waits_for_nothing(cluster):
    """The previous test left every engine stopped: check mode must show the restart, not fail on the waits."""
    t0 = time.time()
    out = deploy(cluster, "--check", "--diff", *CHANGE)
    assert time.time() - t0 < 120
    assert "node01 (start)" in out.stdout or "node01 (recreate)" in out.stdout, out.stdout[-3000:]
    assert "check mode: not waiting" in out.stdout and "The deployment failed" not in out.stdout
    assert all(" running " not in s for s in started(cluster).values())


def test_a_wrong_leader_address_fails_fast_naming_the_host(cluster, tmp_path):
    t0 = time.time()
    out = deploy(cluster, *(overrides(tmp_path, "node04", {"npuops_vllm_overrides": {
        "data_parallel_address": WRONG_LEADER}}) + CHANGE), check=False)
    assert out.returncode != 0 and time.time() - t0 < 120
    assert re.search(r"node04: vllm: container vllm cannot reach %s:13345" % re.escape(WRONG_LEADER), out.stdout)
    assert all(" running " not in s for s in started(cluster).values())
    fixed = deploy(cluster, *CHANGE)  # and the right inventory brings it all back (nothing serves: no downtime asked)
    assert "4node_dp is serving kimi-k3" in fixed.stdout


def test_a_worker_killed_while_the_leader_waits_ends_every_wait_within_60s(cluster, tmp_path):
    """The engines load for 10 minutes (the ready timeout is 5); node03's engine is killed 20 s into the wait and node01's frozen, so
    only the others' news can end node01's wait: the play must fail naming node03 within 60 s of the kill,
    and no engine of this run may be left running."""
    inv = tmp_path / "slow.yml"
    inv.write_text(json.dumps({"all": {"vars": {"npuops_env_overrides": {"NPUOPS_SIM_LOAD_SECONDS": "600"}}}}))
    slow = ["-i", str(inv)]
    before = started(cluster)
    proc = subprocess.Popen([BIN + "/ansible-playbook", "-i", cluster.inventory] + slow + CHANGE + DOWNTIME +
                            ["playbooks/deploy.yml"], cwd=REPO, env=env(), stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 180
        while time.time() < deadline:  # wait until the restarted engines are loading
            now = started(cluster)
            if all(now[n] != before[n] and " running " in now[n] for n in NODES):
                break
            time.sleep(2)
        else:
            pytest.fail("the engines were not restarted within 180 s")
        time.sleep(20)  # past the settle phase: every host is in the long ready wait
        sim("fault", "--node", "1", "--fault", "engine_hang")  # the leader can tell nothing itself now
        cluster.ssh("node03", "podman kill vllm")
        killed = time.time()
        out, _err = proc.communicate(timeout=120)
        took = time.time() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
        sim("fault", "--node", "1", "--fault", "clear")
    assert proc.returncode != 0 and took < 60, (took, out[-3000:])
    assert "The deployment failed (the engines coming up) on 1 host(s); " in out, out[-3000:]
    assert re.search(r"node03: vllm: container vllm exited with code", out), out[-3000:]
    assert "stopped waiting for vllm: node03 failed" in out
    # before the engines stop, diagnose reads every node: the rank that went first is node03's, killed
    assert re.search(r"1\. other - first on node03 at .*\n.*evidence: .*container vllm exited with exit code\s+137", out), \
        out[out.find("Diagnosis"):][:3000]
    assert all(" running " not in s for s in started(cluster).values()), started(cluster)


def test_a_host_down_at_the_start_is_named_at_once_and_nothing_changes(cluster):
    before = started(cluster)
    sim("fault", "--node", "3", "--fault", "node_down")
    try:
        t0 = time.time()
        out = deploy(cluster, *(CHANGE + DOWNTIME + ["-e", '{"npuops_model_overrides": {"weights_bytes": 4000000000, '
                                                          '"max_num_seqs": 4}}']), check=False)
        took = time.time() - t0
    finally:
        sim("fault", "--node", "3", "--fault", "clear")
    assert out.returncode != 0 and took < 90, (took, out.stdout[-3000:])
    assert re.search(r"1 host\(s\) do not answer over SSH: node03: ", out.stdout), out.stdout[-3000:]
    assert "Nothing was changed" in out.stdout
    assert started(cluster) == before


def test_plan_playbook_shows_what_runs_without_touching_nodes(cluster, tmp_path):
    out = tmp_path / "plan.json"
    run([BIN + "/ansible-playbook", "-i", cluster.inventory, "playbooks/plan.yml", "-e", "plan_output=%s" % out]
        + CHANGE)
    plan = json.loads(out.read_text())
    argv = cluster.ssh("node02", "podman inspect vllm --format '{{json .Config.Cmd}}'").stdout
    assert json.loads(argv) == plan["hosts"]["node02"]["container"]["argv"]


def test_a_host_the_inventory_lost_since_the_last_deployment_is_named(cluster):
    """The first serving node keeps the deployment's record: node07 was in it, the inventory no longer has it."""
    record = json.loads(cluster.ssh("node01", "cat /etc/npuops-deployment.json").stdout)
    assert record["hosts"] == dict((n, "main") for n in NODES)  # written by the earlier deploys of this module
    record["hosts"]["node07"] = "main"
    cluster.ssh("node01", "echo %s > /etc/npuops-deployment.json" % shlex.quote(json.dumps(record)))
    out = deploy(cluster, *CHANGE)
    said = " ".join(out.stdout.split())  # the YAML callback wraps long lines
    assert "node07 ran an engine of instance main in the last deployment and is no longer in the inventory" \
        in said, out.stdout[-3000:]
    assert json.loads(cluster.ssh("node01", "cat /etc/npuops-deployment.json").stdout)["hosts"] == dict(
        (n, "main") for n in NODES)


def test_a_foreign_container_named_vllm_is_refused_by_deploy_and_stop_and_keeps_running(cluster):
    """An operator's own container named vllm on node02 (no npuops label): deploy.yml, which runs no preflight,
    refuses naming node02 and the container, and so does stop.yml; the container runs on untouched."""
    cluster.ssh("node02", "podman rm -f vllm >/dev/null; podman run -d --name vllm --network host "
                          "localhost/npuops-sim/vllm-ascend:main-a3 sleep 600")
    foreign = cluster.started(["node02"])["node02"]
    try:
        for name, extra in (("deploy", CHANGE + DOWNTIME), ("stop", [])):
            out = run([BIN + "/ansible-playbook", "-i", cluster.inventory] + extra + ["playbooks/%s.yml" % name],
                      check=False, timeout=600)
            said = " ".join(out.stdout.split())  # the YAML callback wraps long lines
            assert out.returncode != 0, out.stdout[-3000:]
            assert re.search(r"\[node02\].*a container named vllm that npuops did not make is here \(image "
                             r"localhost/npuops-sim/vllm-ascend:main-a3, running\)", said), out.stdout[-3000:]
            assert cluster.started(["node02"])["node02"] == foreign and " running " in foreign
    finally:
        cluster.ssh("node02", "podman rm -f vllm", check=False)


def test_a_1m_context_on_four_nodes_is_refused_naming_the_rule_before_any_engine_changes(cluster):
    """The vLLM-Ascend Kimi-K3 page: "Serving a 1M-token context requires at least eight Atlas 800 A3 (64G x 16)
    nodes": the plan refuses it on this four-node cluster, and what runs keeps running."""
    before = started(cluster)
    out = deploy(cluster, "-e", '{"npuops_model_overrides": {"max_model_len": 1048576}}', check=False)
    text = " ".join(out.stdout.split())
    assert out.returncode != 0 and "The tier cannot serve the model as planned:" in text, out.stdout[-3000:]
    assert re.search(r"tier 4node_dp, group main \(TP16 x PP1 x DP4\): the KV cache holds \d+ tokens on 64 dies, less "
                     r"than one sequence of max_model_len 1048576", text)
    assert "requires at least eight Atlas 800 A3 (64G x 16) nodes (tier 8node_dp" in text
    assert started(cluster) == before
