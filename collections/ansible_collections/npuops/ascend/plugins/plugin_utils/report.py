# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The benchmark report, on the controller: raw results in, a directory people and tools can read out.

Layout of a report directory::

    meta.json            endpoint, model, tier, recipe, image (and what each node's image holds), matrix name, when
    raw/NN-<point>.json  each point's result as vllm bench serve saved it (plus npuops.planned/hit rate)
    requests.jsonl       one line per request of every point
    report.md            a table per series, the reconciliation, the plots
    *.png                throughput vs concurrency, per-user vs total throughput, latency percentiles
    summary.json         the table rows and the reconciliation, for tools

``render`` only reads ``raw/`` and ``requests.jsonl``, so a saved directory can be re-checked and re-drawn;
the reconciliation compares the two, so an edited or truncated file is caught.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    HAS_MATPLOTLIB = True
except ImportError:  # pragma: no cover - reported by the action plugin
    plt = None
    HAS_MATPLOTLIB = False


class ReportError(Exception):
    pass


PLOTS = ("throughput_vs_concurrency.png", "per_user_vs_total.png", "latency_percentiles.png")


def _point(result):
    return (result.get("npuops") or {}).get("point") or {}


def _latency(result, at):
    """A request's latency: `latencies` where the bench writes it (vLLM 0.32), else TTFT plus its ITLs, which is
    the same number (a request's latency ends at its last token chunk: vllm/benchmarks/lib/endpoint_request_func.py);
    vLLM 0.23 and 0.27 save no `latencies` (vllm/benchmarks/serve.py)."""
    if "latencies" in result:
        return at("latencies")
    if at("errors") or at("ttfts") is None:
        return None
    return at("ttfts") + sum(at("itls") or [])


def request_rows(result):
    """Per-request rows from a detailed result (vllm bench serve --save-detailed lists, index-aligned)."""
    point = _point(result)
    n = len(result.get("errors") or [])
    rows = []
    for i in range(n):
        def at(key, default=None):
            values = result.get(key) or []
            return values[i] if i < len(values) else default
        error = at("errors") or ""
        rows.append({"point": point.get("name"), "series": point.get("series"), "index": i,
                     "session": at("sessions_of"), "turn": at("turns_of"), "success": not error,
                     "input_len": at("input_lens"), "output_len": at("output_lens"), "ttft_s": at("ttfts"),
                     "latency_s": _latency(result, at), "itl_count": len(at("itls") or []), "error": error})
    return rows


def reconcile(result, rows):
    """-> {point, planned_requests, sent, succeeded, failed, skipped, sessions..., problems: [..]}."""
    point = _point(result)
    name = point.get("name") or "?"
    planned = (result.get("npuops") or {}).get("planned") or {}
    mine = [r for r in rows if r["point"] == name]
    sent = len(result.get("errors") or [])
    skipped = int(result.get("skipped") or 0)
    out = {"point": name, "planned_requests": planned.get("requests"), "sent": sent,
           "succeeded": result.get("completed"), "failed": result.get("failed"), "skipped": skipped,
           "planned_sessions": planned.get("sessions"), "completed_sessions": result.get("completed_sessions"),
           "failed_sessions": result.get("failed_sessions"), "problems": []}
    problems = out["problems"]
    if planned.get("requests") is None:
        problems.append("no planned request count (npuops.planned is missing)")
    elif planned["requests"] != sent + skipped:
        problems.append("planned %s requests, but %d were sent and %d skipped" % (planned["requests"], sent, skipped))
    if result.get("num_prompts") != planned.get("requests"):
        problems.append("the run was for %s prompts, the plan for %s"
                        % (result.get("num_prompts"), planned.get("requests")))
    if not isinstance(out["succeeded"], int) or not isinstance(out["failed"], int):
        problems.append("completed/failed counts are missing")
    elif out["succeeded"] + out["failed"] != sent:
        problems.append("%d succeeded + %d failed != %d sent" % (out["succeeded"], out["failed"], sent))
    errors_counted = sum(1 for e in (result.get("errors") or []) if e)
    if isinstance(out["failed"], int) and errors_counted != out["failed"]:
        problems.append("%d requests carry an error, but failed is %d" % (errors_counted, out["failed"]))
    if len(mine) != sent:
        problems.append("requests.jsonl has %d rows for this point, the result %d requests" % (len(mine), sent))
    elif [r["success"] for r in mine] != [not e for e in (result.get("errors") or [])]:
        problems.append("requests.jsonl and the result disagree about which requests succeeded")
    for key in ("input_lens", "output_lens", "ttfts"):
        if key in result and len(result[key]) != sent:
            problems.append("%s has %d entries for %d requests" % (key, len(result[key]), sent))
    if planned.get("sessions") is not None:
        done = (out["completed_sessions"] or 0) + (out["failed_sessions"] or 0)
        if done != planned["sessions"]:
            problems.append("planned %d sessions, %d completed + %d failed" % (
                planned["sessions"], out["completed_sessions"] or 0, out["failed_sessions"] or 0))
    return out


def summary_row(result):
    point = _point(result)
    tpot = result.get("mean_tpot_ms") or 0.0
    return {"point": point.get("name"), "series": point.get("series"), "kind": point.get("kind"),
            "concurrency": result.get("max_concurrency") or point.get("concurrency"),
            "requests": result.get("completed"), "failed": result.get("failed"),
            "output_tok_s": round(result.get("output_throughput") or 0.0, 1),
            "total_tok_s": round(result.get("total_token_throughput") or 0.0, 1),
            "per_user_tok_s": round(1000.0 / tpot, 1) if tpot > 0 else None,
            "ttft_p50_ms": round(result.get("p50_ttft_ms", result.get("median_ttft_ms")) or 0.0, 1),
            "ttft_p99_ms": round(result.get("p99_ttft_ms") or 0.0, 1),
            "tpot_p50_ms": round(result.get("p50_tpot_ms", result.get("median_tpot_ms")) or 0.0, 2),
            "tpot_p99_ms": round(result.get("p99_tpot_ms") or 0.0, 2),
            "prefix_hit_rate": (result.get("npuops") or {}).get("prefix_cache_hit_rate"),
            "external_hit_rate": (result.get("npuops") or {}).get("external_prefix_cache_hit_rate"),
            "mean_input_tokens": (result.get("npuops") or {}).get("mean_input_tokens"),
            "follow_up_hit_rate": (result.get("npuops") or {}).get("follow_up_hit_rate"),
            "draft_acceptance_rate": ((result.get("npuops") or {}).get("spec_decode") or {}).get("acceptance_rate"),
            "mean_acceptance_length": ((result.get("npuops") or {}).get("spec_decode") or {}).get(
                "mean_acceptance_length")}


def _safe(name):
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(name))


