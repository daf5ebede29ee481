# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The accuracy stage's data and judgement: the golden set and the baselines (``data/accuracy``), and the verdict
on every instance's score with vLLM-Ascend's pass rule. Pure functions; the accuracy role runs the probes."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleFilterError

from ansible_collections.npuops.ascend.plugins.module_utils import accuracy
from ansible_collections.npuops.ascend.plugins.plugin_utils import catalog
from ansible_collections.npuops.ascend.plugins.plugin_utils.recipes import deep_merge


def accuracy_dataset(name):
    """The items of a dataset shipped with the collection (``data/accuracy/<name>.yml``)."""
    try:
        return list(catalog.load("accuracy/" + name)["items"])
    except (OSError, IOError) as e:
        raise AnsibleFilterError("accuracy_dataset: no dataset %r in the collection's data/accuracy (%s)" % (name, e))


def baselines(overrides=None):
    """The baselines document with the inventory's overrides (npuops_accuracy_baselines) merged key by key."""
    return deep_merge(catalog.load("accuracy/baselines")["baselines"], overrides or {})


def baseline_of(table, recipe, dataset):
    """{baseline, threshold} of a dataset for a recipe: the recipe's own, else the default's; None when neither.
    Raises ValueError for an entry that is not two numbers (the plan refuses such baselines first:
    baseline_problems)."""
    for key in (recipe, "default"):
        entry = (table.get(key) or {}).get(dataset)
        if entry:
            return {"baseline": float(entry["baseline"]), "threshold": float(entry["threshold"])}
    return None


def baseline_problems(overrides, suites=None):
    """What is wrong with npuops_accuracy_baselines (and the suites that need them), each naming the variable: the
    plan refuses them before anything changes, so a gate never finds out after a drain that it cannot judge."""
    problems = []
    if not isinstance(overrides or {}, dict):
        return ["npuops_accuracy_baselines must be a mapping {<recipe or default>: {<dataset>: {baseline, "
                "threshold}}}, not %s" % type(overrides).__name__]
    for key, datasets in sorted((overrides or {}).items()):
        where = "npuops_accuracy_baselines.%s" % key
        if not isinstance(datasets, dict):
            problems.append("%s must map datasets to {baseline, threshold}, not %r" % (where, datasets))
            continue
        for dataset, entry in sorted(datasets.items()):
            at = "%s.%s" % (where, dataset)
            if not isinstance(entry, dict):
                problems.append("%s must be {baseline: <points 0-100>, threshold: <points>}, not %r" % (at, entry))
                continue
            for field, low, high in (("baseline", 0.0, 100.0), ("threshold", 0.0, 100.0)):
                value = entry.get(field)
                if value is None and field == "threshold" and dataset in (baselines().get("default") or {}):
                    continue  # the shipped threshold of the dataset applies
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    problems.append("%s.%s must be a number of points (%g to %g), not %r" % (at, field, low, high,
                                                                                             value))
                elif not low <= float(value) <= high:
                    problems.append("%s.%s is %g: it must be between %g and %g points" % (at, field, value, low, high))
            unknown = sorted(set(entry) - {"baseline", "threshold"})
            if unknown:
                problems.append("%s has %s, which is not baseline or threshold" % (at, ", ".join(unknown)))
    table = deep_merge(catalog.load("accuracy/baselines")["baselines"], overrides or {}) if not problems else {}
    for i, suite in enumerate(suites or []):
        where = "npuops_accuracy_suites[%d]" % i
        if not isinstance(suite, dict):
            problems.append("%s must be {name, tool: lm_eval, tasks, include_path, limit}, not %r" % (where, suite))
            continue
        if suite.get("tool", "lm_eval") != "lm_eval":
            problems.append("%s.tool is %r: the suites run with lm_eval" % (where, suite.get("tool")))
        tasks = suite.get("tasks")
        if not tasks or not isinstance(tasks, list):
            problems.append("%s.tasks must be a list of lm-eval task names" % where)
            continue
        if not suite.get("include_path"):
            problems.append("%s.include_path must name the directory of its local task files (nothing is "
                            "downloaded at run time)" % where)
        for task in tasks:
            if table and not any((table.get(key) or {}).get(task) for key in table):
                problems.append("%s: task %s has no baseline: add npuops_accuracy_baselines.default.%s: {baseline: "
                                "<points>, threshold: <points>}" % (where, task, task))
    return problems


