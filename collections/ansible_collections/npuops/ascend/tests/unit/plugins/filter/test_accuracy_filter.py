# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.npuops.ascend.plugins.filter import accuracy as accuracy_filter


def result(correct, total=64, api_ok=True, wrong=None):
    return {"samples": {"total": total, "completed": total, "failed": 0, "missing": 0, "unparsed": total - correct,
                        "correct": correct, "wrong": 0, "score": round(100.0 * correct / total, 2)},
            "wrong": wrong or [], "api": [{"name": "n", "ok": api_ok, "detail": "n 2: 1 choice(s)"}]}


PLAN = {"instances": {"a": {"recipe": "kimi_k3_tutorial_4node_a3", "served_model_name": "kimi-k3"},
                      "b": {"recipe": "kimi_k3_tutorial_4node_a3", "served_model_name": "kimi-k3-v2"}}}


def test_the_golden_set_ships_64_items_with_exact_answers():
    items = accuracy_filter.accuracy_dataset("golden")
    assert len(items) >= 64 and len(set(i["id"] for i in items)) == len(items)
    assert all(i["question"] and str(i["answer"]).lstrip("-").isdigit() for i in items)


def test_an_instance_outside_its_baseline_is_named_with_dataset_score_and_baseline():
    v = accuracy_filter.accuracy_verdict({"a": result(64), "b": result(0, wrong=[
        {"id": "g01", "expected": "7118", "got": None}])}, PLAN)
    assert not v["ok"] and v["instances"]["a"]["ok"] and not v["instances"]["b"]["ok"]
    assert v["failures"] == ["instance b: golden score 0.00 is outside baseline 100.00 +- 5.00 (0 of 64 correct, 0 "
                             "failed, 0 missing, 64 unparsed); e.g. g01: expected 7118, got None"]
    assert v["instances"]["b"]["model"] == "kimi-k3-v2" and v["instances"]["b"]["baseline"] == 100.0
    # three wrong of 64 is inside 5 points
    assert accuracy_filter.accuracy_verdict({"a": result(61)}, PLAN)["ok"]


def test_baselines_per_recipe_over_the_default_and_api_failures_fail():
    over = {"kimi_k3_tutorial_4node_a3": {"golden": {"baseline": 50.0, "threshold": 2}}}
    v = accuracy_filter.accuracy_verdict({"a": result(32)}, PLAN, over)
    assert v["ok"] and v["instances"]["a"]["baseline"] == 50.0
    v = accuracy_filter.accuracy_verdict({"a": result(64, api_ok=False)}, PLAN)
    assert v["failures"] == ["instance a: API check n failed: n 2: 1 choice(s)"]
    v = accuracy_filter.accuracy_verdict({"a": {"failed": True, "msg": "timeout"}}, PLAN)
    assert v["failures"] == ["instance a: the golden set could not be asked: timeout"]


def suite_run(instance, score, correct, total=8, failed=False):
    run = {"item": [instance, {"name": "local", "tool": "lm_eval", "tasks": ["npuops_arith"]}], "changed": False}
    if failed:
        # as the role registers it (failed_when: false): not failed, but no tasks
        return dict(run, failed=False, msg="the dataset /srv/eval/arith.jsonl is not on this host")
    return dict(run, tasks={"npuops_arith": {"metric": "exact_match,last_number", "score": score, "samples": {
        "total": total, "completed": total, "failed": 0, "missing": 0, "unparsed": 0, "correct": correct,
        "wrong": total - correct, "score": score}}})


def test_standard_suites_are_judged_per_task_and_need_a_baseline():
    skipped = {"a": {"skipped": True}}
    v = accuracy_filter.accuracy_verdict(skipped, PLAN, suites=[suite_run("a", 100.0, 8)])
    assert v["failures"] == ["instance a: no baseline for dataset npuops_arith; add one to npuops_accuracy_baselines"]
    base = {"default": {"npuops_arith": {"baseline": 90.0, "threshold": 10.0}}}
    v = accuracy_filter.accuracy_verdict(skipped, PLAN, base, suites=[suite_run("a", 100.0, 8)])
    assert v["ok"] and v["instances"]["a"]["datasets"]["npuops_arith"]["score"] == 100.0
    assert v["lines"] == ["a: ok   npuops_arith 100.0/100 (baseline 90.0 +- 10.0; 8 of 8 correct, 0 failed, 0 missing, "
                          "0 unparsed)"]
    v = accuracy_filter.accuracy_verdict(skipped, PLAN, base, suites=[suite_run("a", 75.0, 6)])
    assert v["failures"] == ["instance a: npuops_arith score 75.00 is outside baseline 90.00 +- 10.00 (6 of 8 correct, "
                             "0 failed, 0 missing, 0 unparsed)"]
    v = accuracy_filter.accuracy_verdict(skipped, PLAN, base, suites=[suite_run("a", 0, 0, failed=True)])
    assert v["failures"] == ["instance a: suite local (lm_eval) could not run: the dataset /srv/eval/arith.jsonl is not "
                             "on this host"]


