# -*- coding: utf-8 -*-
"""Finding and ending the weight servers and copy jobs of a run, with real processes."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import subprocess
import sys
import time

import pytest

from ansible_collections.npuops.ascend.plugins.module_utils import weight_runs


@pytest.fixture
def procs(tmp_path):
    """Two servers (runs A and B, named as weight_serve names its script) and two recorded copy jobs."""
    script = str(tmp_path / "npuops_weight_server.py")
    with open(script, "w") as f:
        f.write("import time\ntime.sleep(120)\n")
    started = []
    for run in ("run-a", "run-b"):
        started.append(subprocess.Popen([sys.executable, script, "serve", "--root", "/srv/m", "--port", "18090",
                                         "--run-id", run]))
    job_code = ("import sys, time\nsys.path[:0] = %r\nfrom ansible_collections.npuops.ascend.plugins.module_utils "
                "import weight_runs\nweight_runs.record_job(sys.argv[1], sys.argv[2], '/srv/m')\nprint('ok', "
                "flush=True)\ntime.sleep(120)\n" % (sys.path,))
    for run in ("run-a", "run-b"):
        p = subprocess.Popen([sys.executable, "-c", job_code, str(tmp_path / "run"), run], stdout=subprocess.PIPE)
        assert p.stdout.readline().strip() == b"ok"
        started.append(p)
    yield started
    for p in started:
        p.kill()
        p.wait()


def alive(p):
    return p.poll() is None


def test_servers_and_jobs_are_found_with_their_run(procs, tmp_path):
    servers = [s for s in weight_runs.servers() if s["pid"] in (procs[0].pid, procs[1].pid)]
    found = sorted((s["run_id"], s["port"], s["root"]) for s in servers)
    assert found == [("run-a", 18090, "/srv/m"), ("run-b", 18090, "/srv/m")]
    jobs = weight_runs.jobs(str(tmp_path / "run"))
    assert sorted((j["pid"], j["run_id"]) for j in jobs) == sorted([(procs[2].pid, "run-a"), (procs[3].pid, "run-b")])


def test_a_run_ends_what_earlier_runs_left_and_only_that(procs, tmp_path):
    run_dir = str(tmp_path / "run")
    would = weight_runs.stop(run_dir, except_run_id="run-b", check_only=True)
    assert all(alive(p) for p in procs)
    stopped = weight_runs.stop(run_dir, except_run_id="run-b")
    ours = [p for p in stopped if p["pid"] in [x.pid for x in procs]]
    assert sorted(p["pid"] for p in ours) == sorted([procs[0].pid, procs[2].pid])
    assert sorted(p["pid"] for p in would if p["pid"] in [x.pid for x in procs]) == sorted(p["pid"] for p in ours)
    time.sleep(0.2)
    assert [alive(p) for p in procs] == [False, True, False, True]
    assert [j["run_id"] for j in weight_runs.jobs(run_dir)] == ["run-b"]  # the ended job's record is gone
    weight_runs.stop(run_dir, run_id="run-b")
    time.sleep(0.2)
    assert not any(alive(p) for p in procs) and weight_runs.jobs(run_dir) == []


def test_a_record_whose_pid_was_reused_is_not_killed(tmp_path):
    run_dir = str(tmp_path / "run")
    path = weight_runs.record_job(run_dir, "run-x", "/srv/m")  # this test process
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace('"start_ticks": ', '"start_ticks": 1'))  # as if our PID had been another process's
    assert weight_runs.jobs(run_dir) == [] and not os.path.exists(path)


def test_a_frozen_server_is_ended_too(procs, tmp_path):
    import signal
    os.kill(procs[0].pid, signal.SIGSTOP)
    t0 = time.time()
    weight_runs.stop(str(tmp_path / "run"), run_id="run-a")
    procs[0].wait(10)
    assert time.time() - t0 < 4  # SIGTERM acts once SIGCONT lets it run, no SIGKILL grace needed


@pytest.mark.skipif(os.geteuid() != 0, reason="a second network namespace needs root")
def test_a_server_in_another_network_namespace_is_not_this_nodes(procs, tmp_path):
    """On the simulator every node (and a second cluster) shares this process table; on a host a container's
    processes do. A run that ends earlier runs' servers must end only its own node's."""
    script = str(tmp_path / "npuops_weight_server.py")
    other = subprocess.Popen(["unshare", "--net", "--", sys.executable, script, "serve", "--root", "/srv/m",
                              "--port", "18090", "--run-id", "run-elsewhere"])
    try:
        deadline = time.time() + 10
        while time.time() < deadline and weight_runs._net_ns(other.pid) == weight_runs._net_ns():
            time.sleep(0.05)  # until unshare has exec'd into the new namespace
        assert weight_runs._net_ns(other.pid) not in (None, weight_runs._net_ns())
        assert other.pid not in [s["pid"] for s in weight_runs.servers()]
        stopped = weight_runs.stop(str(tmp_path / "run"), except_run_id="run-b")
        assert other.pid not in [p["pid"] for p in stopped] and alive(other)
        assert not alive(procs[0])  # the run-a server of this namespace was ended, as before
    finally:
        other.kill()
        other.wait()
