# -*- coding: utf-8 -*-
"""The weight copy watchers: many rounds in one task, progress of this run only, all or nothing."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.npuops.ascend.plugins.plugin_utils import weights_watch
from ansible_collections.npuops.ascend.plugins.plugin_utils.board import Board


class Clock(object):
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.now += s


def args(**kw):
    a = {"job": "j1", "dest": "/srv/m", "run_id": "run-2", "hosts": ["n1", "n2", "n3"], "receivers": ["n2", "n3"],
         "interval": 1, "timeout": 3600, "lost_after": 90}
    a.update(kw)
    return a


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def board(tmp_path, clock):
    return Board(str(tmp_path / "board"), clock=clock)


def progress(done, run_id="run-2", state="running"):
    return {"run_id": run_id, "state": state, "files_done": done // 100, "files_total": 9, "bytes_done": done * 10 ** 7,
            "bytes_total": 9 * 10 ** 9, "mb_per_s": 25.0, "eta_s": 900 - done}


def test_a_copy_of_more_than_300_rounds_is_followed_in_one_task_with_a_line_per_round(board, clock):
    rounds = {"n": 0}
    lines = []

    def look(a, tv):
        rounds["n"] += 1
        board.post("n1", "running")  # the other watchers are alive
        board.post("n3", "running")
        if rounds["n"] < 400:
            return {"finished": 0}, progress(rounds["n"])
        return {"finished": 1, "files_total": 9, "files_fetched": 9, "bytes_fetched": 9 * 10 ** 9}, progress(900, state="done")

    w = weights_watch.Watch("n2", args(), board, look, lambda a, tv: None, lines.append, clock=clock, sleep=clock.sleep)
    out = w.run({})
    assert rounds["n"] == 400 and len(lines) == 400
    assert lines[0] == "n2: 0/9 files, 0.0/9.0 GB, 25.0 MB/s, ETA 14m59s (running)"
    assert lines[-1].endswith("(done)") and "ETA -" in lines[-1]
    assert out["state"] == "done" and out["files_fetched"] == 9 and "failed" not in out
    assert board.read("n2")["state"] == "done"


def test_the_first_line_shows_no_earlier_run(board, clock):
    stale = progress(500, run_id="run-1", state="failed")
    line = weights_watch.progress_line("n2", {"finished": 0}, stale, "run-2")
    assert line == "n2: 0/? files, 0.0/0.0 GB, 0 MB/s, ETA - (starting)"


def test_a_host_that_fails_or_drops_out_stops_the_others_at_once(board, clock):
    stopped = []

    def look(a, tv):
        return {"finished": 0}, progress(10)

    board.post("n3", "unreachable", "Failed to connect to the host via ssh")
    w = weights_watch.Watch("n2", args(), board, look, lambda a, tv: stopped.append(a["run_id"]), lambda line: None,
                            clock=clock, sleep=clock.sleep)
    out = w.run({})
    assert stopped == ["run-2"] and out["failed"] and out["state"] == "stopped"
    assert out["stopped_because"] == ["n3"] and "n3 unreachable: Failed to connect" in out["msg"]
    assert board.read("n2")["state"] == "stopped"


def test_a_silent_watcher_counts_as_lost(board, clock):
    def look(a, tv):
        board.post("n1", "running")
        return {"finished": 0}, progress(10)

    board.post("n3", "running")
    w = weights_watch.Watch("n2", args(lost_after=30), board, look, lambda a, tv: None, lambda line: None,
                            clock=clock, sleep=clock.sleep)
    out = w.run({})
    assert out["stopped_because"] == ["n3"] and "no news for" in out["msg"] and clock.now - 1000 <= 32


def test_a_failed_copy_names_its_host_and_reason(board, clock):
    def look(a, tv):
        return {"finished": 1, "failed": True, "msg": "disk full while writing model-1"}, progress(10, state="failed")

    out = weights_watch.Watch("n2", args(), board, look, lambda a, tv: None, lambda line: None, clock=clock,
                              sleep=clock.sleep).run({})
    assert out["failed"] and out["msg"] == "the weight copy failed: disk full while writing model-1"
    assert board.read("n2")["state"] == "failed"


def test_a_host_that_only_serves_waits_for_the_receivers_and_the_timeout_bounds_all(board, clock):
    looks = []
    board.post("n2", "done")
    board.post("n3", "done")
    out = weights_watch.Watch("n1", args(job=None), board, lambda a, tv: looks.append(1) or (None, None),
                              lambda a, tv: None, lambda line: None, clock=clock, sleep=clock.sleep).run({})
    assert out == {"state": "done", "progress": "n1: serving"} and looks
    board.post("n2", "running")
    board.post("n3", "running")
    stopped = []

    def look(a, tv):
        board.post("n2", "running")
        board.post("n3", "running")
        return None, None

    out = weights_watch.Watch("n1", args(job=None, timeout=60), board, look, lambda a, tv: stopped.append(1),
                              lambda line: None, clock=clock, sleep=clock.sleep).run({})
    assert out["failed"] and "did not end within 60s" in out["msg"] and stopped == [1]
