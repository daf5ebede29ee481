"""Replicas behind the gateway: two 2-node instances (what the gateway does is the same for every tier) and a gateway
pair (real HAProxy and keepalived from
the OS packages, on the two gateway nodes): site.yml brings up both instances and the gateway; failover when
instance a's leader freezes or dies; status names the down instance and recover brings back only it; the floating
address moves when the active gateway dies; canary and tenant routing; rolling updates under load lose no request.
One cluster for the module; the tests run in file order."""
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from npuops_sim.testing import BIN, REPO, bring_up, env, playbook, run, sim
from service_clients import MODEL, Clients, Load, admin_rows, complete, runner, vip_holder

pytestmark = pytest.mark.sim

# another tag of the same line (the field report image's openEuler variant): a rollout restarts every engine
OTHER_IMAGE = "localhost/npuops-sim/vllm-ascend:kimi-k3.1-pro-a3-openeuler"
# what the interrupted-rollout test rolls out: the tests after it run with the inventory as rolled (-e ROLLED)
ROLLED = {"npuops_image": OTHER_IMAGE, "npuops_vllm_overrides": {"max_num_seqs": 4}, "npuops_serve_settle_seconds": 3}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = bring_up(tmp_path_factory, 4, "a3", "--replicas", "2")
    sim("weights", "--node", "1", "--size", "64M", "--files", "2")
    # preflight has its own tests; skipping it here keeps this module inside its time budget
    c.site = runner(c, tmp_path_factory.mktemp("site"), "site", "--skip-tags bench,preflight")
    c.vip = c.state["nodes"]["gw01"]["mgmt_ip"].rsplit(".", 1)[0] + ".250"
    c.url = "http://%s:8000" % c.vip
    yield c
    sim("down", timeout=300)


def gateway_mode(c, tmp_path, **extra):
    """Re-render the gateway alone (the gateway hosts in the play: they act on themselves)."""
    f = tmp_path / "gateway-vars.json"
    f.write_text(json.dumps(extra))
    os.chmod(f, 0o600)  # tenant keys are secrets: a file, never the command line
    return playbook(c, "gateway", "-l", "gateway", "-e", "@%s" % f, timeout=300)


def test_site_brings_up_both_instances_and_the_gateway_pair_and_validates_through_it(cluster):
    rc, out, stats = cluster.site
    assert rc == 0, out[-4000:]
    assert "2node_pp serves kimi-k3 at http://%s:8000" % cluster.vip in out
    assert stats["npuops"]["validate"]["ok"] is True
    assert vip_holder(cluster) == "gw01"
    for node in ("node01", "node03"):
        assert cluster.ssh(node, "podman inspect -f '{{.State.Running}}' vllm").stdout.strip() == "true"
    # active_standby: instance a serves
    assert {complete(cluster.url) for _ in range(6)} == {(200, "a-1")}


def test_a_gateway_host_down_at_the_start_is_named_at_reach_and_no_engine_starts(cluster):
    """The plays run over every host of the plan: a gateway host that does not answer is found before anything
    changes (not after the engines reloaded), although the change would restart every engine."""
    before = cluster.started(("node01", "node02", "node03", "node04"))
    sim("fault", "--node", "gw02", "--fault", "node_down")
    try:
        out = run([BIN + "/ansible-playbook", "-i", cluster.inventory, "-e", json.dumps(
            {"npuops_vllm_overrides": {"max_num_seqs": 4}, "npuops_rollout_allow_downtime": True}),
            "--skip-tags", "bench,preflight", "playbooks/site.yml"], check=False, timeout=600)
    finally:
        sim("fault", "--node", "gw02", "--fault", "clear")
    assert out.returncode != 0
    assert re.search(r"1 host\(s\) do not answer over SSH: gw02: ", out.stdout), out.stdout[-3000:]
    assert "Nothing was changed" in out.stdout
    assert cluster.started(before) == before


LONG_PROMPT = " ".join("word%d" % (i % 97) for i in range(3000))