def write(report_dir, results, meta):
    """Saves the raw results and the per-request JSONL, then renders. -> render()'s summary."""
    if os.path.exists(os.path.join(report_dir, "raw")):
        raise ReportError("%s already holds a report; choose another directory" % report_dir)
    os.makedirs(os.path.join(report_dir, "raw"))
    with open(os.path.join(report_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
    with open(os.path.join(report_dir, "requests.jsonl"), "w") as f:
        for i, result in enumerate(results):
            with open(os.path.join(report_dir, "raw", "%02d-%s.json" % (i, _safe(_point(result).get("name")))),
                      "w") as raw:
                json.dump(result, raw)
            for row in request_rows(result):
                f.write(json.dumps(row, sort_keys=True) + "\n")
    return render(report_dir)


def load(report_dir):
    """-> (meta, results, rows) of a saved report; names the file that does not parse."""
    raw_dir = os.path.join(report_dir, "raw")
    if not os.path.isdir(raw_dir):
        raise ReportError("%s is not a report directory (no raw/)" % report_dir)
    try:
        with open(os.path.join(report_dir, "meta.json")) as f:
            meta = json.load(f)
    except (IOError, OSError, ValueError) as e:
        raise ReportError("%s/meta.json: %s" % (report_dir, e))
    results = []
    for name in sorted(os.listdir(raw_dir)):
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(raw_dir, name)) as f:
                results.append(json.load(f))
        except ValueError as e:
            raise ReportError("raw/%s is not valid JSON (%s): the saved result is damaged" % (name, e))
    rows = []
    try:
        with open(os.path.join(report_dir, "requests.jsonl")) as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except ValueError as e:
                        raise ReportError("requests.jsonl line %d is not valid JSON (%s)" % (n, e))
    except (IOError, OSError) as e:
        raise ReportError("requests.jsonl: %s" % e)
    return meta, results, rows


def _series(rows):
    order, groups = [], {}
    for row in rows:
        if row["series"] not in groups:
            order.append(row["series"])
            groups[row["series"]] = []
        groups[row["series"]].append(row)
    return [(s, sorted(groups[s], key=lambda r: r["concurrency"] or 0)) for s in order]


def plot(report_dir, table):
    """The three PNG plots. -> their file names."""
    if not HAS_MATPLOTLIB:
        raise ReportError("matplotlib is not installed on the controller (pip install matplotlib)")
    series = _series(table)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, rows in series:
        conc = [r["concurrency"] for r in rows]
        ax.plot(conc, [r["output_tok_s"] for r in rows], marker="o", label="%s output" % name)
        ax.plot(conc, [r["total_tok_s"] for r in rows], marker="s", linestyle="--", label="%s total" % name)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="concurrency", ylabel="tokens/s", title="Throughput vs concurrency")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(report_dir, PLOTS[0]), dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, rows in series:
        pts = [r for r in rows if r["per_user_tok_s"]]
        ax.plot([r["output_tok_s"] for r in pts], [r["per_user_tok_s"] for r in pts], marker="o", label=name)
        for r in pts:
            ax.annotate("c%s" % r["concurrency"], (r["output_tok_s"], r["per_user_tok_s"]), fontsize=7)
    ax.set(xlabel="total output tokens/s", ylabel="tokens/s per user (1000 / mean TPOT)",
           title="Per-user vs total throughput")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(report_dir, PLOTS[1]), dpi=100)
    plt.close(fig)

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.5))
    for name, rows in series:
        conc = [r["concurrency"] for r in rows]
        left.plot(conc, [r["ttft_p50_ms"] for r in rows], marker="o", label="%s P50" % name)
        left.plot(conc, [r["ttft_p99_ms"] for r in rows], marker="^", linestyle="--", label="%s P99" % name)
        right.plot(conc, [r["tpot_p50_ms"] for r in rows], marker="o", label="%s P50" % name)
        right.plot(conc, [r["tpot_p99_ms"] for r in rows], marker="^", linestyle="--", label="%s P99" % name)
    for ax, what in ((left, "TTFT"), (right, "TPOT")):
        ax.set_xscale("log", base=2)
        ax.set(xlabel="concurrency", ylabel="%s (ms)" % what, title="%s percentiles" % what)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(report_dir, PLOTS[2]), dpi=100)
    plt.close(fig)
    return list(PLOTS)


