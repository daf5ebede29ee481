"""Up and down: sizes, timings, and that `down` leaves nothing behind."""
import glob
import os
import re
import subprocess
import time

import pytest

from npuops_sim.testing import BIN, TEST_ENV, SimCluster, bring_up, run, sim

pytestmark = pytest.mark.sim


def snapshot():
    """What this cluster could leave on the machine: namespaces, links, mounts, processes, state dirs. Every name the
    simulator creates carries the cluster id (SIM_ID), so other clusters running meanwhile (other test lanes) do
    not disturb the comparison."""
    p = TEST_ENV["SIM_ID"]
    netns = {n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
             if n.startswith(p + "-")}
    links = {n for n in re.findall(r"^\d+: ([^:@]+)", subprocess.run(["ip", "-o", "link"], capture_output=True,
                                                                      text=True).stdout, re.M) if n.startswith(p + "-")}
    with open("/proc/self/mountinfo") as f:
        mounts = {" ".join(line.split()[3:5]) for line in f if "/%s-" % p in line or "cluster-%s/" % p in line}
    procs = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "cluster-%s/" % p in cmd:
                procs.add(cmd)
    root = os.environ.get("SIM_ROOT", "/var/lib/npuops-sim")
    dirs = {d for d in os.listdir(root) if d == "cluster-" + p} if os.path.isdir(root) else set()
    return {"netns": netns, "links": links, "mounts": mounts, "procs": procs, "dirs": dirs}


def container_cgroups(ids):
    """The cgroup directories podman (cgroupfs manager) made for these containers, in every controller."""
    return [d for d in glob.glob("/sys/fs/cgroup/*/libpod_parent/*") if any(i in os.path.basename(d) for i in ids)]


def test_down_leaves_nothing_behind_and_is_safe_twice(tmp_path_factory):
    sim("down")
    before = snapshot()
    c = bring_up(tmp_path_factory, 2)
    state = c.state
    # give it everything that could leak: a running container, a helper process, an ssh control master
    ctr = c.ssh("node01", "podman run -d --name vllm --network host localhost/npuops-sim/vllm-ascend:v0.23.0-a3 "
                          "sleep 600").stdout.strip()
    sim("fault", "--node", "2", "--fault", "port_busy", "--port", "8000")
    run([BIN + "/ansible", "all", "-i", c.inventory, "-m", "ansible.builtin.ping"])
    during = snapshot()
    assert {n["netns"] for n in state["nodes"].values()} <= during["netns"] - before["netns"]
    assert container_cgroups([ctr]), "the container's cgroup is where this test looks for it"
    p = TEST_ENV["SIM_ID"]
    assert during["links"] - before["links"] >= {p + "-mgmt", p + "-fab", p + "-m01", p + "-f02"}
    pids = [n["sshd_pid"] for n in state["nodes"].values()] + [h["pid"] for h in c.state["helpers"]]

    out = sim("down").stdout
    assert re.search(r"sim-down: done in [\d.]+s", out)
    after = snapshot()
    for key in before:
        assert after[key] == before[key], "%s left behind: %s" % (key, after[key] ^ before[key])
    assert not any(os.path.exists("/proc/%d" % p) and open("/proc/%d/stat" % p).read().split()[2] != "Z"
                   for p in pids)
    assert not container_cgroups([ctr])
    assert not os.path.exists(c.inventory)
    assert not os.path.exists(c.api.dir)
    again = sim("down")  # twice is fine
    assert again.returncode == 0 and snapshot() == before


def test_down_cleans_up_after_a_crash_halfway_up(tmp_path_factory):
    """A crashed `up` leaves a recorded state; the names alone are enough for `down` to find the rest."""
    sim("down")
    before = snapshot()
    c = bring_up(tmp_path_factory, 2)
    os.unlink(c.api.state_path)  # lose the record: down must still find its namespaces and links by name
    sim("down")
    after = snapshot()
    assert after["netns"] == before["netns"] and after["links"] == before["links"]


