# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import socket
import sys
import time

import pytest

from ansible_collections.npuops.ascend.plugins.module_utils import hccn, host
from ansible_collections.npuops.ascend.tests.unit.plugins.module_utils.net_helpers import free_port


def test_nic_that_owns_the_ip_passes():
    assert host.check_nic({"enp189s0f0": ["10.0.0.11"], "lo": ["127.0.0.1"]}, "enp189s0f0", "10.0.0.11") == []


def test_wrong_nic_points_at_the_right_one():
    nics = {"eth0": ["192.168.1.5"], "enp189s0f0": ["10.0.0.11"]}
    p = host.check_nic(nics, "eth0", "10.0.0.11")[0]
    assert p["check"] == "nic" and p["observed"] == "eth0 has 192.168.1.5"
    assert p["fix"] == "10.0.0.11 is on enp189s0f0: set npuops_nic: enp189s0f0"
    missing = host.check_nic(nics, "ens1", "10.0.0.11")[0]
    assert "no interface named ens1" in missing["observed"] and "enp189s0f0" in missing["fix"]
    nowhere = host.check_nic(nics, "eth0", "10.0.0.99")[0]
    assert "is not an address of this node" in nowhere["fix"]


def test_ports_free_reads_listeners_and_names_the_owner(tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    port = sock.getsockname()[1]
    try:
        problems, _held = host.check_ports_free([port])
        assert problems and problems[0]["port"] == port
        assert "%d (" % os.getpid() in problems[0]["observed"]
    finally:
        sock.close()
    assert host.check_ports_free([port]) == ([], [])


def test_ports_free_from_a_proc_snapshot(tmp_path):
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "tcp").write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1\n"
        "   1: 0100007F:3446 0100007F:1F40 01 00000000:00000000 00:00000000 00000000     0        0 4243 1\n")
    problems, _held = host.check_ports_free([8000, 13382], proc_root=str(tmp_path))
    assert [p["port"] for p in problems] == [8000]  # 13382 is only a client connection, not a listener


def test_shm_and_disk(tmp_path):
    size, problems = host.check_shm(1, path=str(tmp_path))
    assert size > 0 and problems == []
    _size, problems = host.check_shm(1 << 60, path=str(tmp_path))
    assert problems[0]["check"] == "shm" and "at least" in problems[0]["expected"]
    model = tmp_path / "models" / "k3"
    model.mkdir(parents=True)
    (model / "a.safetensors").write_bytes(b"x" * 1000)
    free, present, problems = host.check_disk(str(model), 1000)
    assert present == 1000 and problems == []  # already there counts as placed
    _free, _present, problems = host.check_disk(str(tmp_path / "not" / "yet"), 1 << 60)
    assert problems[0]["check"] == "disk" and str(tmp_path) in problems[0]["observed"]


def test_engine_missing_or_broken():
    _v, problems = host.check_engine("isula", lambda name: None, None)
    assert problems[0]["check"] == "container_engine" and "isula not found" in problems[0]["observed"]
    _v, problems = host.check_engine("docker", lambda name: "/usr/bin/docker",
                                     lambda argv: (1, "Cannot connect to the Docker daemon"))
    assert "Cannot connect" in problems[0]["observed"]
    version, problems = host.check_engine("podman", lambda name: "/usr/bin/podman",
                                          lambda argv: (0, "podman version 4.3.1\n"))
    assert version == "podman version 4.3.1" and problems == []


def test_hccn_conf(tmp_path):
    conf = tmp_path / "hccn.conf"
    addrs, problems = host.check_hccn_conf(str(conf), [0, 1], hccn.parse_hccn_conf)
    assert addrs == {} and "is missing" in problems[0]["observed"]
    conf.write_text("address_0=10.0.0.1\nnetmask_0=255.255.0.0\naddress_1=10.0.0.1\n")
    addrs, problems = host.check_hccn_conf(str(conf), [0, 1, 2], hccn.parse_hccn_conf)
    assert addrs == {0: "10.0.0.1", 1: "10.0.0.1"}
    assert [p["observed"] for p in problems] == [
        "%s has no address for devices [2]" % conf, "devices 0 and 1 both have 10.0.0.1"]


