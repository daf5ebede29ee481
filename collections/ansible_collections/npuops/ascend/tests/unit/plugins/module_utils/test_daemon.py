# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import sys
import time

from ansible_collections.npuops.ascend.plugins.module_utils import daemon

# a process that writes "hup" to a file on SIGHUP and otherwise waits
HUPPER = ("import signal, sys, time\n"
          "def hup(*_):\n"
          "    open(sys.argv[1], 'a').write('hup\\n')\n"
          "signal.signal(signal.SIGHUP, hup)\n"
          "open(sys.argv[1], 'a').write('up\\n')\n"
          "while True:\n"
          "    time.sleep(0.05)\n")


def wait_for(pred, timeout=5.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_converge_starts_once_reloads_by_sighup_restarts_on_new_argv_and_stops(tmp_path):
    marks = tmp_path / "marks"
    pidfile, log = str(tmp_path / "run" / "p.pid"), str(tmp_path / "p.log")
    argv = [sys.executable, "-c", HUPPER, str(marks)]

    r = daemon.converge(argv, pidfile, log, reload_token="a")
    assert (r["changed"], r["action"]) == (True, "started")
    first = r["record"]["pid"]
    assert wait_for(lambda: marks.exists() and marks.read_text() == "up\n")

    r = daemon.converge(argv, pidfile, log, reload_token="a")
    assert (r["changed"], r["action"], r["record"]["pid"]) == (False, "none", first)

    r = daemon.converge(argv, pidfile, log, reload_token="b", check_mode=True)
    assert (r["changed"], r["action"]) == (True, "reloaded")
    r = daemon.converge(argv, pidfile, log, reload_token="b")
    assert (r["changed"], r["action"], r["record"]["pid"]) == (True, "reloaded", first)
    assert wait_for(lambda: marks.read_text() == "up\nhup\n")
    assert daemon.converge(argv, pidfile, log, reload_token="b")["changed"] is False

    r = daemon.converge(argv + ["x"], pidfile, log, reload_token="b")
    assert r["action"] == "restarted" and r["record"]["pid"] != first
    assert not os.path.exists("/proc/%d/cmdline" % first) or daemon.start_time(first) is None or \
        wait_for(lambda: daemon.start_time(first) is None)

    r = daemon.converge([], pidfile, log, state="stopped")
    assert (r["changed"], r["action"]) == (True, "stopped")
    assert not os.path.exists(pidfile)
    assert daemon.converge([], pidfile, log, state="stopped")["changed"] is False


def test_a_recycled_pid_is_not_taken_for_ours(tmp_path):
    pidfile = tmp_path / "p.pid"
    # our own pid with another start time: alive under that pid, but not the recorded process
    pidfile.write_text('{"pid": %d, "start_time": 1, "argv": ["x"]}' % os.getpid())
    assert daemon.status(str(pidfile)) is None


def test_wait_http_gives_up_with_the_reason():
    ok, why = daemon.wait_http("http://127.0.0.1:9/none", 0.5, interval=0.1)
    assert ok is False and why


def test_log_tail(tmp_path):
    log = tmp_path / "l"
    log.write_text("\n".join("line %d" % i for i in range(50)) + "\n")
    assert daemon.log_tail(str(log), lines=2) == "line 48\nline 49"
    assert daemon.log_tail(str(tmp_path / "missing")) == ""


def test_a_pid_file_names_its_process_while_it_runs(tmp_path):
    """HAProxy's and keepalived's pid files (the pid on the first line) and the record start() writes."""
    pid_file = tmp_path / "x.pid"
    pid_file.write_text("%d\n" % os.getpid())
    assert daemon.pid_file_running(str(pid_file)) == os.getpid()
    pid_file.write_text("999999\n")
    assert daemon.pid_file_running(str(pid_file)) is None
    assert daemon.pid_file_running(str(tmp_path / "missing.pid")) is None
    pid_file.write_text(json.dumps({"pid": os.getpid(), "start_time": 1, "argv": ["x"]}))
    assert daemon.pid_in_file(str(pid_file)) == os.getpid() == daemon.pid_file_running(str(pid_file))