def test_sixteen_nodes_up_in_under_3_minutes_and_go_down_in_under_1(tmp_path_factory):
    """(A healthy 16-node cluster passing preflight is the 16-node molecule scenario's converge: site.yml.)"""
    sim("image")  # the acceptance timing is with the image already cached
    sim("down")
    t0 = time.monotonic()
    c = bring_up(tmp_path_factory, 16)
    up_s = time.monotonic() - t0
    try:
        assert re.search(r"sim-up: 16 A3 nodes in [\d.]+s", c.up_output)
        out = run([BIN + "/ansible", "all", "-i", c.inventory, "-m", "ansible.builtin.ping", "-o", "-f", "16"]).stdout
        assert len(re.findall(r"^node\d+ \| SUCCESS", out, re.M)) == 16
        addrs = set()
        for node in ("node01", "node16"):
            addrs |= set(re.findall(r"^address_\d+=(\S+)$", c.ssh(node, "cat /etc/hccn.conf").stdout, re.M))
        assert len(addrs) == 32
        text = open(c.inventory).read()
        assert "npuops_tier: 8p8d_pd" in text and "prefill:" in text and "decode:" in text
    finally:
        t1 = time.monotonic()
        sim("down")
        down_s = time.monotonic() - t1
    assert up_s < 180, "16-node sim took %.0fs to come up" % up_s
    assert down_s < 60, "16-node sim took %.0fs to go down" % down_s


def test_sim_playbooks_bring_the_cluster_up_and_down(tmp_path):
    sim("down")
    inv = tmp_path / "hosts.yml"
    run([BIN + "/ansible-playbook", "playbooks/sim_up.yml", "-e",
         '{"sim_nodes": 2, "sim_profile": "a2", "sim_inventory": "%s"}' % inv])
    c = SimCluster(inv)
    try:
        table = c.ssh("node02", "npu-smi info").stdout
        assert len(re.findall(r"^\| \d+\s+910B3\s+\| OK", table, re.M)) == 8
    finally:
        run([BIN + "/ansible-playbook", "playbooks/sim_down.yml"])
    assert c.state is None and not inv.exists()


def test_a_sim_root_inside_the_temporary_directory_works(tmp_path, tmp_path_factory, monkeypatch):
    """A second checkout's cluster keeps its state under a temporary directory (SIM_ROOT=$(mktemp -d)). Every node
    mounts its own /tmp; that must not hide the files the node boots and runs from (its /srv, sshd's keys, podman's
    image store), and the node's /tmp stays its own."""
    monkeypatch.setenv("SIM_ROOT", str(tmp_path / "sim-root"))
    sim("down")
    c = bring_up(tmp_path_factory, 2)
    try:
        assert c.api.dir.startswith(str(tmp_path) + "/")
        out = run([BIN + "/ansible", "all", "-i", c.inventory, "-m", "ansible.builtin.ping", "-o"]).stdout
        assert sorted(re.findall(r"^(node\d+) \| SUCCESS", out, re.M)) == ["node01", "node02"]
        # podman inside the node reads the image store under SIM_ROOT
        assert c.ssh("node01", "podman image exists %s && echo present" % c.state["image"]).stdout.strip() == "present"
        probe = "npwt-own-tmp-%d" % os.getpid()
        c.ssh("node02", "echo node02 > /tmp/%s && echo models > /srv/models/%s" % (probe, probe))
        node_dir = c.api.node_dir("node02")
        assert open(os.path.join(node_dir, "tmp", probe)).read() == "node02\n"
        assert open(os.path.join(node_dir, "srv", "models", probe)).read() == "models\n"
        assert not os.path.exists(os.path.join("/tmp", probe))
        assert c.ssh("node01", "test -e /tmp/%s || echo absent" % probe).stdout.strip() == "absent"
    finally:
        control = c.api.control_dir()  # ssh's control sockets: too deep under tmp_path for a socket's path
        sim("down")
    assert not os.path.exists(c.api.dir) and not os.path.exists(control)


def test_a_sim_root_the_nodes_mount_over_is_refused_with_the_reason(tmp_path, monkeypatch):
    lock_before = os.path.exists("/tmp/image.lock")
    for root, reason in (("/tmp", "each node mounts its own /tmp there"),
                         (str(tmp_path / "a,b"), "','")):
        monkeypatch.setenv("SIM_ROOT", root)
        proc = sim("up", "--nodes", "1", check=False)
        assert proc.returncode != 0
        assert "SIM_ROOT=%s" % root in proc.stderr and reason in proc.stderr, proc.stderr
    # refused before anything was made there
    assert not os.path.exists(tmp_path / "a,b")
    assert os.path.exists("/tmp/image.lock") == lock_before
