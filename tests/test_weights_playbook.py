"""playbooks/weights.yml and the weight modules on the simulated cluster: real TCP between nodes."""
import hashlib
import http.client
import json
import os
import re
import signal
import subprocess
import time

import pytest

from ansible_collections.npuops.ascend.plugins.module_utils import transfer, weight_server
from npuops_sim.testing import BIN, REPO, bring_up, env, run, sim

pytestmark = pytest.mark.sim
MODEL = "/srv/models/kimi-k3-w4a8"
FILES = 8
SIZE = "512M"  # in all (8 files of 64 MB): a throttled link makes a copy long enough to break it midway


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = bring_up(tmp_path_factory, 4)
    sim("weights", "--node", "1", "--size", SIZE, "--files", str(FILES))
    yield c
    sim("down", timeout=300)


def node_file(c, node, rel):
    return c.api.root_of(node) + MODEL + "/" + rel


def digests(c, node):
    root = c.api.root_of(node) + MODEL
    out = {}
    for name in sorted(os.listdir(root)):
        if name.endswith((".safetensors", ".json")) and os.path.isfile(os.path.join(root, name)):
            with open(os.path.join(root, name), "rb") as f:
                out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def playbook(c, *extra, check=True):
    return run([BIN + "/ansible-playbook", "-i", c.inventory, "playbooks/weights.yml"] + list(extra), check=check,
               timeout=900)


def complete_everywhere(c):
    """Make sure every node holds the seed's files byte for byte, running the stage only when one does not: most
    tests end with a complete copy, and a run that moves nothing proves nothing here."""
    seed = digests(c, "node01")
    names = sorted(os.listdir(c.api.root_of("node01") + MODEL))
    for node in ("node02", "node03", "node04"):
        root = c.api.root_of(node) + MODEL
        if not os.path.exists(os.path.join(root, ".npuops", "verified.json")) or sorted(os.listdir(root)) != names \
                or digests(c, node) != seed:
            return playbook(c)
    return None


