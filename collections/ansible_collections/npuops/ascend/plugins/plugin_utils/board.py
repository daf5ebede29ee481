# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A status board on the controller, so that hosts waiting in parallel learn of each other's failures.

Ansible runs one task on every host at once and moves on only when all have finished: a leader waiting an hour
for its engines would not notice that a worker's container exited or that a worker's host went away. Each host's
waiting action posts its state here (one small JSON file per host in a directory of the run) after every slice
of its wait, and reads the others' before the next: the first failure ends every wait within one slice.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re
import tempfile
import time

FAILED = ("failed", "unreachable")


def board_dir(run_id, base=None):
    """The board of one run: a directory only this user can read (runs are told apart by their id)."""
    if not re.match(r"^[A-Za-z0-9_.-]{1,64}$", str(run_id)):
        raise ValueError("board run id %r must be letters, digits, _ . -" % (run_id,))
    return os.path.join(base or tempfile.gettempdir(), "npuops-board-%s" % run_id)


class Board(object):
    def __init__(self, path, clock=time.time):
        self.path = path
        self.clock = clock
        if not os.path.isdir(path):
            try:
                os.makedirs(path, 0o700)
            except OSError:
                if not os.path.isdir(path):
                    raise

    def _file(self, host):
        return os.path.join(self.path, "%s.json" % re.sub(r"[^A-Za-z0-9_.-]", "_", host))

    def post(self, host, state, msg="", **extra):
        """Record `host`'s state (waiting, running, ready, done, failed, unreachable, aborted, stopped) and what
        else its watcher wants the others to see, atomically: a reader never sees half of one."""
        tmp = "%s.%d.tmp" % (self._file(host), os.getpid())
        entry = dict(extra, host=host, state=state, msg=msg, updated=self.clock())
        with open(tmp, "w") as f:
            json.dump(entry, f)
        os.rename(tmp, self._file(host))

    def read(self, host):
        try:
            with open(self._file(host)) as f:
                return json.load(f)
        except (IOError, OSError, ValueError):
            return None

    def failures(self, hosts, me=None, stale_after=None):
        """[(host, state, msg)] of the other hosts that failed, became unreachable, or (with `stale_after`)
        posted nothing for that many seconds although they had started."""
        out = []
        now = self.clock()
        for h in hosts:
            if h == me:
                continue
            entry = self.read(h)
            if entry is None:
                continue
            if entry["state"] in FAILED:
                out.append((h, entry["state"], entry.get("msg") or ""))
            elif stale_after and entry["state"] == "waiting" and now - entry["updated"] > stale_after:
                out.append((h, "silent", "no news for %ds (its host or its connection hangs)"
                            % (now - entry["updated"])))
        return out