COLUMNS = (("concurrency", "concurrency"), ("requests", "succeeded"), ("failed", "failed"),
           ("mean_input_tokens", "mean input tokens"),
           ("output_tok_s", "output tok/s"), ("total_tok_s", "total tok/s"), ("per_user_tok_s", "per-user tok/s"),
           ("ttft_p50_ms", "TTFT P50 ms"), ("ttft_p99_ms", "TTFT P99 ms"), ("tpot_p50_ms", "TPOT P50 ms"),
           ("tpot_p99_ms", "TPOT P99 ms"), ("prefix_hit_rate", "prefix hit rate"),
           ("follow_up_hit_rate", "follow-up turns' hit rate"),
           ("external_hit_rate", "KV-transfer hit rate"), ("draft_acceptance_rate", "draft acceptance"),
           ("mean_acceptance_length", "mean acceptance length"))
# shown only when a point has them (a run with a draft, npuops_draft; multi-turn series)
SPEC_COLUMNS = ("draft_acceptance_rate", "mean_acceptance_length", "follow_up_hit_rate")
# the knee of a series: its last point whose per-user speed is at least this share of the series' best
KNEE_FRACTION = 0.25


def knee(rows, fraction=KNEE_FRACTION):
    """The last point of a series (in concurrency order) whose per-user speed stays within `fraction` of the series'
    best: beyond it a user gets less than that share of what the fastest point gives one. None without speeds."""
    speeds = [(r["concurrency"], r.get("per_user_tok_s")) for r in sorted(rows, key=lambda r: r["concurrency"] or 0)]
    best = max([v for _c, v in speeds if v] or [0])
    if not best:
        return None
    last = None
    for conc, speed in speeds:
        if not speed or speed < fraction * best:
            break
        last = conc
    return last


def _cell(value):
    if value is None:
        return "-"
    return "%s" % value