def adhoc(c, host, module, args, check=True):
    proc = run([BIN + "/ansible", host, "-i", c.inventory, "-m", module, "-a", json.dumps(args), "-o"], check=False,
               timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(proc.stdout[-3000:] + proc.stderr[-2000:])
    m = re.search(r"=> (\{.*\})\s*$", proc.stdout, re.M)
    result = json.loads(m.group(1)) if m else {}
    result["failed"] = "| FAILED" in proc.stdout
    return proc, result


def received(root):
    """Bytes a node has checked and written: whole files, plus the checked pieces of .part files (which are
    preallocated to their full size, so their size says nothing)."""
    total = 0
    piece = None
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.endswith(".safetensors"):
            total += os.path.getsize(path)
        elif name.endswith(".part.progress"):
            if piece is None:
                piece = json.load(open(os.path.join(root, ".npuops", "manifest.json")))["piece_size"]
            total += weight_server.read_progress(path[:-len(weight_server.PROGRESS_SUFFIX)])[0] * piece
    return total


def servers_running(c):
    """(node, pid, command line) of every weight server running on the nodes."""
    nodes = c.state["nodes"]
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = open("/proc/%s/cmdline" % pid, "rb").read()
                mntns = os.stat("/proc/%s/ns/mnt" % pid).st_ino
            except OSError:
                continue
            for node, info in nodes.items():
                if b"npuops_weight_server.py" in cmd and info["mntns"] == mntns:
                    out.append((node, int(pid), cmd.replace(b"\0", b" ").decode()))
    return out


def test_copy_to_every_node_is_byte_identical_and_a_rerun_moves_nothing(cluster):
    first = playbook(cluster)
    assert "Follow the copies until they end" in first.stdout
    assert re.search(r"node04: 9/9 files, [\d.]+/[\d.]+ GB, [\d.]+ MB/s, ETA - \(done\)", first.stdout), first.stdout[-3000:]
    seed = digests(cluster, "node01")
    assert len(seed) == FILES + 1
    for node in ("node02", "node03", "node04"):
        assert digests(cluster, node) == seed, node
    for node in ("node02", "node03", "node04"):  # the copy jobs' results are not left behind
        assert not os.listdir(cluster.api.root_of(node) + "/root/.ansible_async"), node
    second = playbook(cluster)
    assert re.findall(r"changed=(\d+)", second.stdout) == ["0", "0", "0", "0"]
    assert "Pull from the nodes before this one" not in second.stdout or "changed: [node0" not in second.stdout
    assert servers_running(cluster) == []


def test_files_that_are_not_part_of_the_weights_are_named_and_removed_when_asked(cluster):
    """An extra shard and a text file on a receiver pass even a full verify (they are not in the manifest): the
    stage names them, and removes them with npuops_weights_remove_stray."""
    complete_everywhere(cluster)  # start from a complete copy everywhere
    root = cluster.api.root_of("node03") + MODEL
    for name, data in (("model-00009-of-00008.safetensors", b"\0" * 4096), ("notes.txt", b"copied by hand\n")):
        with open(os.path.join(root, name), "wb") as f:
            f.write(data)
    named = playbook(cluster, "-e", '{"npuops_weights_verify": "full"}')
    # (the YAML callback doubles the apostrophe of a quoted string)
    assert "node03: model-00009-of-00008.safetensors, notes.txt (not in the seed's manifest)" in \
        named.stdout.replace("''", "'"), named.stdout[-3000:]
    assert os.path.exists(os.path.join(root, "notes.txt"))  # named, not touched
    playbook(cluster, "-e", '{"npuops_weights_remove_stray": true}')
    assert sorted(os.listdir(root)) == sorted(os.listdir(cluster.api.root_of("node01") + MODEL))
    assert digests(cluster, "node03") == digests(cluster, "node01")


def test_a_flipped_byte_at_a_destination_is_repaired_by_full_verify(cluster):
    complete_everywhere(cluster)  # start from a complete copy everywhere
    path = node_file(cluster, "node03", "model-00004-of-00008.safetensors")
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(12345)
        b = f.read(1)
        f.seek(12345)
        f.write(bytes([b[0] ^ 0x40]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert digests(cluster, "node03") != digests(cluster, "node01")
    fast = playbook(cluster)  # fast verification trusts size and mtime: nothing moves
    assert re.findall(r"changed=(\d+)", fast.stdout) == ["0", "0", "0", "0"]
    full = playbook(cluster, "-e", '{"npuops_weights_verify": "full"}')
    assert "node03: 9/9 files" in full.stdout
    assert digests(cluster, "node03") == digests(cluster, "node01")


def test_a_killed_copy_resumes_and_resends_less_than_one_file(cluster):
    victim = "node02"
    complete_everywhere(cluster)  # start from a complete copy everywhere
    root = cluster.api.root_of(victim) + MODEL
    for name in os.listdir(root):
        if name.startswith("model-"):
            os.unlink(os.path.join(root, name))
    os.unlink(os.path.join(root, ".npuops", "verified.json"))
    # slow node02's fabric so the kill lands mid-copy
    ns = cluster.state["nodes"][victim]["netns"]
    os.system("ip netns exec %s tc qdisc add dev enp61s0f0 root tbf rate 400mbit burst 256kb latency 50ms" % ns)
    play = subprocess.Popen([BIN + "/ansible-playbook", "-i", cluster.inventory, "playbooks/weights.yml"],
                            env=env(), cwd=REPO, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 120
        on_disk = 0
        while time.time() < deadline:
            on_disk = received(root)
            if on_disk > 300 * 1024 * 1024:
                break
            time.sleep(0.2)
        # kill the copy on node02: the module process inside that node, by its PID
        killed = node_pids(cluster, victim, b"weight_sync")
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        assert killed, "no weight_sync process found on node02"
        time.sleep(0.5)
        on_disk = received(root)
    finally:
        os.killpg(play.pid, signal.SIGTERM)
        play.wait(60)
        os.system("ip netns exec %s tc qdisc del dev enp61s0f0 root" % ns)
    assert 0 < on_disk < sum(os.path.getsize(node_file(cluster, "node01", n)) for n in os.listdir(
        cluster.api.root_of("node01") + MODEL) if n.startswith("model-"))
    again = playbook(cluster)
    assert digests(cluster, victim) == digests(cluster, "node01")
    assert re.search(r"node02: 9/9 files", again.stdout)
    report = json.load(open(root + "/.npuops/sync-progress.json"))
    total = report["bytes_total"]
    file_size = os.path.getsize(node_file(cluster, "node01", "model-00001-of-00008.safetensors"))
    # what was received before the kill is at least what was checked and written (on_disk) and at most that
    # plus the pieces in flight: one per file being fetched
    manifest = json.load(open(root + "/.npuops/manifest.json"))
    in_flight = 4 * manifest["piece_size"]
    resent = on_disk + in_flight + report["bytes_fetched"] - total
    assert resent < file_size, "re-sent up to %d bytes, a file is %d" % (resent, file_size)
    assert servers_running(cluster) == []


def test_a_source_changed_after_its_manifest_fails_naming_the_file_and_stops_the_servers(cluster):
    complete_everywhere(cluster)  # start from a complete copy everywhere
    rel = "model-00006-of-00008.safetensors"
    seed_path = node_file(cluster, "node01", rel)
    st = os.stat(seed_path)
    original = open(seed_path, "rb").read()
    try:
        with open(seed_path, "r+b") as f:
            f.seek(5 * 1024 * 1024 + 3)
            b = f.read(1)
            f.seek(5 * 1024 * 1024 + 3)
            f.write(bytes([b[0] ^ 1]))
        os.utime(seed_path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime: the manifest is reused
        os.unlink(node_file(cluster, "node02", rel))  # node02 pulls from the seed itself
        out = playbook(cluster, check=False)
        assert out.returncode != 0
        assert re.search(r"- node02: the weight copy failed: %s" % re.escape(rel), out.stdout), out.stdout[-3000:]
        assert "End this run's weight servers and copy jobs on every reachable host" in out.stdout
        assert servers_running(cluster) == []
        assert not os.path.exists(node_file(cluster, "node02", rel))
    finally:
        with open(seed_path, "wb") as f:
            f.write(original)
        os.utime(seed_path, ns=(st.st_atime_ns, st.st_mtime_ns))
    playbook(cluster)
    assert digests(cluster, "node02") == digests(cluster, "node01")


def http_get(host, port, path, token):
    """GET `path` as given (no normalisation), with the token if any. -> (status, body)."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": "Bearer " + token} if token else {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_the_server_refuses_wrong_tokens_and_paths_outside_the_manifest(cluster):
    complete_everywhere(cluster)  # the seed's manifest is recorded
    token = "sim-secret-token-42"
    fabric = cluster.state["nodes"]["node01"]["fabric_ip"]
    os.symlink("/etc/passwd", cluster.api.root_of("node01") + MODEL + "/passwd")
    try:
        _p, started = adhoc(cluster, "node01", "npuops.ascend.weight_serve",
                            {"path": MODEL, "bind": fabric, "port": 18191, "token": token, "idle_timeout": 60})
        assert started["changed"] and started["url"] == "http://%s:18191" % fabric
        assert http_get(fabric, 18191, "/manifest", None)[0] == 401
        assert http_get(fabric, 18191, "/manifest", "guess")[0] == 403
        assert http_get(fabric, 18191, "/manifest", token)[0] == 200
        for path in ("/files/../../etc/passwd", "/files/%2Fetc%2Fpasswd", "/files/passwd", "/files//etc/shadow"):
            code, body = http_get(fabric, 18191, path, token)
            assert code == 404 and b"root:" not in body, path
        _p, refused = adhoc(cluster, "node02", "npuops.ascend.weight_sync",
                            {"src_url": ["http://%s:18191" % fabric], "token": "guess", "dest": "/srv/other"},
                            check=False)
        assert refused.get("failed") and "refused the token (403)" in refused["msg"]
        log = open(cluster.api.root_of("node01") + "/run/npuops/weight_serve-18191.log").read()
        assert "401" in log and "403" in log and "guess" not in log and token not in log
        ps = run(["ps", "-eo", "args"]).stdout
        assert token not in ps
    finally:
        os.unlink(cluster.api.root_of("node01") + MODEL + "/passwd")
        adhoc(cluster, "node01", "npuops.ascend.weight_serve", {"path": MODEL, "port": 18191, "state": "stopped"})
    assert servers_running(cluster) == []


def test_disk_full_fails_cleanly(cluster):
    token = "sim-secret-token-43"
    fabric = cluster.state["nodes"]["node01"]["fabric_ip"]
    cluster.api.nsenter("node04", ["sh", "-c", "mkdir -p /srv/small && mount -t tmpfs -o size=200m tmpfs /srv/small"])
    try:
        adhoc(cluster, "node01", "npuops.ascend.weight_serve",
              {"path": MODEL, "bind": fabric, "port": 18192, "token": token, "idle_timeout": 60})
        _p, res = adhoc(cluster, "node04", "npuops.ascend.weight_sync",
                        {"src_url": ["http://%s:18192" % fabric], "token": token, "dest": "/srv/small/model",
                         "parallel": 4}, check=False)
        # the space is short: the copy fails before a byte moves, saying how much it needs
        assert res.get("failed") and re.search(r"needs [\d.]+ GB more for the 9 files to fetch, 0\.2 GB are free",
                                               res["msg"]), res
        left = cluster.api.nsenter("node04", ["sh", "-c", "find /srv/small -name '*.part*' | wc -l"]).stdout.strip()
        assert left == "0"
    finally:
        adhoc(cluster, "node01", "npuops.ascend.weight_serve", {"path": MODEL, "port": 18192, "state": "stopped"})
        cluster.api.nsenter("node04", ["umount", "/srv/small"], check=False)


# --------------------------------------------------------------- faults, orphans, secrets, the seed stage

def node_pids(c, node, needle):
    """PIDs of the node's processes (its own mount namespace) whose command line contains `needle`."""
    out = []
    mntns = c.state["nodes"][node]["mntns"]
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat("/proc/%s/ns/mnt" % pid).st_ino != mntns:
                    continue
                cmd = open("/proc/%s/cmdline" % pid, "rb").read()
            except OSError:
                continue
            if needle in cmd:
                out.append(int(pid))
    return out


def leftovers(c, nodes):
    """{node: [what]} of weight servers and copy jobs still running on `nodes`."""
    out = {}
    for node in nodes:
        found = ["server %d" % p for p in node_pids(c, node, b"npuops_weight_server.py")]
        found += ["copy %d" % p for p in node_pids(c, node, b"AnsiballZ_weight_sync")]
        if found:
            out[node] = found
    return out


def wipe(c, *nodes):
    """Remove the weights of `nodes` (they copy everything again)."""
    for node in nodes:
        root = c.api.root_of(node) + MODEL
        for name in os.listdir(root):
            if name.startswith("model-"):
                os.unlink(os.path.join(root, name))
        for state in ("verified.json", "sync-progress.json"):
            if os.path.exists(os.path.join(root, ".npuops", state)):
                os.unlink(os.path.join(root, ".npuops", state))


class Throttled(object):
    """Every node's fabric limited by tc (both directions), so that a copy lasts long enough to break it."""

    def __init__(self, c, mbit):
        self.c, self.mbit = c, mbit

    def __enter__(self):
        for node, info in self.c.state["nodes"].items():
            os.system("ip netns exec %s tc qdisc replace dev enp61s0f0 root tbf rate %dmbit burst 256kb latency 50ms"
                      % (info["netns"], self.mbit))
        return self

    def __exit__(self, *exc):
        for node, info in self.c.state["nodes"].items():
            os.system("ip netns exec %s tc qdisc del dev enp61s0f0 root 2>/dev/null" % info["netns"])


def start_playbook(c, log, *extra):
    return subprocess.Popen([BIN + "/ansible-playbook", "-i", c.inventory, "playbooks/weights.yml"] + list(extra),
                            env=env(), cwd=REPO, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def wait_for(cond, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError("timed out after %ds waiting for %s" % (timeout, what))


def test_a_frozen_relay_is_routed_around_at_most_one_stall_later(cluster, tmp_path):
    complete_everywhere(cluster)
    fast = ["-e", '{"npuops_weights_peer_timeout": 4, "npuops_weights_progress_interval": 5}']
    total = sum(os.path.getsize(node_file(cluster, "node01", n)) for n in os.listdir(
        cluster.api.root_of("node01") + MODEL) if n.startswith("model-"))
    with Throttled(cluster, 400):
        wipe(cluster, "node02", "node03", "node04")
        t0 = time.time()
        playbook(cluster, *fast)
        baseline = time.time() - t0
        wipe(cluster, "node02", "node03", "node04")
        t0 = time.time()
        play = start_playbook(cluster, str(tmp_path / "hang.log"), *fast)
        gaps = {"node03": 0.0, "node04": 0.0}
        try:
            # node03 pulls from node02's relay: freeze that relay once the chain is flowing
            wait_for(lambda: received(cluster.api.root_of("node03") + MODEL) > 150 * 1024 * 1024, 180, "node03 to receive")
            sim("fault", "--node", "2", "--fault", "relay_hang")
            # the longest time node03 and node04 (downstream of the frozen relay) receive nothing
            last = dict((n, (time.time(), received(cluster.api.root_of(n) + MODEL))) for n in gaps)
            while play.poll() is None:
                time.sleep(0.25)
                for n in gaps:
                    got = received(cluster.api.root_of(n) + MODEL)
                    if got != last[n][1] or got >= total:
                        last[n] = (time.time(), got)
                    gaps[n] = max(gaps[n], time.time() - last[n][0])
            rc = play.wait(600)
        finally:
            if play.poll() is None:
                os.killpg(play.pid, signal.SIGKILL)
            sim("fault", "--node", "2", "--fault", "clear")
        took = time.time() - t0
    out = open(str(tmp_path / "hang.log")).read()
    assert rc == 0, out[-3000:]
    for node in ("node02", "node03", "node04"):
        assert digests(cluster, node) == digests(cluster, "node01"), node
    # one stall: the peer timeout plus its ping, then the bytes come from further up the chain (2 s of slack:
    # a piece lands every ~0.1 s, and the 2 cores are busy)
    stall = 4 + transfer.PING_TIMEOUT
    assert max(gaps.values()) <= stall + 2, gaps
    # the detour shares the seed's link between node02 and node03, which at most halves the rate
    assert took <= 2 * baseline + stall, "frozen relay: %.1fs, without: %.1fs" % (took, baseline)
    assert leftovers(cluster, cluster.state["nodes"]) == {}


def test_a_node_lost_mid_copy_fails_the_stage_for_all_within_60s_and_leaves_nothing_running(cluster, tmp_path):
    complete_everywhere(cluster)
    wipe(cluster, "node02", "node03", "node04")
    log = str(tmp_path / "down.log")
    with Throttled(cluster, 200):
        play = start_playbook(cluster, log, "-e", '{"npuops_weights_progress_interval": 5}')
        try:
            wait_for(lambda: received(cluster.api.root_of("node03") + MODEL) > 80 * 1024 * 1024, 180, "node03 to receive")
            run_id = json.load(open(cluster.api.root_of("node03") + MODEL + "/.npuops/sync-progress.json"))["run_id"]
            sim("fault", "--node", "3", "--fault", "node_down")
            t_down = time.time()
            # the stage has failed for all when it says so (its rescue ended every copy first); what the process
            # does after that (the stats, the outcome file) is not the stage, and on a loaded CI machine it adds
            # seconds that a wait on the exit code would count
            failed_after = None
            deadline = t_down + 120
            while play.poll() is None and time.time() < deadline:
                if failed_after is None and "The weights stage failed" in open(log).read():
                    failed_after = time.time() - t_down
                time.sleep(0.2)
            rc = play.wait(max(1, deadline - time.time()))
            if failed_after is None and "The weights stage failed" in open(log).read():
                failed_after = time.time() - t_down
            # nothing of that run is left on the nodes that can be reached; Ansible's async watchdog (whose argv
            # names the module) polls its ended copy every 5 s (ansible/modules/async_wrapper.py): allow it that
            left = leftovers(cluster, ["node01", "node02", "node04"])
            for _ in range(16):
                if not left:
                    break
                time.sleep(0.5)
                left = leftovers(cluster, ["node01", "node02", "node04"])
            # node03 itself, cut off, still runs its part of that run: the next run ends it before its own
            orphans = leftovers(cluster, ["node03"])
        finally:
            if play.poll() is None:
                os.killpg(play.pid, signal.SIGKILL)
            sim("fault", "--node", "3", "--fault", "clear")
        out = open(log).read()
        assert rc != 0 and failed_after is not None and failed_after <= 60, (failed_after, out[-3000:])
        assert re.search(r"The weights stage failed \(copying\) on 1 host\(s\)", out), out[-3000:]
        assert re.search(r"- node03: unreachable", out), out[-3000:]
        assert left == {}
    again = playbook(cluster)
    assert "End the weight servers and copy jobs that earlier runs left" in again.stdout
    if orphans:
        assert re.search(r"changed: \[node03\]", again.stdout.split("End the weight servers and copy jobs that earlier")[1]
                         .split("TASK")[0])
    for node in ("node02", "node03", "node04"):
        assert digests(cluster, node) == digests(cluster, "node01"), node  # no .part counted as done
    assert leftovers(cluster, cluster.state["nodes"]) == {}
    assert run_id not in open(cluster.api.root_of("node03") + MODEL + "/.npuops/sync-progress.json").read()


def test_an_interrupted_run_leaves_orphans_that_the_next_run_ends_even_with_nothing_to_copy(cluster, tmp_path):
    complete_everywhere(cluster)
    wipe(cluster, "node04")
    with Throttled(cluster, 200):
        play = start_playbook(cluster, str(tmp_path / "killed.log"))
        wait_for(lambda: received(cluster.api.root_of("node04") + MODEL) > 30 * 1024 * 1024, 180, "node04 to receive")
        os.killpg(play.pid, signal.SIGKILL)  # the controller dies; its servers and copy jobs run on
        play.wait(30)
        orphans = leftovers(cluster, cluster.state["nodes"])
        assert "node04" in orphans and any("server" in x for x in orphans.get("node03", [])), orphans
    # let the orphaned copy finish by itself, at full speed: then there is nothing left to copy, only servers to end
    wait_for(lambda: not node_pids(cluster, "node04", b"AnsiballZ_weight_sync"), 300, "the orphaned copy to end")
    assert leftovers(cluster, cluster.state["nodes"]), "the servers of the killed run should still be running"
    rerun = playbook(cluster)
    assert "Pull from the nodes before this one" not in rerun.stdout or "changed: [node0" not in \
        rerun.stdout.split("Pull from the nodes before this one")[1].split("TASK")[0]
    assert leftovers(cluster, cluster.state["nodes"]) == {}
    assert digests(cluster, "node04") == digests(cluster, "node01")


def test_a_ctrl_c_leaves_no_server_listening_longer_than_a_stall(cluster, tmp_path):
    """Ctrl-C in the copy (the terminal's SIGINT to the whole process group): no `always` runs, the servers and the
    copy run on; once the copy has ended, the servers end by themselves after one stall of silence."""
    complete_everywhere(cluster)
    wipe(cluster, "node04")
    stall = 30
    with Throttled(cluster, 200):
        play = start_playbook(cluster, str(tmp_path / "ctrl-c.log"), "-e",
                              '{"npuops_weights_stall_timeout": %d}' % stall)
        wait_for(lambda: received(cluster.api.root_of("node04") + MODEL) > 30 * 1024 * 1024, 180, "node04 to receive")
        os.killpg(play.pid, signal.SIGINT)
        try:
            play.wait(60)
        finally:
            if play.poll() is None:
                os.killpg(play.pid, signal.SIGKILL)
        assert any("server" in x for x in leftovers(cluster, ["node03"]).get("node03", [])), \
            leftovers(cluster, cluster.state["nodes"])
    wait_for(lambda: not node_pids(cluster, "node04", b"AnsiballZ_weight_sync"), 300, "the interrupted copy to end")
    ended = time.time()
    # the idle watch looks every stall/4 s (at most 5)
    wait_for(lambda: not leftovers(cluster, cluster.state["nodes"]), stall + 15, "the servers to end by themselves")
    assert time.time() - ended >= stall - 6, "a server ended before a stall of silence"
    assert digests(cluster, "node04") == digests(cluster, "node01")


def test_the_chain_spans_the_nodes_of_several_instances_from_one_seed(cluster, tmp_path):
    complete_everywhere(cluster)
    inv = os.path.join(os.path.dirname(cluster.inventory), "replicas.yml")
    with open(cluster.inventory) as f:
        text = f.read()
    text += ("    instance_a:\n      vars: {npuops_instance: a}\n      hosts: {node01: {}, node02: {}}\n"
             "    instance_b:\n      vars: {npuops_instance: b}\n      hosts: {node03: {}, node04: {}}\n")
    with open(inv, "w") as f:
        f.write(text)
    wipe(cluster, "node01", "node02", "node04")  # the seed is node03, the first host of the play
    out = run([BIN + "/ansible-playbook", "-i", inv, "tests/playbooks/weights_replicas.yml"], timeout=900)
    for node in ("node01", "node02", "node04"):
        assert re.search(r"%s: 9/9 files, .* \(done\)" % node, out.stdout), out.stdout[-3000:]
        assert digests(cluster, node) == digests(cluster, "node03"), node
    assert leftovers(cluster, cluster.state["nodes"]) == {}


def scan(c, secret, texts):
    """Where `secret` shows: the given texts (output, ps samples), and every node's model directories, run
    directory and async job results."""
    found = [name for name, text in texts.items() if secret in text]
    for node in c.state["nodes"]:
        root = c.api.root_of(node)
        for top in ("/srv/models", "/run/npuops", "/root/.ansible_async", "/tmp"):
            for base, _dirs, files in os.walk(root + top):
                for name in files:
                    path = os.path.join(base, name)
                    if name.endswith(".safetensors") or os.path.islink(path):
                        continue  # random bytes, not text we write
                    try:
                        with open(path, "rb") as f:
                            if secret.encode() in f.read():
                                found.append("%s:%s" % (node, path[len(root):]))
                    except OSError:
                        pass
    return found


HUB_DOUBLE = r'''#!/usr/bin/python3
"""A stand-in for the Hugging Face CLI (test infrastructure): `hf download REPO --revision R --local-dir D`
"downloads" from /srv/hub/REPO/R. Gated: without HF_TOKEN it fails as the hub does."""
import hashlib, os, shutil, sys
args = sys.argv[1:]
repo, rev, dest = args[1], args[args.index("--revision") + 1], args[args.index("--local-dir") + 1]
token = os.environ.get("HF_TOKEN", "")
with open("/tmp/hf-double.log", "a") as f:
    f.write("download %s@%s token_sha256=%s endpoint=%s\n" % (
        repo, rev, hashlib.sha256(token.encode()).hexdigest() if token else "-", os.environ.get("HF_ENDPOINT", "-")))
src = os.path.join("/srv/hub", repo, rev)
if not token:
    sys.exit("401 Client Error: this repository is gated; log in or pass a token")
if not os.path.isdir(src):
    sys.exit("404 Client Error: %s@%s not found" % (repo, rev))
os.makedirs(dest, exist_ok=True)
for name in os.listdir(src):
    shutil.copy2(os.path.join(src, name), os.path.join(dest, name))
'''

HUB_LISTING = r'''import http.server, sys
token = open("/srv/hub/token").read().strip()
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        if self.headers.get("Authorization") != "Bearer " + token:
            self.send_response(401); self.send_header("Content-Length", "0"); self.end_headers(); return
        listings = {"/api/models/org/k3/tree/rev1": "/srv/hub/listing.json",
                    "/api/models/org/k3-dspark/tree/drev1": "/srv/hub/listing-dspark.json"}
        path = [f for p, f in listings.items() if self.path.startswith(p)]
        if not path:
            self.send_response(404); self.send_header("Content-Length", "0"); self.end_headers(); return
        body = open(path[0], "rb").read()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", 18700), H).serve_forever()
'''


def test_the_seed_stage_downloads_checks_the_publisher_and_fans_out(cluster, tmp_path):
    from npuops_sim import weights as synthetic
    seed = cluster.api.root_of("node01")
    hub = seed + "/srv/hub/org/k3/rev1"
    synthetic.write_model(hub, 24 << 20, files=3)
    hub_token = "hf_hubsecret%s" % os.urandom(6).hex()
    with open(seed + "/srv/hub/token", "w") as f:
        f.write(hub_token)
    files = sorted(os.listdir(hub))
    sha = dict((n, hashlib.sha256(open(os.path.join(hub, n), "rb").read()).hexdigest()) for n in files)
    listing = [{"type": "file", "path": n, "lfs": {"oid": sha[n]}} if n.endswith(".safetensors")
               else {"type": "file", "path": n} for n in files]
    with open(seed + "/srv/hub/listing.json", "w") as f:
        json.dump(listing, f)
    with open(seed + "/srv/hub/listing.py", "w") as f:
        f.write(HUB_LISTING)
    with open(seed + "/usr/local/bin/hf", "w") as f:
        f.write(HUB_DOUBLE)
    os.chmod(seed + "/usr/local/bin/hf", 0o755)
    listing_pid = cluster.api.spawn("node01", ["/usr/bin/python3", "/srv/hub/listing.py"])
    # a DSpark draft too: the seed downloads it from its own repository at npuops_draft_revision, checks it against
    # its publisher's listing and every node gets it like the model
    draft_hub = seed + "/srv/hub/org/k3-dspark/drev1"
    synthetic.write_model(draft_hub, 4 << 20, files=1)
    draft_sha = dict((n, hashlib.sha256(open(os.path.join(draft_hub, n), "rb").read()).hexdigest())
                     for n in sorted(os.listdir(draft_hub)))
    with open(seed + "/srv/hub/listing-dspark.json", "w") as f:
        json.dump([{"type": "file", "path": n, "lfs": {"oid": h}} if n.endswith(".safetensors")
                   else {"type": "file", "path": n} for n, h in draft_sha.items()], f)
    dl = "/srv/models/dl"
    settings = {"npuops_model_dir": dl, "npuops_weights_source": "huggingface", "npuops_weights_repo": "org/k3",
                "npuops_weights_revision": "rev1", "npuops_weights_endpoint": "http://127.0.0.1:18700",
                "npuops_weights_hub_token": hub_token, "npuops_draft": "inferact_kimi_k3_dspark",
                "npuops_draft_dir": "/srv/models/dl-dspark", "npuops_draft_overrides": {"repo": "org/k3-dspark"},
                "npuops_draft_revision": "drev1"}
    extra = str(tmp_path / "hub.json")
    with open(extra, "w") as f:
        json.dump(settings, f)
    try:
        wait_for(lambda: cluster.api.nsenter("node01", ["/usr/bin/python3", "-c", "import socket; socket.create_connection("
                                                        "('127.0.0.1', 18700), 1)"], check=False).returncode == 0,
                 30, "the listing server")
        first = playbook(cluster, "-vvv", "-e", "@" + extra)
        for node in cluster.state["nodes"]:
            got = dict((n, hashlib.sha256(open(cluster.api.root_of(node) + dl + "/" + n, "rb").read()).hexdigest())
                       for n in files)
            assert got == sha, node
            got = dict((n, hashlib.sha256(open(cluster.api.root_of(node) + "/srv/models/dl-dspark/" + n, "rb").read())
                        .hexdigest()) for n in draft_sha)
            assert got == draft_sha, node
        assert "/srv/models/dl-dspark -> node01, node02, node03, node04" in first.stdout
        log = open(seed + "/tmp/hf-double.log").read().splitlines()
        token_sha = hashlib.sha256(hub_token.encode()).hexdigest()
        # the token reached the CLI, by environment; the model first, then the draft from its own repository
        assert log == ["download org/k3@rev1 token_sha256=%s endpoint=http://127.0.0.1:18700" % token_sha,
                       "download org/k3-dspark@drev1 token_sha256=%s endpoint=http://127.0.0.1:18700" % token_sha]
        assert hub_token not in first.stdout + first.stderr
        assert not [s for s in scan(cluster, hub_token, {}) if "/srv/hub/" not in s]
        again = playbook(cluster, "-e", "@" + extra)
        assert re.findall(r"changed=(\d+)", again.stdout) == ["0", "0", "0", "0"]
        assert len(open(seed + "/tmp/hf-double.log").read().splitlines()) == 2  # each downloaded once
        # the publisher says another sha256 for one file: the seed fails, the stage fails for all, naming it
        listing[1]["lfs"]["oid"] = "0" * 64
        with open(seed + "/srv/hub/listing.json", "w") as f:
            json.dump(listing, f)
        bad = playbook(cluster, "-e", "@" + extra, check=False)
        assert bad.returncode != 0
        assert re.search(r"The weights stage failed \(preparing the seed\) on 1 host\(s\)", bad.stdout), bad.stdout[-3000:]
        assert re.search(r"- node01: the weights under %s are not what they should be: %s: ours %s, publisher 0{64}"
                         % (dl, re.escape(listing[1]["path"]), sha[listing[1]["path"]]), bad.stdout), bad.stdout[-3000:]
        assert leftovers(cluster, cluster.state["nodes"]) == {}
        # no CLI for the source asked for
        settings.update(npuops_weights_source="modelscope")
        with open(extra, "w") as f:
            json.dump(settings, f)
        nocli = playbook(cluster, "-e", "@" + extra, check=False)
        assert nocli.returncode != 0 and "the seed has no `modelscope` command on its PATH" in nocli.stdout, \
            nocli.stdout[-3000:]
    finally:
        os.kill(listing_pid, signal.SIGTERM)
        os.unlink(seed + "/usr/local/bin/hf")


TOKENIZER = "/srv/tokenizers/kimi-k3"


def test_a_tokenizer_directory_outside_the_model_is_copied_and_verified_after_the_weights(cluster):
    """The tutorial's --tokenizer "$TOKENIZER_PATH" names a directory of its own: only the seed holds it; the stage
    copies it along the same chain with the same checks, repairs a changed file, and names the variable when the
    seed lacks it."""
    complete_everywhere(cluster)
    seed_dir = cluster.api.root_of("node01") + TOKENIZER
    os.makedirs(seed_dir, exist_ok=True)
    files = {"tokenizer_config.json": b'{"tokenizer_class": "TikTokenTokenizer"}\n',
             "tiktoken.model": os.urandom(300 * 1024), "chat_template.jinja": b"{{ messages }}\n"}
    for name, data in files.items():
        with open(os.path.join(seed_dir, name), "wb") as f:
            f.write(data)
    first = playbook(cluster, "-e", "npuops_tokenizer_dir=" + TOKENIZER)
    for node in ("node02", "node03", "node04"):
        assert re.search(r"%s: 3/3 files, .* \(done\)" % node, first.stdout), first.stdout[-3000:]
        root = cluster.api.root_of(node) + TOKENIZER
        for name, data in files.items():
            with open(os.path.join(root, name), "rb") as f:
                assert f.read() == data, (node, name)
    assert "node04: 9/9 files" not in first.stdout  # the weights were complete: only the tokenizer moved
    with open(cluster.api.root_of("node03") + TOKENIZER + "/tiktoken.model", "r+b") as f:
        f.seek(1000)
        f.write(b"\xff" if files["tiktoken.model"][1000:1001] != b"\xff" else b"\x00")
    repaired = playbook(cluster, "-e", "npuops_tokenizer_dir=" + TOKENIZER)  # its mtime changed: re-checked
    assert re.search(r"node03: 3/3 files, .* \(done\)", repaired.stdout), repaired.stdout[-3000:]
    with open(cluster.api.root_of("node03") + TOKENIZER + "/tiktoken.model", "rb") as f:
        assert f.read() == files["tiktoken.model"]
    assert servers_running(cluster) == []
    missing = playbook(cluster, "-e", "npuops_tokenizer_dir=/srv/tokenizers/absent", check=False)
    assert missing.returncode != 0
    assert "npuops_tokenizer_dir = /srv/tokenizers/absent does not exist on this node" in missing.stdout, \
        missing.stdout[-3000:]
    assert "node01" in missing.stdout
