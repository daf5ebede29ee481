# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Load points of a benchmark matrix, measured the way vLLM measures them.

``random`` points run ``vllm bench serve`` inside the engine container (the load is generated next to the
server, as the reference runs did) and read the JSON it saves. ``multi_turn`` points replay agentic
sessions: every turn resends the whole growing conversation, so the prefix cache is exercised; vllm bench
serve has no such dataset, so this driver streams the turns itself and writes the same result fields.
Each point also records the server's prefix-cache counters before and after (hit rate of the point).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import math
import re
import statistics
import threading
import time

from ansible_collections.npuops.ascend.plugins.module_utils.openai_client import (
    ApiError, engines_totals, sized_prompt)

PREFIX_METRICS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
# KV a connector loaded from another instance (the PD decode side's pulled KV): counted apart by vLLM, never as
# prefix-cache hits (vllm/v1/metrics/loggers.py, vllm/v1/core/sched/scheduler.py)
EXTERNAL_METRICS = ("vllm:external_prefix_cache_queries_total", "vllm:external_prefix_cache_hits_total")


# a draft's proposals and what the target accepted (vllm/v1/spec_decode/metrics.py SpecDecodingProm)
SPEC_METRICS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                "vllm:spec_decode_num_accepted_tokens_total")


def percentile(values, p):
    if not values:
        return 0.0
    s = sorted(values)
    k = (len(s) - 1) * p / 100.0
    f, c = int(math.floor(k)), int(math.ceil(k))
    return s[f] if f == c else s[f] + (s[c] - s[f]) * (k - f)


def summarize(ttfts_ms, tpots_ms, itls_ms, e2els_ms, percentiles=(50, 99)):
    out = {}
    for name, values in (("ttft", ttfts_ms), ("tpot", tpots_ms), ("itl", itls_ms), ("e2el", e2els_ms)):
        out["mean_%s_ms" % name] = statistics.mean(values) if values else 0.0
        out["median_%s_ms" % name] = statistics.median(values) if values else 0.0
        out["std_%s_ms" % name] = statistics.pstdev(values) if values else 0.0
        for p in percentiles:
            out["p%g_%s_ms" % (p, name)] = percentile(values, p)
    return out


def prefix_counters(metrics_clients):
    """Prefix-cache (and speculative decoding) counters summed over every engine that serves (each DP or PD front has
    its own); None when one of them has no metrics, so a partial sum never passes for a hit rate."""
    keys = (("queries", PREFIX_METRICS[0]), ("hits", PREFIX_METRICS[1]), ("external_queries", EXTERNAL_METRICS[0]),
            ("external_hits", EXTERNAL_METRICS[1]), ("spec_drafts", SPEC_METRICS[0]),
            ("spec_draft_tokens", SPEC_METRICS[1]), ("spec_accepted", SPEC_METRICS[2]))
    totals = engines_totals(metrics_clients, PREFIX_METRICS + EXTERNAL_METRICS + SPEC_METRICS)
    return None if totals is None else dict((key, totals[metric]) for key, metric in keys)


def hit_rate(before, after, prefix=""):
    """Hits over queries between two prefix_counters() readings; prefix="external_" for the KV-connector ones."""
    if not before or not after:
        return None
    q = after[prefix + "queries"] - before[prefix + "queries"]
    return round((after[prefix + "hits"] - before[prefix + "hits"]) / q, 4) if q > 0 else None


def spec_decode(before, after):
    """What a draft did between two prefix_counters() readings, as vLLM defines it (vllm/v1/spec_decode/metrics.py):
    {drafts, draft_tokens, accepted_tokens, acceptance_rate (accepted / draft tokens), mean_acceptance_length
    (1 + accepted / drafts: the tokens one verify step yields)}; None when no draft proposed anything."""
    if not before or not after:
        return None
    drafts = after["spec_drafts"] - before["spec_drafts"]
    proposed = after["spec_draft_tokens"] - before["spec_draft_tokens"]
    accepted = after["spec_accepted"] - before["spec_accepted"]
    if drafts <= 0 or proposed <= 0:
        return None
    return {"drafts": int(drafts), "draft_tokens": int(proposed), "accepted_tokens": int(accepted),
            "acceptance_rate": round(accepted / proposed, 4), "mean_acceptance_length": round(1 + accepted / drafts, 3)}


