# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""After the deploy: the load matrices, and the lines validate and bench print.

Load matrices are data: a list of series, each one kind of load at several concurrencies. bench_points
turns a matrix into the points vllm_bench runs, one per series and concurrency."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import re

from ansible.errors import AnsibleFilterError

from ansible_collections.npuops.ascend.plugins.module_utils import container
from ansible_collections.npuops.ascend.plugins.plugin_utils import results

SERIES_KEYS = {"random": ("input_len", "output_len"), "multi_turn": ("turns", "output_len", "context_tokens")}


def _positive(series, key, where):
    value = series.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise AnsibleFilterError("bench_points: %s: %s must be a positive integer, not %r" % (where, key, value))
    return value


def _per_point(series, key, index, levels, where):
    """A count given per point: one number for every point, or a list with one per concurrency."""
    value = series.get(key)
    if isinstance(value, list):
        if len(value) != len(levels):
            raise AnsibleFilterError("bench_points: %s: %s has %d values for %d concurrencies" % (
                where, key, len(value), len(levels)))
        return _positive({key: value[index]}, key, where)
    return _positive(series, key, where)


def context_needed(series):
    """Tokens the longest request of a series holds (prompt + output), to compare with max_model_len."""
    if series.get("kind") == "multi_turn":
        # the private context, then every turn's question (~20 tokens) and answer
        return int(series.get("context_tokens") or 0) + int(series.get("turns") or 0) * (
            int(series.get("output_len") or 0) + 20)
    return int(series.get("input_len") or 0) + int(series.get("output_len") or 0)


def bench_dropped(matrix, max_model_len):
    """Series whose requests do not fit the served max_model_len, with the reason."""
    return ["%s needs %d tokens of context, the service allows %d (max_model_len)"
            % (s.get("series"), context_needed(s), int(max_model_len))
            for s in matrix or [] if isinstance(s, dict) and context_needed(s) > int(max_model_len)]


def bench_points(matrix, name="matrix", max_model_len=None):
    """[{series, kind, concurrency: [..], ...}] -> [{name: <series>-c<N>, series, kind, concurrency, ...}].

    random: num_prompts (one number, or a list with one per concurrency), or max(min_prompts,
    prompts_per_concurrency * concurrency) (defaults 4 and 8), so every point runs long enough to reach steady
    state. multi_turn: sessions (one number or a list), or sessions_per_concurrency * concurrency (default 1), each
    session `turns` long. With max_model_len, series that cannot fit are
    left out (bench_dropped says which and why)."""
    if not isinstance(matrix, list) or not matrix:
        raise AnsibleFilterError("bench_points: the %s matrix must be a non-empty list of series" % name)
    points = []
    for i, series in enumerate(matrix):
        if max_model_len and isinstance(series, dict) and context_needed(series) > int(max_model_len):
            continue  # reported by bench_dropped
        label = series.get("series") if isinstance(series, dict) else None
        where = "%s[%d] (%s)" % (name, i, label or "no series name")
        if not label or not re.match(r"^[A-Za-z0-9_.-]+$", str(label)):
            raise AnsibleFilterError("bench_points: %s: series must be a name of letters, digits, '.', '_', '-'"
                                     % where)
        kind = series.get("kind")
        if kind not in SERIES_KEYS:
            raise AnsibleFilterError("bench_points: %s: kind must be random or multi_turn, not %r" % (where, kind))
        fields = dict((k, _positive(series, k, where)) for k in SERIES_KEYS[kind])
        levels = series.get("concurrency")
        if not isinstance(levels, list) or not levels:
            raise AnsibleFilterError("bench_points: %s: concurrency must be a list such as [1, 8, 32, 64]" % where)
        for index, level in enumerate(levels):
            conc = _positive({"concurrency": level}, "concurrency", where)
            point = dict(fields, name="%s-c%d" % (label, conc), series=label, kind=kind, concurrency=conc)
            if kind == "random":
                point["ignore_eos"] = bool(series.get("ignore_eos", True))
                point["num_prompts"] = _per_point(series, "num_prompts", index, levels, where) \
                    if "num_prompts" in series else max(int(series.get("min_prompts", 4)),
                                                        int(series.get("prompts_per_concurrency", 8)) * conc)
            else:
                point["sessions"] = _per_point(series, "sessions", index, levels, where) if "sessions" in series \
                    else int(series.get("sessions_per_concurrency", 1)) * conc
            points.append(point)
    names = [p["name"] for p in points]
    twice = sorted(set(n for n in names if names.count(n) > 1))
    if twice:
        raise AnsibleFilterError("bench_points: %s has the point(s) %s twice (a series name or a concurrency is "
                                 "repeated)" % (name, ", ".join(twice)))
    return points


def _flag_shown(value):
    return "absent" if value is None else ("set" if value is True else value)


