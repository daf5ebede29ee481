# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy
import json
import os

import pytest

from ansible_collections.npuops.ascend.plugins.module_utils import bench
from ansible_collections.npuops.ascend.plugins.plugin_utils import report
from ansible_collections.npuops.ascend.tests.unit.plugins.module_utils.bench_helpers import FakeEndpoint

pytest.importorskip("matplotlib")


def multi_turn_result(name, concurrency, fail_calls=()):
    point = {"name": name, "series": "agentic", "kind": "multi_turn", "concurrency": concurrency,
             "sessions": concurrency, "turns": 3, "output_len": 4, "context_tokens": 20}
    result = bench.multi_turn(FakeEndpoint(fail_calls), "m", point)
    result["npuops"] = {"point": point, "planned": bench.planned(point), "prefix_cache_hit_rate": 0.8}
    return result


def random_result(name, concurrency, n):
    """A result shaped like vllm bench serve --save-result --save-detailed."""
    point = {"name": name, "series": "random", "kind": "random", "concurrency": concurrency, "num_prompts": n,
             "input_len": 16, "output_len": 4}
    result = {"num_prompts": n, "max_concurrency": concurrency, "completed": n, "failed": 0, "duration": 1.0,
              "output_throughput": 4.0 * n, "total_token_throughput": 20.0 * n, "input_lens": [16] * n,
              "output_lens": [4] * n, "ttfts": [0.01] * n, "itls": [[0.002] * 3] * n, "latencies": [0.02] * n,
              "errors": [""] * n}
    result.update(bench.summarize([10.0] * n, [2.0 + concurrency] * n, [2.0] * n, [20.0] * n))
    result["npuops"] = {"point": point, "planned": bench.planned(point), "prefix_cache_hit_rate": None}
    return result


@pytest.fixture(name="results")
def results_fixture():
    return [random_result("random-c1", 1, 4), random_result("random-c4", 4, 8),
            multi_turn_result("agentic-c1", 1), multi_turn_result("agentic-c2", 2)]


def test_a_consistent_run_adds_up_and_is_drawn(tmp_path, results):
    summary = report.write(str(tmp_path / "r"), results, {"model": "m", "tier": "t", "matrix": "sim"})
    assert summary["adds_up"] and summary["ok"] and summary["failed_requests"] == 0
    assert [r["point"] for r in summary["table"]] == ["random-c1", "random-c4", "agentic-c1", "agentic-c2"]
    assert summary["table"][1]["per_user_tok_s"] == pytest.approx(1000 / 6.0, abs=0.1)
    text = open(summary["report"]).read()
    assert "## random (random)" in text and "## agentic (multi_turn)" in text and "adds up" in text
    for png in report.PLOTS:
        with open(str(tmp_path / "r" / png), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    rows = [json.loads(line) for line in open(str(tmp_path / "r" / "requests.jsonl"))]
    assert len(rows) == 4 + 8 + 3 + 6
    assert report.render(str(tmp_path / "r"))["adds_up"]  # a saved report checks again


def test_failed_requests_are_counted_not_a_mismatch(tmp_path, results):
    results[3] = multi_turn_result("agentic-c2", 2, fail_calls={1})
    summary = report.write(str(tmp_path / "r"), results, {})
    assert summary["adds_up"] and not summary["ok"] and summary["failed_requests"] == 1
    row = [r for r in summary["reconciliation"] if r["point"] == "agentic-c2"][0]
    assert row["failed_sessions"] == 1 and row["skipped"] == 2 and row["sent"] == 4


@pytest.mark.parametrize("damage,problem", [
    (lambda r: r.update(completed=r["completed"] + 1), "succeeded +"),
    (lambda r: r["errors"].pop(), "requests.jsonl has"),
    (lambda r: r.update(num_prompts=r["num_prompts"] - 1), "the run was for"),
    (lambda r: r["npuops"]["planned"].update(requests=99), "planned 99 requests"),
    (lambda r: r.update(completed_sessions=0), "sessions"),
    (lambda r: r["errors"].__setitem__(0, "boom"), "carry an error"),
])
def test_a_damaged_saved_result_does_not_add_up(tmp_path, results, damage, problem):
    report.write(str(tmp_path / "r"), results, {})
    path = str(tmp_path / "r" / "raw" / "03-agentic-c2.json")
    data = json.load(open(path))
    damage(data)
    json.dump(data, open(path, "w"))
    summary = report.render(str(tmp_path / "r"))
    assert not summary["adds_up"]
    bad = [r for r in summary["reconciliation"] if r["problems"]]
    assert [r["point"] for r in bad] == ["agentic-c2"]
    assert any(problem in p for p in bad[0]["problems"]), bad[0]["problems"]


def test_truncated_files_are_named(tmp_path, results):
    report.write(str(tmp_path / "r"), results, {})
    with open(str(tmp_path / "r" / "raw" / "01-random-c4.json"), "w") as f:
        f.write('{"completed": ')
    with pytest.raises(report.ReportError, match="raw/01-random-c4.json is not valid JSON"):
        report.render(str(tmp_path / "r"))
    with pytest.raises(report.ReportError, match="already holds a report"):
        report.write(str(tmp_path / "r"), results, {})
    with pytest.raises(report.ReportError, match="not a report directory"):
        report.render(str(tmp_path))


def test_request_rows_for_a_point_missing_from_the_results_are_flagged(tmp_path, results):
    report.write(str(tmp_path / "r"), results, {})
    os.unlink(str(tmp_path / "r" / "raw" / "00-random-c1.json"))
    summary = report.render(str(tmp_path / "r"))
    assert not summary["adds_up"]
    assert any("no result" in p for r in summary["reconciliation"] for p in r["problems"])
    assert copy.deepcopy(summary["meta"]) == {}


@pytest.mark.parametrize("speeds, expected", [
    # the field report's per-user speeds (1000 / TPOT P50): random 2048/512, agentic 80K and 200K
    ({1: 20.5, 8: 8.9, 32: 6.9, 64: 5.1}, 32),
    ({1: 17.4, 2: 8.5, 4: 7.3, 8: 1.7}, 4),
    ({1: 17.0, 2: 8.4, 4: 2.9}, 2),
    ({1: None, 2: None}, None),
])
def test_the_knee_is_the_last_point_within_a_quarter_of_the_best_per_user_speed(speeds, expected):
    rows = [{"concurrency": c, "per_user_tok_s": v} for c, v in speeds.items()]
    assert report.knee(rows) == expected