def _judge(name, dataset, samples, base, wrong=None):
    """-> (entry, problems, judged) of one dataset's result on one instance. A score outside the baseline is judged
    only when it would be outside even with every unanswered item (failed or missing) right: otherwise the gate could
    not judge the answers (a problem, but no verdict on the configuration)."""
    score = samples.get("score")
    problems = []
    judged = True
    if base is None:
        problems.append("instance %s: no baseline for dataset %s; add one to npuops_accuracy_baselines" % (name, dataset))
        judged = False
    elif not accuracy.passes(score, base["baseline"], base["threshold"]):
        example = ("; e.g. %s: expected %s, got %s" % (wrong[0]["id"], wrong[0]["expected"], wrong[0]["got"])
                   if wrong else "")
        unanswered = samples.get("failed", 0) + samples.get("missing", 0)
        total = samples.get("total", 0)
        best = 100.0 * (samples.get("correct", 0) + unanswered) / total if total else 0.0
        judged = not unanswered or not accuracy.passes(best, base["baseline"], base["threshold"])
        problems.append("instance %s: %s score %.2f is outside baseline %.2f +- %.2f (%d of %d correct, %d failed, %d "
                        "missing, %d unparsed)%s%s" % (
                            name, dataset, score, base["baseline"], base["threshold"], samples.get("correct", 0), total,
                            samples.get("failed", 0), samples.get("missing", 0), samples.get("unparsed", 0), example,
                            "" if judged else "; too many items got no answer to judge the answers"))
    entry = {"ok": not problems, "score": score, "baseline": base and base["baseline"],
             "threshold": base and base["threshold"], "samples": samples}
    return entry, problems, judged


def _line(name, dataset, entry, api_failed=()):
    s = entry["samples"]
    return "%s: %s %s %s/100 (baseline %s +- %s; %s of %s correct, %s failed, %s missing, %s unparsed)%s" % (
        name, "ok  " if entry["ok"] else "FAIL", dataset, entry["score"], entry["baseline"], entry["threshold"],
        s.get("correct"), s.get("total"), s.get("failed"), s.get("missing"), s.get("unparsed"),
        "; API: %s" % ", ".join(api_failed) if api_failed else "")