def markdown(meta, table, reconciliation, plots):
    lines = ["# Benchmark: %s on %s" % (meta.get("model", "?"), meta.get("tier", "?")), "",
             "- endpoint: `%s`" % meta.get("endpoint", "?"), "- matrix: `%s`" % meta.get("matrix", "?"),
             "- started: %s" % meta.get("started", "?")]
    images = {}
    for host, held in sorted((meta.get("images") or {}).items()):
        versions = held.get("versions") or {}
        text = "`%s` (%s%s)" % (held.get("image"), ", ".join("%s %s" % (k, versions[k]) for k in sorted(versions))
                                or "versions not read", "; %s" % held["digest"] if held.get("digest") else "")
        images.setdefault(text, []).append(host)
    # what the engines ran, read from their containers (the inventory's image may have changed since the deploy)
    lines += ["- image on %s: %s" % (", ".join(hosts), text) for text, hosts in sorted(images.items())]
    models = meta.get("models") or {}
    if len(models) > 1:
        # replicas that serve different weights: the load reached each (the gateway's mode decides in what share)
        lines += ["- instance %s serves `%s` from `%s` (recipe %s)" % (
            name, m.get("served_model_name"), m.get("model_dir"), m.get("recipe")) for name, m in sorted(models.items())]
    # the tutorial's section 6: with DSpark, record the draft checkpoint and the speculative token count
    lines += ["- instance %s drafts with `%s`, %s speculative tokens" % (name, m["draft"], m.get("num_speculative_tokens"))
              for name, m in sorted(models.items()) if m.get("draft")]
    if models and not any(m.get("draft") for m in models.values()):
        lines.append("- draft: none (no speculative decoding)")
    lines.append("")
    columns = [(k, t) for k, t in COLUMNS if k not in SPEC_COLUMNS or any(r.get(k) is not None for r in table)]
    run = meta.get("run") or {}
    if run:
        # what the tutorial's section 6 asks to record with every result
        lines += ["## Run", ""] + ["- %s: %s" % (key.replace("_", " "), _cell(run[key])) for key in sorted(run)] + [""]
    planned = meta.get("planned_concurrency") or {}
    for name, rows in _series(table):
        point_knee = knee(rows)
        lines += ["## %s (%s)" % (name, rows[0]["kind"]), "",
                  "Knee: %s (the last concurrency whose per-user speed is at least %d %% of the series' best)%s." % (
                      "c=%d" % point_knee if point_knee else "-", int(KNEE_FRACTION * 100),
                      "; the capacity plan: %s" % planned[name] if name in planned else ""), "",
                  "| " + " | ".join(title for _k, title in columns) + " |",
                  "|" + "---:|" * len(columns)]
        for r in rows:
            lines.append("| " + " | ".join(_cell(r.get(k)) for k, _t in columns) + " |")
        lines.append("")
    bad = [r for r in reconciliation if r["problems"]]
    lines += ["## Reconciliation: %s" % ("adds up" if not bad else "DOES NOT ADD UP"), "",
              "| point | planned | sent | skipped | succeeded | failed | sessions planned | completed | failed |"
              " problems |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in reconciliation:
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["point"], _cell(r["planned_requests"]), r["sent"], r["skipped"], _cell(r["succeeded"]),
            _cell(r["failed"]), _cell(r["planned_sessions"]), _cell(r["completed_sessions"]),
            _cell(r["failed_sessions"]), "; ".join(r["problems"]) or "-"))
    lines += ["", "## Plots", ""] + ["![%s](%s)" % (p[:-4].replace("_", " "), p) for p in plots] + [""]
    return "\n".join(lines)


