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
    """{baseline, threshold} of a dataset for a recipe: the recipe's own, else the default's; None when neither."""
    for key in (recipe, "default"):
        entry = (table.get(key) or {}).get(dataset)
        if entry:
            return {"baseline": float(entry["baseline"]), "threshold": float(entry["threshold"])}
    return None


def _judge(name, dataset, samples, base, wrong=None):
    """-> (entry, problems) of one dataset's result on one instance."""
    score = samples.get("score")
    problems = []
    if base is None:
        problems.append("instance %s: no baseline for dataset %s; add one to npuops_accuracy_baselines" % (name, dataset))
    elif not accuracy.passes(score, base["baseline"], base["threshold"]):
        example = ("; e.g. %s: expected %s, got %s" % (wrong[0]["id"], wrong[0]["expected"], wrong[0]["got"])
                   if wrong else "")
        problems.append("instance %s: %s score %.2f is outside baseline %.2f +- %.2f (%d of %d correct, %d failed, %d "
                        "missing, %d unparsed)%s" % (name, dataset, score, base["baseline"], base["threshold"],
                                                     samples.get("correct", 0), samples.get("total", 0),
                                                     samples.get("failed", 0), samples.get("missing", 0),
                                                     samples.get("unparsed", 0), example))
    entry = {"ok": not problems, "score": score, "baseline": base and base["baseline"],
             "threshold": base and base["threshold"], "samples": samples}
    return entry, problems


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
    table = baselines(overrides)
    out, failures, lines = {}, [], []
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
        asked = "samples" not in res or res.get("samples") is not None  # None: the golden set was not asked
        if not res.get("skipped") and res:
            samples = res.get("samples") or {}
            if res.get("failed") or res.get("unreachable") or (asked and samples.get("score") is None):
                problems.append("instance %s: the golden set could not be asked: %s" % (name, res.get("msg") or
                                                                                        "no result"))
            elif asked:
                judged, p = _judge(name, "golden", samples, baseline_of(table, recipe, "golden"), res.get("wrong"))
                problems.extend(p)
                entry["datasets"]["golden"] = judged
                entry.update(dict(judged, dataset="golden"))
            entry["api_failed"] = [r.get("name") for r in res.get("api") or [] if not r.get("ok")]
            problems.extend("instance %s: API check %s failed: %s" % (name, r.get("name"), r.get("detail"))
                            for r in res.get("api") or [] if not r.get("ok"))
        for run in runs.get(name, []):
            suite = run["item"][1]
            # registered with failed_when: false, a run that failed has no tasks (its msg says why)
            if run.get("failed") or run.get("unreachable") or "tasks" not in run:
                problems.append("instance %s: suite %s (%s) could not run: %s" % (
                    name, suite.get("name") or ", ".join(suite.get("tasks") or []), suite.get("tool", "lm_eval"),
                    run.get("msg") or "no result"))
                continue
            for task, got in sorted((run.get("tasks") or {}).items()):
                judged, p = _judge(name, task, got["samples"], baseline_of(table, recipe, task))
                problems.extend(p)
                entry["datasets"][task] = dict(judged, metric=got.get("metric"))
        entry["ok"] = not problems
        failures.extend(problems)
        out[name] = entry
        for dataset, judged in sorted(entry["datasets"].items()):
            lines.append(_line(name, dataset, judged, entry["api_failed"] if dataset == "golden" else ()))
        if not entry["datasets"]:
            lines.append("%s: FAIL %s" % (name, "; ".join(problems) or "nothing measured"))
    return {"ok": not failures, "instances": out, "failures": failures, "lines": lines}


class FilterModule(object):
    def filters(self):
        return {"accuracy_dataset": accuracy_dataset, "accuracy_verdict": accuracy_verdict}
