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

from npuops_sim.testing import BIN, REPO, bring_up, env, run, sim

pytestmark = pytest.mark.sim
MODEL = "/srv/models/kimi-k3-w4a8"
FILES = 8
SIZE = "1G"


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
            total += int(open(path).read() or 0) * piece
    return total


def servers_running(c):
    out = []
    for node in c.state["nodes"]:
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    cmd = open("/proc/%s/cmdline" % pid, "rb").read()
                except OSError:
                    continue
                if b"npuops_weight_server.py" in cmd and c.api.state["nodes"][node]["mntns"] == \
                        os.stat("/proc/%s/ns/mnt" % pid).st_ino:
                    out.append((node, int(pid)))
    return out


def test_copy_to_every_node_is_byte_identical_and_a_rerun_moves_nothing(cluster):
    first = playbook(cluster)
    assert "Show the copy progress" in first.stdout and re.search(r"node04: 9/9 files, [\d.]+/[\d.]+ GB", first.stdout)
    seed = digests(cluster, "node01")
    assert len(seed) == FILES + 1
    for node in ("node02", "node03", "node04"):
        assert digests(cluster, node) == seed, node
    second = playbook(cluster)
    assert re.findall(r"changed=(\d+)", second.stdout) == ["0", "0", "0", "0"]
    assert "Pull from the nodes before this one" not in second.stdout or "changed: [node0" not in second.stdout
    assert servers_running(cluster) == []


def test_a_flipped_byte_at_a_destination_is_repaired_by_full_verify(cluster):
    playbook(cluster)  # start from a complete copy everywhere
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
    playbook(cluster)  # start from a complete copy everywhere
    root = cluster.api.root_of(victim) + MODEL
    for name in os.listdir(root):
        if name.startswith("model-"):
            os.unlink(os.path.join(root, name))
    os.unlink(os.path.join(root, ".npuops", "verified.json"))
    # slow node02's fabric so the kill lands mid-copy
    ns = cluster.state["nodes"][victim]["netns"]
    os.system("ip netns exec %s tc qdisc add dev enp61s0f0 root tbf rate 400mbit burst 256kb latency 50ms" % ns)
    play = subprocess.Popen([BIN + "/ansible-playbook", "-i", cluster.inventory, "playbooks/weights.yml"],
                            env=env(), cwd=REPO, stdout=subprocess.DEVNULL,
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
        mntns = cluster.state["nodes"][victim]["mntns"]
        killed = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    if os.stat("/proc/%s/ns/mnt" % pid).st_ino != mntns:
                        continue
                    cmd = open("/proc/%s/cmdline" % pid, "rb").read()
                except OSError:
                    continue
                if b"weight_sync" in cmd:
                    os.kill(int(pid), signal.SIGKILL)
                    killed.append(int(pid))
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
    playbook(cluster)  # start from a complete copy everywhere
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
        assert re.search(r"node02: the weight copy failed: %s" % re.escape(rel), out.stdout), out.stdout[-3000:]
        assert "Stop the weight servers" in out.stdout and servers_running(cluster) == []
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
    playbook(cluster)  # the seed's manifest is recorded
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
                         "parallel": 1}, check=False)
        assert res.get("failed") and "disk full while writing" in res["msg"] and "nothing was renamed" in res["msg"]
        left = cluster.api.nsenter("node04", ["sh", "-c", "find /srv/small -name '*.part*' | wc -l"]).stdout.strip()
        assert left == "0"
    finally:
        adhoc(cluster, "node01", "npuops.ascend.weight_serve", {"path": MODEL, "port": 18192, "state": "stopped"})
        cluster.api.nsenter("node04", ["umount", "/srv/small"], check=False)
