# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.npuops.ascend.plugins.filter import bench

ROLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "roles", "defaults", "defaults", "main")


def matrices():
    with open(os.path.join(ROLE, "matrices.yml")) as f:
        return yaml.safe_load(f)["npuops_bench_matrices"]


def test_the_reference_matrix_has_the_published_points():
    points = bench.bench_points(matrices()["reference"], "reference")
    by_series = {}
    for p in points:
        by_series.setdefault(p["series"], []).append(p)
    random = by_series["random-2048x512"]
    assert [p["concurrency"] for p in random] == [1, 8, 32, 64]
    assert all(p["input_len"] == 2048 and p["output_len"] == 512 and p["ignore_eos"] for p in random)
    assert [p["concurrency"] for p in by_series["agentic-80k"]] == [1, 2, 4, 8]
    assert [p["concurrency"] for p in by_series["agentic-200k"]] == [1, 2, 4]
    assert all(p["turns"] == 13 and p["output_len"] == 220 for p in by_series["agentic-200k"])
    assert len(set(p["name"] for p in points)) == len(points) == 11
    assert [p["num_prompts"] for p in random] == [4, 32, 128, 256]
    assert [p["sessions"] for p in by_series["agentic-80k"]] == [2, 4, 6, 8]
    # the field report's request counts: 420 random, 260 at 80K, 156 at 200K
    requests = dict((s, sum(p["num_prompts"] if p["kind"] == "random" else p["sessions"] * p["turns"] for p in ps))
                    for s, ps in by_series.items())
    assert requests == {"random-2048x512": 420, "agentic-80k": 260, "agentic-200k": 156}


def test_series_that_cannot_fit_the_context_are_left_out_and_said_why():
    ref = matrices()["reference"]
    points = bench.bench_points(ref, "reference", 133120)  # kimi_k3_w4a8's max_model_len
    assert not [p for p in points if p["series"] == "agentic-200k"]
    assert [p for p in points if p["series"] == "agentic-80k"]
    dropped = bench.bench_dropped(ref, 133120)
    assert len(dropped) == 1 and dropped[0].startswith("agentic-200k needs 203120 tokens")
    assert bench.bench_dropped(ref, 210000) == []


@pytest.mark.parametrize("series,message", [
    ({"series": "x", "kind": "random", "input_len": 1, "output_len": 1, "concurrency": []}, "concurrency must be"),
    ({"series": "x", "kind": "zipf", "concurrency": [1]}, "kind must be random or multi_turn"),
    ({"series": "x y", "kind": "random", "concurrency": [1]}, "series must be a name"),
    ({"series": "x", "kind": "multi_turn", "turns": 0, "output_len": 1, "context_tokens": 1, "concurrency": [1]},
     "turns must be a positive integer"),
    ({"series": "x", "kind": "random", "input_len": 8, "output_len": 8, "concurrency": [1, 1]}, "x-c1 twice"),
])
def test_a_bad_series_is_refused_with_the_field(series, message):
    with pytest.raises(AnsibleFilterError, match=message):
        bench.bench_points([series], "mine")


def test_the_sim_matrix_is_small():
    points = bench.bench_points(matrices()["sim"], "sim")
    assert sum(p.get("num_prompts", 0) or p.get("sessions", 0) * p.get("turns", 0) for p in points) < 200


def test_printed_rows():
    assert bench.probe_row({"name": "chat", "ok": False, "latency_s": 0.5, "detail": "wrong"}).split() == [
        "chat", "FAIL", "0.500s", "wrong"]
    line = bench.bench_row({"series": "s", "concurrency": 8, "output_tok_s": 10.0, "total_tok_s": 20.0,
                            "per_user_tok_s": None, "ttft_p50_ms": 1.0, "ttft_p99_ms": 2.0,
                            "prefix_hit_rate": 0.5})
    assert "c=8" in line and "user - tok/s" in line and "hit 0.50" in line