def test_listener_answers_reach_checks_then_goes_away():
    port = free_port()
    pid, problems = host.start_listener(sys.executable, "127.0.0.1", [port], "s3cret", seconds=10, expect=1)
    assert problems == [] and pid
    with open("/proc/%d/cmdline" % pid, "rb") as f:
        assert b"s3cret" not in f.read()  # the token reached it on stdin: `ps` cannot show it
    results, problems = host.check_reach([{"host": "leader", "address": "127.0.0.1", "port": port}], "s3cret", 5)
    assert results[0]["ok"] and problems == []
    deadline = time.time() + 5
    while time.time() < deadline:  # it answered its one expected connection: it exits and frees the port
        try:
            os.kill(pid, 0)
            os.waitpid(pid, os.WNOHANG)
        except OSError:
            break
        time.sleep(0.05)
    assert host.check_ports_free([port]) == ([], [])


def test_reach_tells_a_foreign_listener_from_ours_and_times_out_on_nothing():
    port = free_port()
    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    other.bind(("127.0.0.1", port))
    other.listen(4)
    try:
        results, problems = host.check_reach([{"address": "127.0.0.1", "port": port}], "s3cret", 1)
        assert not results[0]["ok"] and problems[0]["check"] == "reach"
    finally:
        other.close()
    t0 = time.time()
    results, problems = host.check_reach([{"host": "leader", "address": "127.0.0.1", "port": free_port()}],
                                         "s3cret", 1)
    assert not results[0]["ok"] and time.time() - t0 < 4
    assert "open TCP" in problems[0]["fix"] and "leader" in problems[0]["fix"]


def test_listener_on_a_busy_port_reports_it():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    try:
        pid, problems = host.start_listener(sys.executable, "127.0.0.1", [sock.getsockname()[1]], "t", 5, 0)
        assert pid is None and "Address already in use" in problems[0]["observed"]
    finally:
        sock.close()


@pytest.mark.parametrize("n,text", [(3 * host.GIB, "3.0 GiB"), (64 * 1024 * 1024, "64 MiB")])
def test_human_sizes(n, text):
    assert host.human(n) == text


def test_processes_of_a_container_are_found_by_the_id_in_their_cgroup(tmp_path):
    cid = "5f1c" * 16
    for pid, cgroup in ((10, "8:pids:/libpod_parent/libpod-%s\n" % cid), (11, "0::/docker/%s\n" % cid),
                        (12, "8:pids:/libpod_parent/libpod-%s\n" % ("ab" * 32)), (13, "0::/\n")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(cgroup)
    assert host.container_pids(cid, proc_root=str(tmp_path)) == {10, 11}
    assert host.container_pids("", proc_root=str(tmp_path)) == set()


def test_a_port_held_by_the_service_is_held_not_a_problem():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    port = sock.getsockname()[1]
    try:
        problems, held = host.check_ports_free([port], service_pids=[os.getpid()])
        assert problems == [] and held == [{"port": port, "owner": "%d (%s)" % (
            os.getpid(), open("/proc/self/comm").read().strip())}]
        problems, held = host.check_ports_free([port], service_pids=[1])
        assert held == [] and "port %d is in use by %d" % (port, os.getpid()) in problems[0]["observed"]
    finally:
        sock.close()


def test_a_live_target_is_reached_by_a_plain_connect():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    port = sock.getsockname()[1]
    try:
        results, problems = host.check_reach([{"address": "127.0.0.1", "port": port, "live": True}], "t", 2)
        assert problems == [] and results[0]["detail"] == "reached the running service"
        results, problems = host.check_reach([{"address": "127.0.0.1", "port": port}], "t", 1)
        assert problems[0]["observed"].endswith("timed out")  # a listener that is not ours does not say the token
    finally:
        sock.close()


def test_the_pid_files_of_the_service_name_its_processes_and_their_children(tmp_path):
    """HAProxy and keepalived write the pid on the first line; managed_process (Prometheus) writes a JSON record:
    both are the service's own, with every descendant (HAProxy's workers)."""
    proc_root = tmp_path / "proc"
    for pid, ppid in ((100, 1), (101, 100), (102, 101), (200, 1), (300, 1)):
        (proc_root / str(pid)).mkdir(parents=True)
        (proc_root / str(pid) / "stat").write_text("%d (x y) S %d %s\n" % (pid, ppid, " ".join(["0"] * 20)))
    (tmp_path / "haproxy.pid").write_text("100\n")
    (tmp_path / "prometheus.pid").write_text(json.dumps({"pid": 200, "start_time": 5, "argv": ["prometheus"]}))
    (tmp_path / "stale.pid").write_text("999\n")  # no such process
    (tmp_path / "garbage.pid").write_text("not a pid\n")
    files = [str(tmp_path / n) for n in ("haproxy.pid", "prometheus.pid", "stale.pid", "garbage.pid", "missing.pid")]
    assert host.pid_file_tree(files, proc_root=str(proc_root)) == {100, 101, 102, 200}