def random_argv(point, base_url, model, result_dir, filename, tokenizer=None):
    """The vllm bench serve command line of a `random` point.

    `tokenizer`: {path, mode, trust_remote_code}. vllm bench serve loads its tokenizer before the first request,
    from --tokenizer or else from --model: a served name such as kimi-k3 is no tokenizer, so the model directory
    (inside the engine container) is passed, with --trust-remote-code for tokenizers that are custom code."""
    tokenizer = tokenizer or {}
    argv = ["vllm", "bench", "serve", "--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions",
            "--model", model]
    if tokenizer.get("path"):
        argv += ["--tokenizer", tokenizer["path"]]
    if tokenizer.get("mode") not in (None, "", "auto"):
        argv += ["--tokenizer-mode", tokenizer["mode"]]
    if tokenizer.get("trust_remote_code"):
        argv.append("--trust-remote-code")
    argv += ["--dataset-name", "random", "--random-input-len", str(point["input_len"]),
             "--random-output-len", str(point["output_len"]), "--num-prompts", str(point["num_prompts"]),
             "--max-concurrency", str(point["concurrency"]), "--save-result", "--save-detailed",
             "--result-dir", result_dir, "--result-filename", filename, "--percentile-metrics", "ttft,tpot,itl,e2el",
             "--metric-percentiles", "50,99"]
    if point.get("ignore_eos"):
        argv.append("--ignore-eos")
    return argv