def test_the_run_metadata_names_flags_graph_mode_prefix_caching_draft_and_the_planned_sessions():
    """What the tutorial asks to record with every result, read from what the plan renders; and the capacity plan's
    sessions per long context of the 2-node template (the field report: 200K at most 2, 80K at most 4)."""
    from ansible_collections.npuops.ascend.tests.unit.plugins.filter.helpers import inventory, rendered
    from ansible_collections.npuops.ascend.plugins.plugin_utils.model import serve, topology
    groups, hv = inventory(2)
    tier, model, opts = rendered("2node_pp", "kimi_k3_1_pro_w4a8")
    plan = topology.plan_topology(groups, hv, tier)
    containers = serve.serve_containers(plan, hv, tier, model, opts)
    meta = bench.bench_run_metadata(plan, containers, model, tier, matrices()["reference"], "3f2a9c")
    run = meta["run"]
    assert run["weights_revision"] == "3f2a9c" and run["draft"] == "none" and run["prefix_caching"] == "on"
    # the field report's command sets no --compilation-config: the image's own default runs
    assert run["graph_mode"] == "the image's default" and run["flags"].startswith("vllm serve ")
    assert meta["planned_concurrency"]["agentic-200k"].startswith("at most 2 sessions of 203120 tokens")
    assert meta["planned_concurrency"]["agentic-80k"].startswith("at most 5 sessions of 83120 tokens")


def test_a_count_per_point_must_have_one_value_per_concurrency():
    series = {"series": "x", "kind": "multi_turn", "turns": 2, "output_len": 4, "context_tokens": 100,
              "sessions": [2, 4], "concurrency": [1, 2, 4]}
    with pytest.raises(AnsibleFilterError, match="sessions has 2 values for 3 concurrencies"):
        bench.bench_points([series])


def test_the_report_names_the_flags_the_engines_ran_and_how_they_differ_from_the_plan():
    """After a rollout with max_num_seqs 32, a bench run without that override must report 32 (what the engines ran),
    not the plan's (the field report's 64), and say that the two differ."""
    from ansible_collections.npuops.ascend.tests.unit.plugins.filter.helpers import inventory, rendered
    from ansible_collections.npuops.ascend.plugins.plugin_utils.model import serve, topology
    groups, hv = inventory(2)
    tier, model, opts = rendered("2node_pp", "kimi_k3_1_pro_w4a8")
    plan = topology.plan_topology(groups, hv, tier)
    containers = serve.serve_containers(plan, hv, tier, model, opts)
    planned = containers["node01"]["engine"]["command"]
    ran = list(planned)
    ran[ran.index("--max-num-seqs") + 1] = "32"
    hv["node01"]["read"] = {"containers": {"vllm": {"exists": True, "running": True,
                                                    "spec": {"command": ran, "image": "x"}}}}
    meta = bench.bench_run_metadata(plan, containers, model, tier, [], "", hv, "read")
    assert " --max-num-seqs 32 " in meta["run"]["flags"] and " --max-num-seqs 64 " not in meta["run"]["flags"]
    assert meta["run"]["differs_from_plan"] == "--max-num-seqs 32 (the plan: 64)"
    # an engine that could not be read: the plan's flags, said so
    hv["node01"]["read"] = {"failed": True, "msg": "podman: timed out"}
    meta = bench.bench_run_metadata(plan, containers, model, tier, [], "", hv, "read")
    assert meta["run"]["flags"] == " ".join(planned)
    assert meta["run"]["flags_from"] == "the plan: the engine on node01 could not be read (podman: timed out)"
    ran, planned = ["vllm", "serve", "/m", "--a", "1", "--eager"], ["vllm", "serve", "/m", "--a", "2", "--b", "3"]
    assert bench.flag_differences(ran, planned) == [
        "--a 1 (the plan: 2)", "--eager set (the plan: absent)", "--b absent (the plan: 3)"]
