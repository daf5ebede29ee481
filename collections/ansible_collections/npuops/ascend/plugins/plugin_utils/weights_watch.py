# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Following the weight copies on the controller (the weight_wait action): one watcher per host, side by side
in the controller's worker processes, sharing their state on a board (plugin_utils/board.py), so that a
failure anywhere ends the copy everywhere within about a second. Plain functions and classes: the
action supplies how to look at a node and how to stop its copy."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

MAX_INTERVAL = 30
# what an async job's result carries that is the job wrapper's, not the copy's
_WRAPPER_KEYS = ("ansible_job_id", "started", "finished", "results_file", "stdout", "stderr", "stdout_lines",
                 "stderr_lines", "invocation", "_ansible_suppress_tmpdir_delete", "changed", "failed", "msg")


def copy_state(status):
    """running / done / failed from an async_status result."""
    status = status or {}
    if not status.get("finished"):
        return "running"
    return "failed" if status.get("failed") else "done"


def _gb(n):
    return "%.1f" % (float(n or 0) / 1e9)


def progress_line(host, status, progress, run_id):
    """One line for a receiving node; a progress file another run left is not shown (the copy is starting)."""
    p = progress if isinstance(progress, dict) and progress.get("run_id") == run_id else {}
    state = copy_state(status)
    if state == "running":
        state = p.get("state", "starting") if p.get("state") != "done" else "finishing"
    eta = p.get("eta_s") if state == "running" else None
    return "%s: %s/%s files, %s/%s GB, %s MB/s, ETA %s (%s)" % (
        host, p.get("files_done", 0), p.get("files_total", "?"), _gb(p.get("bytes_done")), _gb(p.get("bytes_total")),
        p.get("mb_per_s", 0),
        ("%dm%02ds" % divmod(int(eta), 60)) if eta is not None else "-", state)


class Watch(object):
    """The watcher of one host. `look(args, task_vars)` -> (async status or None, progress or None) and
    `stop(args, task_vars)` are the action's; `show(line)` prints."""

    def __init__(self, me, args, board, look, stop, show, clock=time.time, sleep=time.sleep):
        self.me, self.args, self.board = me, args, board
        self.look, self.stop, self.show = look, stop, show
        self.clock, self.sleep = clock, sleep
        self.interval = min(max(int(args.get("interval") or 20), 1), MAX_INTERVAL)

    def trouble(self, started, now):
        """[(host, reason)] of the other hosts that failed, became unreachable or went silent."""
        out = []
        for h in self.args["hosts"]:
            if h == self.me:
                continue
            st = self.board.read(h)
            if st is None:
                if now - started > self.args["lost_after"]:
                    out.append((h, "its watcher never reported (lost)"))
            elif st.get("state") in ("failed", "unreachable"):
                out.append((h, "%s: %s" % (st["state"], st.get("msg") or "no message")))
            elif st.get("state") == "running" and now - float(st.get("updated") or 0) > self.args["lost_after"]:
                out.append((h, "no news for %ds (lost)" % (now - float(st["updated"]))))
        return out

    def others_done(self):
        return all((self.board.read(h) or {}).get("state") == "done" for h in self.args["receivers"] if h != self.me)

    def _end_here(self, task_vars, state, msg, extra=None):
        try:
            self.stop(self.args, task_vars)
        finally:
            self.board.post(self.me, state, msg)
        out = {"failed": True, "state": state, "msg": msg}
        out.update(extra or {})
        return out

    def run(self, task_vars):
        started = self.clock()
        deadline = started + int(self.args["timeout"])
        job = self.args.get("job")
        line = "%s: serving" % self.me
        next_look = started
        self.board.post(self.me, "running", line=line)
        while True:
            now = self.clock()
            if now >= next_look:
                status, progress = self.look(self.args, task_vars)
                next_look = now + self.interval
                if job:
                    line = progress_line(self.me, status, progress, self.args["run_id"])
                    self.show(line)
                    state = copy_state(status)
                    if state != "running":
                        msg = "the weight copy failed: %s" % ((status or {}).get("msg") or "no message") \
                            if state == "failed" else ""
                        self.board.post(self.me, state, msg, line=line)
                        out = dict((k, v) for k, v in (status or {}).items() if k not in _WRAPPER_KEYS)
                        out.update(state=state, progress=line)
                        if state == "failed":
                            out.update(failed=True, msg=msg)  # the gate names the host
                        return out
                self.board.post(self.me, "running", line=line)
            trouble = self.trouble(started, now)
            if trouble:
                return self._end_here(task_vars, "stopped", "stopped because %s" % "; ".join(
                    "%s %s" % t for t in trouble), {"stopped_because": [h for h, _r in trouble], "progress": line})
            if not job and self.others_done():
                self.board.post(self.me, "done", line=line)
                return {"state": "done", "progress": line}
            if now > deadline:
                return self._end_here(task_vars, "failed", "the weight copy did not end within %ss "
                                      "(npuops_weights_timeout); it was stopped" % self.args["timeout"],
                                      {"progress": line})
            self.sleep(1.0)
