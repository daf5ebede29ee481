# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every external command a module runs goes through here: bounded in time, never through a shell.

A wedged driver makes npu-smi block forever, a hung container daemon makes `docker inspect` block forever; a
deployment tool must turn that into a failed check naming the command, not a play that never ends.
Standard library only: this runs on the nodes.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import signal
import subprocess
import time

TIMED_OUT = -9


def run(argv, timeout, data=None, env=None):
    """-> (rc, stdout, stderr) as text. rc TIMED_OUT when the command had to be killed after `timeout` seconds
    (its whole process group, so a child it started cannot keep the pipes open); 127 when it cannot start. `env`:
    variables added to this process's environment for the command (secrets belong here, never in argv)."""
    # start_new_session, not preexec_fn=os.setsid: preexec_fn is unsafe in threaded callers (hccn_check and the
    # exporter run commands from threads; Python docs, subprocess.Popen) and forces a full fork() of the caller,
    # where CPython >= 3.10 can vfork: a tenth of the cost per command in a module-sized process.
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True,
                                start_new_session=True, env=dict(os.environ, **env) if env else None)
    except OSError as e:
        return 127, "", "%s: %s" % (argv[0], e)
    try:
        out, err = proc.communicate(input=data.encode("utf-8") if isinstance(data, str) else data, timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        out, err = proc.communicate()
        return TIMED_OUT, _text(out), _text(err) + "\n(killed after %ss: it did not answer)" % timeout
    return proc.returncode, _text(out), _text(err)


def running(pid):
    """Whether `pid` is a live process (a zombie is not: it has ended, its parent has not reaped it yet)."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (IOError, OSError, IndexError):
        return False


def end(pids, grace=5.0, alive=running, group=False):
    """End processes, the one way npuops ends any: SIGTERM (and SIGCONT: a frozen process acts on it only once it
    runs), then SIGKILL to those still `alive` after `grace` seconds, then up to 5 s for them to go. `group`: signal
    each one's process group (a session leader's children go with it). -> the PIDs that were running."""
    pids = [p for p in pids if p != os.getpid() and alive(p)]

    def send(pid, sig):
        if group:
            try:
                os.killpg(pid, sig)
                return
            except OSError:
                pass
        try:
            os.kill(pid, sig)
        except OSError:
            pass

    for pid in pids:
        send(pid, signal.SIGTERM)
        send(pid, signal.SIGCONT)
    for sig, wait in ((signal.SIGKILL, grace), (None, 5.0)):
        deadline = time.time() + wait
        while time.time() < deadline and any(alive(p) for p in pids):
            time.sleep(0.05)
        if sig is not None:
            for pid in pids:
                if alive(pid):
                    send(pid, sig)
    return pids


def _text(data):
    return (data or b"").decode("utf-8", "replace")


def describe(argv, timeout):
    """How a timed-out command is named in messages."""
    return "%s did not answer within %ss" % (" ".join(argv[:4]), timeout)