def accuracy_verdict(results, plan, overrides=None, suites=None):
    """-> {ok, instances: {name: {ok, model, api_failed, datasets: {dataset: {ok, score, baseline, threshold,
    samples}}, and the golden set's dataset, score, baseline, threshold and samples}}, failures, lines}.

    `results`: {instance: accuracy_probe's result (skipped when the golden set was not asked)}; `suites`: the
    accuracy_suite runs (each with its loop item [instance, suite] and the tasks' scores). Every dataset is judged
    with vLLM-Ascend's rule against its baseline (the recipe's, else the default's; a standard suite needs one in
    npuops_accuracy_baselines); an instance fails when a score is outside or an API check failed. Each failure
    names the instance, the dataset, the score and the baseline."""
    out, failures, lines, judged_names = {}, [], [], []
    try:
        table = baselines(overrides)
        for key, datasets in table.items():
            for dataset in datasets or {}:
                baseline_of(table, key, dataset)
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        # a gate that cannot judge fails like one that judged wrong (a rolling update restores the instance)
        why = "the baselines cannot be read (%s): fix npuops_accuracy_baselines" % e
        for name in sorted(set(results or {}) | set(r.get("item", [None])[0] for r in suites or [] if r.get("item"))):
            out[name] = {"ok": False, "datasets": {}, "api_failed": [], "summary": why, "judged": False}
            failures.append("instance %s: %s" % (name, why))
            lines.append("%s: FAIL %s" % (name, why))
        return {"ok": False, "instances": out, "failures": failures, "lines": lines, "judged": []}
    runs = {}
    for run in suites or []:
        if run.get("skipped"):
            continue
        run = dict(run, item=run[run.get("ansible_loop_var") or "item"])
        runs.setdefault(run["item"][0], []).append(run)
    for name in sorted(set(results) | set(runs)):
        res = (results or {}).get(name) or {}
        inst = (plan.get("instances") or {}).get(name) or {}
        recipe = inst.get("recipe")
        entry = {"model": inst.get("served_model_name"), "datasets": {}, "api_failed": []}
        problems = []
        # a verdict on the configuration: a wrong API answer or a score outside its baseline with enough answered
        # (failed); every check judged and passed (passed). A set that could not be asked is no verdict.
        wrong, unjudged, measured = False, False, False
        asked = "samples" not in res or res.get("samples") is not None  # None: the golden set was not asked
        if not res.get("skipped") and res:
            samples = res.get("samples") or {}
            if res.get("failed") or res.get("unreachable") or (asked and samples.get("score") is None):
                problems.append("instance %s: the golden set could not be asked: %s" % (name, res.get("msg") or
                                                                                        "no result"))
                unjudged = True
            elif asked:
                result, p, ok = _judge(name, "golden", samples, baseline_of(table, recipe, "golden"), res.get("wrong"))
                problems.extend(p)
                wrong, unjudged, measured = wrong or (bool(p) and ok), unjudged or not ok, True
                entry["datasets"]["golden"] = result
                entry.update(dict(result, dataset="golden"))
            entry["api_failed"] = [r.get("name") for r in res.get("api") or [] if not r.get("ok")]
            wrong, measured = wrong or bool(entry["api_failed"]), measured or bool(res.get("api"))
            problems.extend("instance %s: API check %s failed: %s" % (name, r.get("name"), r.get("detail"))
                            for r in res.get("api") or [] if not r.get("ok"))
        for run in runs.get(name, []):
            suite = run["item"][1]
            # registered with failed_when: false, a run that failed has no tasks (its msg says why)
            if run.get("failed") or run.get("unreachable") or "tasks" not in run:
                problems.append("instance %s: suite %s (%s) could not run: %s" % (
                    name, suite.get("name") or ", ".join(suite.get("tasks") or []), suite.get("tool", "lm_eval"),
                    run.get("msg") or "no result"))
                unjudged = True
                continue
            for task, got in sorted((run.get("tasks") or {}).items()):
                result, p, ok = _judge(name, task, got["samples"], baseline_of(table, recipe, task))
                problems.extend(p)
                wrong, unjudged, measured = wrong or (bool(p) and ok), unjudged or not ok, True
                entry["datasets"][task] = dict(result, metric=got.get("metric"))
        api_failed = bool(entry["api_failed"])
        entry["judged"] = wrong or (measured and not unjudged)
        entry["ok"] = not problems
        entry["summary"] = "; ".join(
            ["%s %s (baseline %s +- %s)" % (d, v["score"], v["baseline"], v["threshold"])
             for d, v in sorted(entry["datasets"].items())] + (["API: %s failed" % ", ".join(entry["api_failed"])]
                                                               if api_failed else [])) if entry["ok"] else \
            "; ".join(p.split(": ", 1)[-1] for p in problems)
        if entry["judged"]:
            judged_names.append(name)
        failures.extend(problems)
        out[name] = entry
        for dataset, result in sorted(entry["datasets"].items()):
            lines.append(_line(name, dataset, result, entry["api_failed"] if dataset == "golden" else ()))
        if not entry["datasets"]:
            lines.append("%s: FAIL %s" % (name, "; ".join(problems) or "nothing measured"))
    return {"ok": not failures, "instances": out, "failures": failures, "lines": lines, "judged": judged_names}


class FilterModule(object):
    def filters(self):
        return {"accuracy_dataset": accuracy_dataset, "accuracy_verdict": accuracy_verdict,
                "accuracy_baseline_problems": baseline_problems}
