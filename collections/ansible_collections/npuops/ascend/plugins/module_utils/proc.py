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


def _text(data):
    return (data or b"").decode("utf-8", "replace")


def describe(argv, timeout):
    """How a timed-out command is named in messages."""
    return "%s did not answer within %ss" % (" ".join(argv[:4]), timeout)