def render(report_dir):
    """Reads a report directory, reconciles, draws and writes report.md and summary.json.
    -> {ok, adds_up, failed_requests, table, reconciliation, plots, report}."""
    meta, results, rows = load(report_dir)
    if not results:
        raise ReportError("%s/raw holds no results" % report_dir)
    table = [summary_row(r) for r in results]
    reconciliation = [reconcile(r, rows) for r in results]
    names = set(r["point"] for r in reconciliation)
    stray = sorted(set(row["point"] for row in rows) - names)
    if stray:
        reconciliation.append({"point": ",".join(str(s) for s in stray), "planned_requests": None, "sent": 0,
                               "succeeded": None, "failed": None, "skipped": 0, "planned_sessions": None,
                               "completed_sessions": None, "failed_sessions": None,
                               "problems": ["requests.jsonl has rows of points with no result"]})
    plots = plot(report_dir, table)
    adds_up = not any(r["problems"] for r in reconciliation)
    failed = sum(r["failed"] or 0 for r in table)
    with open(os.path.join(report_dir, "report.md"), "w") as f:
        f.write(markdown(meta, table, reconciliation, plots))
    summary = {"ok": adds_up and failed == 0, "adds_up": adds_up, "failed_requests": failed, "table": table,
               "knees": dict((name, knee(series_rows)) for name, series_rows in _series(table)),
               "reconciliation": reconciliation, "plots": plots, "report": os.path.join(report_dir, "report.md"),
               "report_dir": report_dir, "meta": meta}
    with open(os.path.join(report_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
    return summary


# what a comparison of two runs of the same matrix puts side by side (the tutorial's tuning table, section 9.2: a
# baseline against a matching DSpark draft on the same workload: latency, acceptance)
COMPARED = (("output_tok_s", "output tok/s"), ("per_user_tok_s", "per-user tok/s"), ("ttft_p50_ms", "TTFT P50 ms"),
            ("tpot_p50_ms", "TPOT P50 ms"), ("tpot_p99_ms", "TPOT P99 ms"))


def _drafts(meta):
    models = meta.get("models") or {}
    named = ["%s (k=%s)" % (m["draft"], m.get("num_speculative_tokens")) for _n, m in sorted(models.items())
             if m.get("draft")]
    return ", ".join(named) or "none"


def compare(report_dir, baseline_dir):
    """Puts this report's points beside a baseline report's of the same matrix, point by point (matched by name), with
    the ratio this / baseline of each figure and the draft's acceptance, and writes comparison.md. A different
    matrix is refused: the points would not be the same workload. -> {baseline, points, only_here, only_there,
    report}."""
    meta, _r, _rows = load(report_dir)
    base_meta, _r, _rows = load(baseline_dir)
    if meta.get("matrix") != base_meta.get("matrix"):
        raise ReportError("cannot compare with %s: it ran matrix %r, this run %r (compare runs of the same matrix)"
                          % (baseline_dir, base_meta.get("matrix"), meta.get("matrix")))
    here = dict((r["point"], r) for r in render(report_dir)["table"])
    there = dict((r["point"], r) for r in render(baseline_dir)["table"])
    points = []
    for name in [p for p in here if p in there]:
        row = {"point": name, "series": here[name]["series"], "concurrency": here[name]["concurrency"],
               "draft_acceptance_rate": here[name].get("draft_acceptance_rate"),
               "mean_acceptance_length": here[name].get("mean_acceptance_length")}
        for key, _title in COMPARED:
            a, b = here[name].get(key), there[name].get(key)
            row[key] = a
            row["baseline_" + key] = b
            row["ratio_" + key] = round(float(a) / float(b), 3) if a is not None and b else None
        points.append(row)
    names = [os.path.basename(os.path.abspath(d)) for d in (report_dir, baseline_dir)]
    lines = ["# Comparison: %s against %s" % tuple(names), "",
             "- this run: draft %s, started %s" % (_drafts(meta), meta.get("started", "?")),
             "- baseline: draft %s, started %s (`%s`)" % (_drafts(base_meta), base_meta.get("started", "?"), baseline_dir),
             "- matrix: `%s`; ratio = this run / baseline" % meta.get("matrix"), "",
             "| point | concurrency | " + " | ".join("%s (this / baseline / ratio)" % t for _k, t in COMPARED)
             + " | draft acceptance | mean acceptance length |",
             "|---|---:|" + "---:|" * (len(COMPARED) + 2)]
    for r in points:
        cells = ["%s / %s / %s" % (_cell(r[k]), _cell(r["baseline_" + k]), _cell(r["ratio_" + k])) for k, _t in COMPARED]
        lines.append("| %s | %s | %s | %s | %s |" % (r["point"], _cell(r["concurrency"]), " | ".join(cells),
                                                     _cell(r["draft_acceptance_rate"]), _cell(r["mean_acceptance_length"])))
    only_here = sorted(p for p in here if p not in there)
    only_there = sorted(p for p in there if p not in here)
    if only_here or only_there:
        lines += ["", "Points in one run only: %s" % ", ".join(only_here + only_there)]
    path = os.path.join(report_dir, "comparison.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return {"baseline": baseline_dir, "points": points, "only_here": only_here, "only_there": only_there,
            "report": path}