def multi_turn(client, model, point):
    """Agentic sessions: `concurrency` at a time, `sessions` in all, `turns` each, every turn resending the
    conversation (a private context of about `context_tokens`, then the turns so far)."""
    sessions = planned(point)["sessions"]
    turns = int(point["turns"])
    limit = threading.Semaphore(int(point["concurrency"]))
    lock = threading.Lock()
    records = []
    state = {"failed_sessions": 0, "completed_sessions": 0}

    sizing = {}

    def session(k):
        with limit:
            # the private context in the engine's tokens (its /tokenize): words would be more tokens than asked
            context, counted, how = sized_prompt(client, model, int(point["context_tokens"]), seed=k * 131)
            with lock:
                sizing[k] = (counted, how)
            history = [{"role": "system", "content": context}]
            for t in range(turns):
                history.append({"role": "user", "content": "Step %d of task %d: continue, and compute 17*23." % (t, k)})
                rec = {"session": k, "turn": t, "input_len": None, "output_len": 0, "ttft": 0.0, "itl": [],
                       "latency": 0.0, "start": time.time(), "error": "", "success": False}
                try:
                    out = client.stream("/v1/chat/completions", {
                        "model": model, "messages": history, "max_tokens": int(point["output_len"]),
                        "ignore_eos": True, "temperature": 0})
                    usage = out.get("usage") or {}
                    rec.update(input_len=usage.get("prompt_tokens"),
                               output_len=usage.get("completion_tokens", out["chunks"]),
                               ttft=out["ttft"] or 0.0, itl=out["itls"], latency=out["seconds"], success=True)
                    history.append({"role": "assistant", "content": out["text"]})
                except ApiError as e:
                    rec["error"] = str(e)
                with lock:
                    records.append(rec)
                if not rec["success"]:
                    with lock:
                        state["failed_sessions"] += 1
                    return
            with lock:
                state["completed_sessions"] += 1

    t0 = time.time()
    threads = [threading.Thread(target=session, args=(k,)) for k in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    duration = time.time() - t0
    records.sort(key=lambda r: (r["session"], r["turn"]))
    ok = [r for r in records if r["success"]]
    total_in = sum(r["input_len"] or 0 for r in ok)
    total_out = sum(r["output_len"] for r in ok)
    result = {"date": time.strftime("%Y%m%d-%H%M%S"), "endpoint_type": "openai-chat", "backend": "openai-chat",
              "model_id": model, "num_prompts": sessions * turns, "max_concurrency": int(point["concurrency"]),
              "duration": duration, "completed": len(ok), "failed": len(records) - len(ok),
              "total_input_tokens": total_in, "total_output_tokens": total_out,
              "request_throughput": len(ok) / duration, "output_throughput": total_out / duration,
              "total_token_throughput": (total_in + total_out) / duration,
              "sent": len(records), "skipped": sessions * turns - len(records),
              "sessions": sessions, "completed_sessions": state["completed_sessions"],
              "failed_sessions": state["failed_sessions"], "turns": turns,
              "input_lens": [r["input_len"] for r in records], "output_lens": [r["output_len"] for r in records],
              "turn_index": [r["turn"] for r in records],
              "context_sizing": sorted(set(how for _c, how in sizing.values())),
              "context_tokens_counted": [c for _k, (c, _h) in sorted(sizing.items())],
              "ttfts": [r["ttft"] for r in records], "itls": [r["itl"] for r in records],
              "latencies": [r["latency"] for r in records], "start_times": [r["start"] for r in records],
              "sessions_of": [r["session"] for r in records], "turns_of": [r["turn"] for r in records],
              "errors": [r["error"] for r in records]}
    result.update(summarize([r["ttft"] * 1000 for r in ok],
                            [(r["latency"] - r["ttft"]) / (r["output_len"] - 1) * 1000 for r in ok
                             if r["output_len"] > 1],
                            [x * 1000 for r in ok for x in r["itl"]], [r["latency"] * 1000 for r in ok]))
    return result


def planned(point):
    """Requests and sessions a point intends to send."""
    if point["kind"] == "multi_turn":
        sessions = int(point.get("sessions") or point["concurrency"])
        return {"requests": sessions * int(point["turns"]), "sessions": sessions}
    return {"requests": int(point["num_prompts"]), "sessions": None}


# vllm bench serve reads the key from OPENAI_API_KEY (vllm/benchmarks/lib/endpoint_request_func.py); here it is
# read from standard input inside the container, so it is on no command line and in no host process's environment
KEY_FROM_STDIN = 'IFS= read -r OPENAI_API_KEY; export OPENAI_API_KEY; exec "$@"'


def exec_argv(cli, container, argv, api_key=None):
    """-> (args, kwargs) of run_command for `argv` in the container: with a key, `exec -i` and the key on stdin."""
    if not api_key:
        return [cli, "exec", container] + list(argv), {}
    return [cli, "exec", "-i", container, "sh", "-c", KEY_FROM_STDIN, "sh"] + list(argv), {"data": api_key}


UNAUTHORIZED = re.compile(r"Unauthorized|\b401\b")
KEY_REFUSED = ("every request was refused with 401 Unauthorized by %s: the API key (npuops_serve_api_key) is not the "
               "one the service was started with")


def check_access(client, model):
    """One one-token completion before any point: a wrong key fails here, at once, naming it (vllm bench serve would
    retry its initial test request for --ready-check-timeout-sec, 600 s by default, then say only its reason)."""
    try:
        client.post("/v1/completions", {"model": model, "prompt": "1", "max_tokens": 1})
    except ApiError as e:
        if e.status == 401:
            raise ApiError(KEY_REFUSED % client.base, 401)
        raise


def refused_by_key(result):
    """True when a point sent requests and every one was refused with 401 (a wrong or missing API key): vLLM's bench
    records the HTTP reason ("Unauthorized"), our multi-turn driver the status."""
    errors = [e for e in result.get("errors") or [] if e]
    return not result.get("completed") and bool(errors) and all(UNAUTHORIZED.search(e) for e in errors)


def run_point(point, client, model, exec_in_container, result_dir, metrics_clients, tokenizer=None):
    """Run one point. `exec_in_container(argv) -> (rc, out, err)` runs a command in the engine container."""
    base_url = client.base
    before = prefix_counters(metrics_clients)
    if point["kind"] == "random":
        filename = "%s.json" % point["name"]
        rc, out, err = exec_in_container(random_argv(point, base_url, model, result_dir, filename, tokenizer))
        if rc != 0 and UNAUTHORIZED.search((err or "") + (out or "")):
            # vllm bench serve ends at its initial test request when that is refused ("Initial test run failed")
            raise ApiError(KEY_REFUSED % base_url, 401)
        if rc != 0:
            raise ApiError("vllm bench serve failed for %s (rc=%d): %s" % (point["name"], rc, (err or out)[-800:]))
        rc, out, err = exec_in_container(["cat", "%s/%s" % (result_dir, filename)])
        if rc != 0:
            raise ApiError("could not read the result of %s: %s" % (point["name"], (err or out)[-300:]))
        result = json.loads(out)
    elif point["kind"] == "multi_turn":
        result = multi_turn(client, model, point)
    else:
        raise ApiError("unknown point kind %r (random or multi_turn)" % point["kind"])
    if refused_by_key(result):
        raise ApiError(KEY_REFUSED % base_url, 401)
    after = prefix_counters(metrics_clients)
    result["npuops"] = {"point": point, "planned": planned(point), "prefix_cache_hit_rate": hit_rate(before, after),
                        "external_prefix_cache_hit_rate": hit_rate(before, after, "external_"),
                        "follow_up_hit_rate": follow_up_hit_rate(before, after, result),
                        "mean_input_tokens": mean_input_tokens(result),
                        "spec_decode": spec_decode(before, after)}
    return result


def mean_input_tokens(result):
    """The mean prompt of the point's successful requests, in the engine's tokens (the report's 实测平均输入)."""
    done = result.get("completed") or 0
    return round(float(result.get("total_input_tokens") or 0) / done, 1) if done else None


def follow_up_hit_rate(before, after, result):
    """The prefix-cache hit rate of the turns after the first (the report's 后续轮缓存命中): the point's hits over its
    queries less the first turns' prompts. A session's first turn carries its own private context, which no cache
    holds yet, so its hits are taken as none; None for a point without turns or without prefix-cache counters."""
    turns = result.get("turn_index")
    if not turns or not before or not after:
        return None
    first = sum(n or 0 for n, t in zip(result.get("input_lens") or [], turns) if t == 0)
    queries = after["queries"] - before["queries"] - first
    if queries <= 0:
        return None
    return round(min(1.0, (after["hits"] - before["hits"]) / queries), 4)
