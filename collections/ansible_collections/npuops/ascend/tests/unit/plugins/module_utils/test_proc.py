# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import signal
import subprocess
import sys
import time

from ansible_collections.npuops.ascend.plugins.module_utils import proc

IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); " \
               "time.sleep(60)"
# a session leader whose child outlives it unless the group is signalled
WITH_CHILD = "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; " \
             "time.sleep(60)']); print(c.pid, flush=True); time.sleep(60)"


def start(code):
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True, text=True)
    line = p.stdout.readline().strip()
    return p, line


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace():
    p, _ready = start(IGNORES_TERM)
    t0 = time.time()
    try:
        assert proc.end([p.pid], grace=0.5, alive=lambda pid: p.poll() is None) == [p.pid]
        took = time.time() - t0
        assert p.wait(5) == -signal.SIGKILL and 0.4 <= took < 5, took
    finally:
        if p.poll() is None:
            p.kill()


def test_a_frozen_process_ends_on_sigterm_without_waiting_for_the_kill():
    p, _line = start("import time; print('ready', flush=True); time.sleep(60)")
    os.kill(p.pid, signal.SIGSTOP)
    try:
        t0 = time.time()
        proc.end([p.pid], grace=10, alive=lambda pid: p.poll() is None)
        assert p.wait(5) == -signal.SIGTERM and time.time() - t0 < 5
    finally:
        if p.poll() is None:
            p.kill()


def test_the_group_goes_with_its_leader_and_nothing_not_running_is_signalled():
    p, child = start(WITH_CHILD)
    child = int(child)
    try:
        proc.end([p.pid], grace=2, alive=lambda pid: p.poll() is None, group=True)
        assert p.wait(5) == -signal.SIGTERM
        deadline = time.time() + 5
        while time.time() < deadline and proc.running(child):
            time.sleep(0.05)
        assert not proc.running(child)
    finally:
        for pid in (p.pid, child):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    # ended, reaped processes and this process itself are left alone
    assert proc.end([p.pid, os.getpid()], grace=0.1) == []