def long_completion(url, tokens=8, timeout=60.0):
    """One completion with a long prompt and `tokens` tokens out: -> (status, server); status None when the connection
    failed."""
    req = urllib.request.Request(url + "/v1/completions", method="POST", data=json.dumps(
        {"model": MODEL, "prompt": LONG_PROMPT, "max_tokens": tokens, "ignore_eos": True}).encode(),
        headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status, r.headers.get("X-Npuops-Server")
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("X-Npuops-Server")
    except OSError:
        return None, None


def test_the_stats_endpoint_is_the_floating_address_with_one_entry_per_instance(cluster):
    stats = cluster.site[2]["npuops"]
    assert stats["endpoint"] == "http://%s:8000" % cluster.vip
    assert sorted(stats["instances"]) == ["a", "b"]
    assert stats["instances"]["b"] == {"endpoint": "http://%s:8000" % cluster.ip("node03"),
                                       "hosts": ["node03", "node04"], "model": {
                                           "served_model_name": "kimi-k3", "preset": "kimi_k3_w4a8",
                                           "model_dir": "/srv/models/kimi-k3-w4a8",
                                           "recipe": "gpuworks_kimi_k3_1_pro_2node_a3", "draft": None,
                                           "num_speculative_tokens": None}}


def test_admin_socket_and_stats_are_local_only(cluster):
    out = cluster.api.nsenter("gw01", ["ss", "-Hltnx"]).stdout
    assert re.search(r"127\.0\.0\.1:8404\b", out) and not re.search(r"0\.0\.0\.0:8404\b", out)
    assert "/run/haproxy/admin.sock" in out
    mode = cluster.api.nsenter("gw01", ["stat", "-c", "%a", "/run/haproxy/admin.sock"]).stdout.strip()
    assert mode == "600"


def test_a_frozen_leader_of_a_fails_over_to_b_within_10s(cluster):
    fault = "engine_hang"  # SIGSTOP: nothing answers, connections hang (a wedged engine fails the same check)
    with Load(cluster.url) as load:
        time.sleep(2)
        t_fault = time.monotonic()
        sim("fault", "--node", "1", "--fault", fault)
        try:
            time.sleep(11)
        finally:
            sim("fault", "--node", "1", "--fault", "clear")
        time.sleep(1)
    print("%s: failed=%d gap=%.1fs" % (fault, load.failed, load.gap()))
    assert load.gap() <= 10.0, (load.gap(), load.failed)
    assert "b-1" in load.servers_after(t_fault + 10)
    deadline = time.monotonic() + 15
    while complete(cluster.url)[1] != "a-1" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert complete(cluster.url)[1] == "a-1"  # back on a once it answers again


def test_the_active_gateway_dies_and_the_address_moves_within_5s(cluster):
    assert vip_holder(cluster) == "gw01"
    # requests in flight to the dead gateway never end: 1 s bounds them, so the gap is the address's move
    with Load(cluster.url, timeout=1.0) as load:
        time.sleep(2)
        sim("fault", "--node", "gw01", "--fault", "node_down")
        try:
            t0 = time.monotonic()
            while vip_holder(cluster) != "gw02" and time.monotonic() - t0 < 10:
                time.sleep(0.1)
            moved = time.monotonic() - t0
            time.sleep(4)
        finally:
            sim("fault", "--node", "gw01", "--fault", "clear")
    print("gateway: moved in %.1fs, failed=%d gap=%.1fs" % (moved, load.failed, load.gap()))
    assert moved <= 5.0 and load.gap() <= 5.0, (moved, load.gap())
    deadline = time.monotonic() + 15
    while vip_holder(cluster) != "gw01" and time.monotonic() < deadline:  # the higher priority takes it back
        time.sleep(0.2)
    assert complete(cluster.url)[0] == 200


def test_a_killed_leader_of_a_fails_over_to_b_and_rollouts_lose_no_request(cluster):
    # a's leader dies: b serves within 10 s
    with Load(cluster.url) as load:
        time.sleep(2)
        t_kill = time.monotonic()
        cluster.ssh("node01", "podman kill vllm")
        time.sleep(8)
    print("kill: failed=%d gap=%.1fs" % (load.failed, load.gap()))
    assert load.gap() <= 10.0 and "b-1" in load.servers_after(t_kill + 5), load.gap()
    # the image tag and one vLLM flag, rolled out under load: a (down) first, then b; no request fails
    for extra in ({"npuops_image": OTHER_IMAGE, "npuops_vllm_overrides": {"max_num_seqs": 8}},):
        with Load(cluster.url) as load:
            # the simulated engines start in seconds: 3 s of settling is plenty here (the default is 10)
            proc = run([BIN + "/ansible-playbook", "-i", cluster.inventory, "-e", json.dumps(
                dict(extra, npuops_serve_settle_seconds=3)), "playbooks/rollout.yml"], timeout=600)
        print("rollout %s: requests=%d failed=%d" % (sorted(extra), len(load.results), load.failed))
        assert load.failed == 0, [r for r in load.results if r[2] != 200][:5]
        assert "the in-flight requests finish - instance a" in proc.stdout
        assert "the in-flight requests finish - instance b" in proc.stdout
        for node in ("node01", "node03"):
            image = cluster.ssh(node, "podman inspect -f '{{.Config.Image}}' vllm").stdout.strip()
            assert image == OTHER_IMAGE
        argv = json.loads(cluster.ssh("node03", "podman inspect -f '{{json .Config.Cmd}}' vllm").stdout)
        seqs = argv[argv.index("--max-num-seqs") + 1] if "--max-num-seqs" in argv else None
        assert (seqs == "8") == ("npuops_vllm_overrides" in extra), argv
    stat = cluster.api.nsenter("gw01", ["python3", "-c", "import socket;s=socket.socket(socket.AF_UNIX);"
                                        "s.connect('/run/haproxy/admin.sock');s.sendall(b'show stat\\n');"
                                        "import sys;sys.stdout.write(s.makefile().read())"]).stdout
    rows = [r.split(",") for r in stat.splitlines() if r.startswith("be_service,")]
    assert {(r[1], r[17]) for r in rows if r[1] != "BACKEND"} == {("a-1", "UP"), ("b-1", "UP")}


def test_an_interrupted_rollout_is_named_by_status_and_finished_by_the_next_run_without_a_failed_request(
        cluster, tmp_path):
    change = ROLLED
    log = open(str(tmp_path / "rollout.log"), "w")
    play = subprocess.Popen([BIN + "/ansible-playbook", "-i", cluster.inventory, "-e", json.dumps(change),
                             "playbooks/rollout.yml"], cwd=REPO, env=env(), stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        # Ctrl-C as soon as a leaves rotation (DRAIN, then DOWN while its engine restarts): seconds before its put-back.
        # Waiting for DRAIN itself could see it only after the restart, just before the put-back (CI of stop 34).
        deadline = time.monotonic() + 300
        while admin_rows(cluster, "gw01").get("a-1") == "UP" and time.monotonic() < deadline:
            assert play.poll() is None, open(str(tmp_path / "rollout.log")).read()[-3000:]
            time.sleep(0.2)
        assert admin_rows(cluster, "gw01").get("a-1") != "UP"
        for _ in range(3):  # the operator's Ctrl-C, again if the play goes on: ansible-core can lose one
            os.killpg(play.pid, signal.SIGINT)  # ("Exception ignored in: <function _releaseLock ...>")
            try:
                play.wait(3)
                break
            except subprocess.TimeoutExpired:
                pass
        play.wait(60)
    finally:
        if play.poll() is None:
            os.killpg(play.pid, signal.SIGKILL)
    interrupted = open(str(tmp_path / "rollout.log")).read()
    assert "Put back into rotation once its health check passes - instance a" not in interrupted, interrupted[-3000:]
    # the engine start the play had sent finishes on the node: a comes back up, still drained
    deadline = time.monotonic() + 60
    while admin_rows(cluster, "gw01")["a-1"] not in ("DRAIN", "MAINT") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert admin_rows(cluster, "gw01")["a-1"] in ("DRAIN", "MAINT")
    rc, out, stats = runner(cluster, tmp_path, "status")
    assert rc != 0 and "instance a is out of rotation (gw01 DRAIN" in stats["npuops_status"]["gateway"]["reason"], \
        out[-3000:]
    with Load(cluster.url) as load:
        proc = run([BIN + "/ansible-playbook", "-i", cluster.inventory, "-e", json.dumps(change),
                    "playbooks/rollout.yml"], timeout=600)
    print("rollout after an interrupted one: requests=%d failed=%d" % (len(load.results), load.failed))
    assert load.failed == 0, [r for r in load.results if r[2] != 200][:5]
    # a was drained before its restart: it is restarted (its drain is already done) and put back, then b is rolled
    assert proc.stdout.index("the in-flight requests finish - instance a") < proc.stdout.index(
        "the in-flight requests finish - instance b")
    for gw in ("gw01", "gw02"):
        assert admin_rows(cluster, gw) == {"a-1": "UP", "b-1": "UP"}


def test_status_names_a_down_instance_and_a_dead_gateway_and_recover_brings_back_exactly_those(cluster, tmp_path):
    """a's leader dies (its headless worker exits with it), then HAProxy on both gateway hosts: status names both,
    with b healthy; one recover restarts a and the gateway, and leaves b untouched. The inventory is the one the
    rollout before this test deployed (-e ROLLED): recover restarts what is down, not what an older inventory says."""
    rolled = tmp_path / "rolled.json"
    rolled.write_text(json.dumps(ROLLED))
    rolled_vars = "-e @%s" % rolled
    b_started = cluster.started(("node03", "node04"))
    assert all(" running " in s for s in b_started.values()), b_started
    cluster.ssh("node01", "podman kill vllm")
    deadline = time.monotonic() + 15
    while complete(cluster.url)[1] != "b-1" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert complete(cluster.url)[1] == "b-1"  # meanwhile the gateway serves from b
    for gw in ("gw01", "gw02"):
        master = cluster.api.nsenter(gw, ["cat", "/run/haproxy.pid"]).stdout.split()[0]
        workers = cluster.api.nsenter(gw, ["pgrep", "-P", master], check=False).stdout.split()
        cluster.api.nsenter(gw, ["kill", "-9", master] + workers)
    deadline = time.monotonic() + 10
    while complete(cluster.url, timeout=1.0)[0] is not None and time.monotonic() < deadline:
        time.sleep(0.3)
    assert complete(cluster.url, timeout=1.0)[0] is None  # the floating address is dead

    rc, out, stats = runner(cluster, tmp_path, "status", rolled_vars)
    status = stats["npuops_status"]
    assert rc != 0 and status["healthy"] is False and status["state"] == "down", out[-3000:]
    assert status["instances"]["a"]["state"] in ("down", "degraded"), status["instances"]["a"]
    assert "node01" in status["instances"]["a"]["reason"], status["instances"]["a"]
    assert status["instances"]["b"]["state"] == "healthy", status["instances"]["b"]
    assert "gw01: HAProxy is not running" in status["gateway"]["reason"], status["gateway"]
    assert "gw02: HAProxy is not running" in status["gateway"]["reason"], status["gateway"]

    rc, out, _stats = runner(cluster, tmp_path, "recover", rolled_vars)
    assert rc == 0 and re.search(r"Recovered a/\S+, the gateway on gw01, gw02 in [\d.]+s; the service is healthy",
                                 " ".join(out.split())), out[-3000:]
    assert cluster.started(b_started) == b_started  # b was not touched
    rc, out, stats = runner(cluster, tmp_path, "status", rolled_vars)
    assert rc == 0 and stats["npuops_status"]["healthy"] is True, out[-3000:]
    deadline = time.monotonic() + 15
    while complete(cluster.url)[1] != "a-1" and time.monotonic() < deadline:  # a back in rotation (rise 2 x 1 s)
        time.sleep(0.5)
    assert complete(cluster.url)[1] == "a-1"


def test_canary_weights_split_within_a_binomial_bound(cluster, tmp_path):
    gateway_mode(cluster, tmp_path, npuops_gateway_mode="canary", npuops_gateway_weights={"a": 10, "b": 90})
    time.sleep(3)  # both servers through their first health checks (rise 2 x 1 s)
    served = [complete(cluster.url)[1] for _ in range(200)]
    a = served.count("a-1")
    # n=200, p=0.1: mean 20, sd 4.24; 4.5 sd either side
    assert served.count(None) == 0 and a + served.count("b-1") == 200
    assert 1 <= a <= 39, a


def haproxy_weights(c):
    """{server: weight} of the service's backend as the running HAProxy has it (the active gateway host's stats)."""
    holder = vip_holder(c) or "gw01"
    code = ("import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8404/stats;csv', timeout=5)"
            ".read().decode())")
    lines = [line for line in c.api.nsenter(holder, ["/usr/bin/python3", "-c", code]).stdout.splitlines() if line]
    header = lines[0].lstrip("# ").split(",")
    rows = [dict(zip(header, line.split(","))) for line in lines[1:]]
    return dict((r["svname"], int(r["weight"])) for r in rows if r.get("svname") in ("a-1", "b-1"))


def test_a_gateway_run_stopped_after_writing_haproxy_cfg_is_reloaded_by_the_next_run(cluster, tmp_path):
    """A run stopped between writing haproxy.cfg and the handlers' reload (Ctrl-C, a killed job: Ansible runs no
    handler after either) leaves HAProxy on the old weights and a file that already has the new ones: the next run
    finds the file as the plan says, and reloads all the same, because the checksums recorded at the last reload are
    not the file's. The run is killed: Ansible's SIGINT handler lets a run that is about to end finish now and then
    (once in the four runs of this test here), which would leave nothing to prove."""
    assert haproxy_weights(cluster) == {"a-1": 10, "b-1": 90}  # the canary test's
    f = tmp_path / "gateway-vars.json"
    f.write_text(json.dumps({"npuops_gateway_mode": "canary", "npuops_gateway_weights": {"a": 90, "b": 10}}))
    proc = subprocess.Popen([BIN + "/ansible-playbook", "-i", cluster.inventory, "-l", "gateway", "-e", "@%s" % f,
                             "playbooks/gateway.yml"], env=env(), cwd=REPO, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    guard = threading.Timer(300, lambda: os.killpg(proc.pid, signal.SIGKILL))
    guard.start()
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "Write the check keepalived runs" in line:  # haproxy.cfg is written on both hosts, nothing reloaded
                os.killpg(proc.pid, signal.SIGKILL)  # its workers (sessions of their own) end their task alone
                break
        proc.communicate(timeout=120)
    finally:
        guard.cancel()
    assert proc.returncode == -signal.SIGKILL, "".join(seen)[-3000:]
    for host in ("gw01", "gw02"):
        cfg = cluster.api.nsenter(host, ["/bin/cat", "/etc/haproxy/haproxy.cfg"]).stdout
        assert "agent-port 18710 weight 90\n" in cfg, cfg
    assert haproxy_weights(cluster) == {"a-1": 10, "b-1": 90}  # still the old configuration
    out = gateway_mode(cluster, tmp_path, npuops_gateway_mode="canary", npuops_gateway_weights={"a": 90, "b": 10})
    assert "HAProxy loaded another configuration than the one in its files: reloading" in " ".join(out.stdout.split())
    assert haproxy_weights(cluster) == {"a-1": 90, "b-1": 10}
    again = gateway_mode(cluster, tmp_path, npuops_gateway_mode="canary", npuops_gateway_weights={"a": 90, "b": 10})
    assert re.search(r"gw01\s+: ok=\d+\s+changed=0 ", again.stdout) and \
        re.search(r"gw02\s+: ok=\d+\s+changed=0 ", again.stdout), again.stdout[-2000:]


def test_tenant_mode_routes_each_key_to_its_instance_and_refuses_unknown_keys(cluster, tmp_path):
    keys = {"tenant-a-0123456789": "a", "tenant-b-9876543210": "b"}
    gateway_mode(cluster, tmp_path, npuops_gateway_mode="tenant", npuops_gateway_tenants=keys)
    time.sleep(3)
    for key, inst in keys.items():
        assert {complete(cluster.url, key) for _ in range(5)} == {(200, "%s-1" % inst)}
    assert complete(cluster.url, "tenant-x-unknown000")[0] == 401
    assert complete(cluster.url)[0] == 401
    # the keys are in a root-only map file, and in no log of the gateway hosts
    for gw in ("gw01", "gw02"):
        assert cluster.api.nsenter(gw, ["stat", "-c", "%a", "/etc/haproxy/npuops-tenants.map"]).stdout.strip() == "600"
        logs = cluster.api.nsenter(gw, ["sh", "-c", "cat /var/log/haproxy.log 2>/dev/null; true"]).stdout
        assert "tenant-a-0123456789" not in logs


def completion_model(url):
    """One small completion through `url`: -> (status, the server's name, the model the answer names)."""
    req = urllib.request.Request(url + "/v1/completions", method="POST", data=json.dumps(
        {"model": MODEL, "prompt": "hi", "max_tokens": 2}).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.headers.get("X-Npuops-Server"), json.loads(r.read())["model"]
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("X-Npuops-Server"), None
    except OSError:
        return None, None, None


V2 = "/srv/models/kimi-k3-w4a8-v2"


def operator_inventory(cluster, tmp_path, weights):
    """The operator's inventory of the canary on two weight sets: the cluster's, with instance b's own weights in
    group_vars/instance_b.yml and the canary's weights."""
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(open(cluster.inventory).read())
    (inv / "group_vars" / "all.yml").write_text(
        open(os.path.join(REPO, "inventories", "sim", "group_vars", "all.yml")).read()
        + "npuops_gateway_mode: canary\nnpuops_gateway_weights: %s\n" % json.dumps(weights))
    (inv / "group_vars" / "instance_b.yml").write_text(
        "npuops_model_dir: %s\nnpuops_model_overrides: {weights_bytes: 4000000000, served_model_name: kimi-k3-v2}\n"
        % V2)
    return type("Inventory", (), {"inventory": str(inv / "hosts.yml")})()


def test_replicas_on_different_weights_canary_answers_each_with_its_own_model_and_status_names_them(cluster, tmp_path):
    """The planning article's usage B: instance b moves to a new weight set (its own directory, its own name) while a
    keeps the stable one, behind a 10/90 canary. The weights go to b's nodes only, only b restarts (rolling, through
    the gateway), each instance answers with its own model name, and status names the model per instance."""
    sim("weights", "--node", "3", "--size", "16M", "--files", "2", "--dir", V2)
    v2 = V2
    operator = operator_inventory(cluster, tmp_path, {"a": 10, "b": 90})
    rolled = tmp_path / "rolled.json"
    rolled.write_text(json.dumps(ROLLED))  # the inventory as the earlier rollout left it
    a_started = cluster.started(["node01", "node02"])
    # the canary first (the gateway alone, as test_canary_weights... does), then the new weights on b
    playbook(operator, "gateway", "-l", "gateway", "-e", "@%s" % rolled, timeout=300)
    with Load(cluster.url) as load:
        rc, out, stats = runner(operator, tmp_path, "site", "--skip-tags bench,preflight,monitor -e @%s" % rolled)
    assert rc == 0, out[-4000:]
    assert load.failed == 0, load.results[-10:]
    outcome = stats["npuops"]
    assert outcome["deploy"]["restarted"] == ["b/main"], outcome["deploy"]
    assert cluster.started(["node01", "node02"]) == a_started  # a was not touched
    assert [(s["dir"], s["instances"], s["copied_to"]) for s in outcome["weights"]["sets"]] == [
        ("/srv/models/kimi-k3-w4a8", ["a"], []), (v2, ["b"], ["node04"])]
    assert outcome["weights"]["sets"][1]["seed"] == "node03"
    for node in ("node01", "node02"):  # a's nodes never receive b's weights
        assert cluster.ssh(node, "test -e %s && echo there || echo absent" % v2).stdout.strip() == "absent"
    assert outcome["instances"]["b"]["model"] == {"served_model_name": "kimi-k3-v2", "preset": "kimi_k3_w4a8",
                                                  "model_dir": v2, "recipe": outcome["recipe"], "draft": None,
                                                  "num_speculative_tokens": None}
    assert outcome["instances"]["a"]["model"]["served_model_name"] == "kimi-k3"

    answers = [completion_model(cluster.url) for _ in range(100)]
    assert {a[0] for a in answers} == {200}
    # the canary reaches both, and each answers with its own model's name (n=100, p=0.1: a between 1 and 24)
    assert {(server, model) for _s, server, model in answers} == {("a-1", "kimi-k3"), ("b-1", "kimi-k3-v2")}
    assert 1 <= sum(1 for a in answers if a[1] == "a-1") <= 24

    rc, out, stats = runner(operator, tmp_path, "status", "-e @%s" % rolled)
    assert rc == 0 and stats["npuops_status"]["healthy"] is True, out[-3000:]
    assert stats["npuops_status"]["instances"]["b"]["model"]["served_model_name"] == "kimi-k3-v2"
    text = " ".join(out.split())
    assert re.search(r"b: healthy \(node03, node04\) - a token in .*?; serves kimi-k3-v2 from %s" % v2, text), text[-3000:]
    assert re.search(r"a: healthy \(node01, node02\) - a token in .*?; serves kimi-k3 from /srv/models/kimi-k3-w4a8 ",
                     text), text[-3000:]


def haproxy_servers(c):
    """{server: (status, UP->DOWN transitions)} of the service's backend, from the active gateway host's stats CSV."""
    holder = vip_holder(c) or "gw01"
    code = ("import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8404/stats;csv', timeout=5)"
            ".read().decode())")
    text = c.api.nsenter(holder, ["/usr/bin/python3", "-c", code]).stdout
    lines = [line for line in text.splitlines() if line.strip()]
    header = lines[0].lstrip("# ").split(",")
    out = {}
    for line in lines[1:]:
        row = dict(zip(header, line.split(",")))
        if row.get("svname") in ("a-1", "b-1"):
            out[row["svname"]] = (row["status"], int(row.get("chkdown") or 0))
    return out


class Peak(Clients):
    """`clients` clients sending long completions (a long prompt, `tokens` tokens out) through the gateway until the
    block ends, every request bounded (a queued one waits a minute at most). The last `idle` of them pause past the
    engines' 5 s keep-alive between requests, so connections sit idle while the others keep the engines saturated."""

    def __init__(self, url, clients, tokens, idle=0):
        Clients.__init__(self, clients, lambda: long_completion(url, tokens, timeout=180),
                         lambda k: 5.2 + 0.2 * (k - clients + idle) if k >= clients - idle else 0.0, join_timeout=200)

    def failed_between(self, t0, t1):
        """Requests that started in [t0, t1) and did not answer 200."""
        return [r for r in self.results if t0 <= r[0] < t1 and r[2] != 200]


def test_at_its_peak_the_service_stays_up_busy_and_a_wedged_instance_alone_goes_out_and_is_restarted(cluster, tmp_path):
    """Load at 3 x max_num_seqs per instance and more (the rollout left max_num_seqs 4: 24 saturating clients over
    two instances, long prompts, 1000 tokens out, and 6 more whose connections sit idle past the engines' 5 s
    keep-alive between requests), NPUOPS_TEST_PEAK_SECONDS (120 in CI): no request fails (the engines listen with
    uvicorn's backlog and close idle keep-alive connections after its 5 s, as vLLM's server does; the gateway must not
    send a request down a connection the engine just closed), no server is marked down (a health check that queued
    behind the load would mark both down and cut their sessions), and status.yml exits 0 naming both instances busy
    (its token probe bounded by 3 s here, which the queue outlasts). Then instance a's engine wedges under that load
    (/health still 200): out of rotation within 10 s, status names it down, recover restarts it and leaves b alone."""
    seconds = float(os.environ.get("NPUOPS_TEST_PEAK_SECONDS", "120"))
    operator = operator_inventory(cluster, tmp_path, {"a": 50, "b": 50})
    rolled = tmp_path / "rolled.json"
    rolled.write_text(json.dumps(dict(ROLLED, npuops_status_token_timeout=3)))
    playbook(operator, "gateway", "-l", "gateway", "-e", "@%s" % rolled, timeout=300)
    before = haproxy_servers(cluster)
    assert before["a-1"][0] == "UP" and before["b-1"][0] == "UP", before
    b_started = cluster.started(["node03", "node04"])
    with Peak(cluster.url, 30, 1000, idle=6) as peak:
        start = time.monotonic()
        time.sleep(min(30.0, seconds / 2))
        rc, out, stats = runner(operator, tmp_path, "status", "-e @%s" % rolled)
        status = stats["npuops_status"]
        assert rc == 0 and status["healthy"] is True and status["state"] == "busy", out[-3000:]
        for name in ("a", "b"):
            assert status["instances"][name]["state"] == "busy", status["instances"][name]
            assert status["instances"][name]["reason"].startswith("busy: "), status["instances"][name]
        assert "service: busy" in " ".join(out.split()), out[-3000:]
        time.sleep(max(0.0, seconds - (time.monotonic() - start)))
        during = haproxy_servers(cluster)
        peak_end = time.monotonic()
        assert {s: c for s, (_st, c) in during.items()} == {s: c for s, (_st, c) in before.items()}, (before, during)
        assert [st for st, _c in during.values()] == ["UP", "UP"], during
        assert peak.failed_between(start, peak_end) == [] and len(peak.results) >= 100, (len(peak.results),
                                                                                         peak.results[-5:])

        sim("fault", "--node", "1", "--fault", "engine_wedge")
        try:
            wedged_at = time.monotonic()
            while haproxy_servers(cluster)["a-1"][0] == "UP" and time.monotonic() - wedged_at < 30:
                time.sleep(0.5)
            took = time.monotonic() - wedged_at
            assert haproxy_servers(cluster)["a-1"][0].startswith("DOWN") and took <= 10, (took,
                                                                                          haproxy_servers(cluster))
            rc, out, stats = runner(operator, tmp_path, "status", "-e @%s" % rolled)
            status = stats["npuops_status"]
            assert rc != 0 and status["instances"]["a"]["state"] == "down", out[-3000:]
            assert "no progress" in status["instances"]["a"]["reason"], status["instances"]["a"]
            assert status["instances"]["b"]["state"] in ("busy", "healthy"), status["instances"]["b"]
            # a restart cures the wedge (the simulated fault holds only the engines that ran when it came)
            rc, out, _stats = runner(operator, tmp_path, "recover", "-e @%s" % rolled)
            assert rc == 0 and re.search(r"Recovered a/\S+ in [\d.]+s", " ".join(out.split())), out[-3000:]
            assert cluster.started(["node03", "node04"]) == b_started  # b was not touched
        finally:
            sim("fault", "--node", "1", "--fault", "clear")

