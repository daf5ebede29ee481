# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import pytest

from ansible_collections.npuops.ascend.plugins.plugin_utils.board import Board, board_dir


def test_hosts_see_each_others_failures_but_not_their_own(tmp_path):
    now = [100.0]
    a, b = Board(str(tmp_path / "b"), clock=lambda: now[0]), Board(str(tmp_path / "b"), clock=lambda: now[0])
    a.post("node01", "waiting")
    b.post("node02", "waiting")
    assert a.failures(["node01", "node02"], me="node01") == []
    b.post("node02", "failed", "vllm: exited with code 1")
    assert a.failures(["node01", "node02"], me="node01") == [("node02", "failed", "vllm: exited with code 1")]
    assert b.failures(["node01", "node02"], me="node02") == []
    b.post("node03", "unreachable", "ssh timed out")
    assert [f[0] for f in a.failures(["node01", "node02", "node03"], me="node01")] == ["node02", "node03"]
    assert oct(os.stat(str(tmp_path / "b")).st_mode & 0o777) == "0o700"


def test_a_host_that_stops_posting_counts_as_failed_only_when_asked(tmp_path):
    now = [100.0]
    board = Board(str(tmp_path), clock=lambda: now[0])
    board.post("node04", "waiting")
    now[0] = 200.0
    assert board.failures(["node04"], me="node01") == []
    assert board.failures(["node04"], me="node01", stale_after=60)[0][:2] == ("node04", "silent")
    board.post("node04", "ready")
    assert board.failures(["node04"], me="node01", stale_after=60) == []


def test_run_ids_keep_runs_apart_and_cannot_climb_out(tmp_path):
    assert board_dir("abc123", str(tmp_path)) != board_dir("abc124", str(tmp_path))
    with pytest.raises(ValueError):
        board_dir("../../etc", str(tmp_path))