def flag_differences(ran, planned):
    """The flags on which two vllm serve argvs differ: ["--max-num-seqs 32 (the plan: 16)", ...], in argv order."""
    head_ran, ran_flags = container.argv_flags(ran)
    head_plan, plan_flags = container.argv_flags(planned)
    out = [] if head_ran == head_plan else ["%s (the plan: %s)" % (head_ran, head_plan)]
    for flag in list(ran_flags) + [f for f in plan_flags if f not in ran_flags]:
        a, b = ran_flags.get(flag), plan_flags.get(flag)
        if a != b:
            out.append("%s %s (the plan: %s)" % (flag, _flag_shown(a), _flag_shown(b)))
    return out


def bench_run_metadata(plan, containers, model_spec, tier, matrix=None, revision="", hostvars=None, key=None):
    """What a benchmark ran on, as the Kimi-K3 tutorial's section 6 asks to record it: per instance the flags its
    engines ran (the first engine's argv, read from its running container - vllm_container_info registered as `key` -
    else the plan's, said so), graph mode, prefix caching and draft, and how the running flags differ from the plan's;
    the weights revision; and, per multi-turn series of the matrix, how many sessions of its longest context the
    capacity plan says fit the KV cache (to read beside the measured knee). -> {run, planned_concurrency}."""
    from ansible_collections.npuops.ascend.plugins.filter.capacity import capacity_plan
    run = {"weights_revision": revision or "not pinned (npuops_weights_revision)"}
    for name, inst in sorted(plan["instances"].items()):
        host = inst["hosts"][0]
        engine = (containers.get(host) or {}).get("engine") or {}
        planned = engine.get("command") or []
        prefix = "" if len(plan["instances"]) == 1 else "instance %s " % name
        argv = planned
        if key:
            result = results.registered(hostvars, host, key)
            found = ((result if isinstance(result, dict) else {}).get("containers") or {}).get(engine.get("name")) or {}
            ran = (found.get("spec") or {}).get("command") if found.get("running") else None
            if ran:
                argv = ran
                differences = flag_differences(ran, planned)
                if differences:
                    run[prefix + "differs_from_plan"] = "; ".join(differences)
            else:
                run[prefix + "flags_from"] = "the plan: the engine on %s could not be read (%s)" % (host, (
                    (result or {}).get("msg") if isinstance(result, dict) else None) or "not running")
        compilation = json.loads((container.flag_words(argv, "--compilation-config") or ["{}"])[0])
        speculative = json.loads((container.flag_words(argv, "--speculative-config") or ["null"])[0])
        run[prefix + "flags"] = " ".join(str(a) for a in argv)
        default_mode = "eager" if "--enforce-eager" in argv else "the image's default"
        run[prefix + "graph_mode"] = compilation.get("cudagraph_mode") or default_mode
        run[prefix + "prefix_caching"] = "off" if "--no-enable-prefix-caching" in argv else "on"
        run[prefix + "draft"] = "none"
        if speculative:
            run[prefix + "draft"] = "%s, %s speculative tokens" % (
                speculative.get("model"), speculative.get("num_speculative_tokens"))
    planned = {}
    group = (tier.get("groups") or [{}])[0]
    for series in matrix or []:
        if not isinstance(series, dict) or series.get("kind") != "multi_turn":
            continue
        context = context_needed(series)
        estimate = capacity_plan(model_spec, group, contexts=[context])
        planned[series.get("series")] = "at most %d sessions of %d tokens fit its KV cache of %d tokens" % (
            estimate["sequences_at"][context], context, estimate["kv_tokens"] * int(group.get("dp", 1)))
    return {"run": run, "planned_concurrency": planned}


def probe_row(check):
    """One openai_probe row as a line of the validate table."""
    return "%-12s %-4s %7.3fs  %s" % (check.get("name"), "ok" if check.get("ok") else "FAIL",
                                      float(check.get("latency_s") or 0.0), check.get("detail"))


def bench_row(row):
    """One bench_report table row as a line of the play's output."""
    def num(key, fmt):
        return fmt % row[key] if row.get(key) is not None else "-"
    line = "%-24s c=%-3s out %s tok/s  total %s tok/s  user %s tok/s  TTFT p50/p99 %s/%s ms  hit %s" % (
        row.get("series"), row.get("concurrency"), num("output_tok_s", "%.1f"), num("total_tok_s", "%.1f"),
        num("per_user_tok_s", "%.1f"), num("ttft_p50_ms", "%.0f"), num("ttft_p99_ms", "%.0f"),
        num("prefix_hit_rate", "%.2f"))
    if row.get("draft_acceptance_rate") is not None:
        line += "  draft acceptance %s, mean length %s" % (
            num("draft_acceptance_rate", "%.2f"), num("mean_acceptance_length", "%.2f"))
    if "ratio_output_tok_s" in row:
        # a row of bench_report's comparison: this run against the baseline's same point
        line += "  vs baseline: out x%s, TPOT p50 x%s" % (num("ratio_output_tok_s", "%.2f"), num("ratio_tpot_p50_ms", "%.2f"))
    return line


class FilterModule(object):
    def filters(self):
        return {"bench_points": bench_points, "bench_dropped": bench_dropped, "probe_row": probe_row,
                "bench_row": bench_row, "bench_run_metadata": bench_run_metadata}