def test_api_checks_alone_judge_no_golden_score():
    """npuops_accuracy_checks: [api]: the probe asked no item (samples null), so there is no score to fail."""
    only_api = {"samples": None, "wrong": [], "api": [{"name": "n", "ok": True, "detail": "n 2: 2 choice(s)"}]}
    v = accuracy_filter.accuracy_verdict({"a": only_api}, PLAN)
    assert v["ok"] and v["instances"]["a"]["datasets"] == {} and v["failures"] == []
    v = accuracy_filter.accuracy_verdict({"a": dict(only_api, api=[{"name": "n", "ok": False, "detail": "1"}])}, PLAN)
    assert v["failures"] == ["instance a: API check n failed: 1"]


def test_a_verdict_is_recorded_only_when_the_answers_were_judged():
    """Wrong answers with every item answered are a verdict on the configuration (failed); a set that could not be
    asked, or too few items answered to tell, is no verdict (the configuration stays unmeasured), though the gate
    still fails it (a rolling update restores the instance)."""
    v = accuracy_filter.accuracy_verdict({"a": result(64), "b": result(0)}, PLAN)
    assert v["judged"] == ["a", "b"] and v["instances"]["a"]["summary"] == "golden 100.0 (baseline 100.0 +- 5.0)"
    half_unanswered = result(30)
    half_unanswered["samples"].update(failed=34, completed=30, unparsed=0)
    v = accuracy_filter.accuracy_verdict({"a": half_unanswered}, PLAN)
    assert not v["ok"] and v["judged"] == []
    assert "too many items got no answer to judge the answers" in v["failures"][0]
    mostly_wrong = result(10)
    mostly_wrong["samples"].update(failed=2, unparsed=52)  # even with the 2 unanswered right: 12 of 64
    v = accuracy_filter.accuracy_verdict({"a": mostly_wrong}, PLAN)
    assert v["judged"] == ["a"] and not v["instances"]["a"]["ok"]
    v = accuracy_filter.accuracy_verdict({"a": {"failed": True, "msg": "timeout"}}, PLAN)
    assert v["judged"] == [] and not v["ok"]
    v = accuracy_filter.accuracy_verdict({"a": result(64, api_ok=False)}, PLAN)
    assert v["judged"] == ["a"] and v["instances"]["a"]["summary"] == "API check n failed: n 2: 1 choice(s)"


def test_a_gate_that_cannot_read_its_baselines_fails_without_raising():
    v = accuracy_filter.accuracy_verdict({"a": result(64)}, PLAN, {"default": {"golden": {"baseline": "abc"}}})
    assert not v["ok"] and v["judged"] == []
    assert v["failures"][0].startswith("instance a: the baselines cannot be read (")
    assert "fix npuops_accuracy_baselines" in v["failures"][0]


def test_the_plan_refuses_baselines_and_suites_it_could_not_judge_naming_the_variable():
    assert accuracy_filter.baseline_problems({}) == []
    assert accuracy_filter.baseline_problems({"default": {"golden": {"baseline": 90, "threshold": 3}}}) == []
    assert accuracy_filter.baseline_problems({"default": {"golden": {"baseline": 90}}}) == []  # shipped threshold
    assert accuracy_filter.baseline_problems({"default": {"golden": {"baseline": "abc"}}}) == [
        "npuops_accuracy_baselines.default.golden.baseline must be a number of points (0 to 100), not 'abc'"]
    assert accuracy_filter.baseline_problems({"default": {"golden": {"baseline": 120, "threshold": -1}}}) == [
        "npuops_accuracy_baselines.default.golden.baseline is 120: it must be between 0 and 100 points",
        "npuops_accuracy_baselines.default.golden.threshold is -1: it must be between 0 and 100 points"]
    assert accuracy_filter.baseline_problems({"default": {"gpqa": {"baseline": 60, "treshold": 2}}}) == [
        "npuops_accuracy_baselines.default.gpqa.threshold must be a number of points (0 to 100), not None",
        "npuops_accuracy_baselines.default.gpqa has treshold, which is not baseline or threshold"]
    assert accuracy_filter.baseline_problems({"default": [1]}) == [
        "npuops_accuracy_baselines.default must map datasets to {baseline, threshold}, not [1]"]
    suite = {"name": "gpqa", "tool": "lm_eval", "tasks": ["gpqa_local"], "include_path": "/srv/eval"}
    assert accuracy_filter.baseline_problems({}, [suite]) == [
        "npuops_accuracy_suites[0]: task gpqa_local has no baseline: add npuops_accuracy_baselines.default.gpqa_local: "
        "{baseline: <points>, threshold: <points>}"]
    assert accuracy_filter.baseline_problems({"default": {"gpqa_local": {"baseline": 60, "threshold": 3}}},
                                             [suite]) == []
    assert accuracy_filter.baseline_problems({}, [{"tool": "aisbench", "tasks": "gpqa"}]) == [
        "npuops_accuracy_suites[0].tool is 'aisbench': the suites run with lm_eval",
        "npuops_accuracy_suites[0].tasks must be a list of lm-eval task names"]
