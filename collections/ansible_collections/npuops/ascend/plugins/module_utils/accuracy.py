# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Answer quality of a served model: the golden set asked with greedy decoding and scored by exact match on the
final answer (after a reasoning model's reasoning), the samples accounted as the vLLM-Ascend Kimi-K3 tutorial asks
(section 7: completed, failed, missing and unparsed), the pass rule of vLLM-Ascend's nightly CI (tools/aisbench.py:
|score - baseline| <= threshold, in absolute points), and API checks of the kind Kimi's vendor verifier runs
(sampling parameters honoured, tool-call arguments valid against the tool's schema, usage plausible).

A deployment whose numbers are wrong still answers /health, /v1/models and chat with HTTP 200 (multi-node garbled
output, vllm-ascend #11019, #11394, #16608); only its answers tell.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import re
import threading
import time

from ansible_collections.npuops.ascend.plugins.module_utils.openai_client import ApiError, reasoning_of

# reasoning a server left in the content (no reasoning parser): <think>...</think>, Kimi's ◁think▷...◁/think▷
THINK = re.compile(r"(?s)(<think>.*?</think>|\u25c1think\u25b7.*?\u25c1/think\u25b7)")
# an unterminated reasoning block: everything after it is still reasoning (max_tokens cut it), no final answer
THINK_OPEN = re.compile(r"(?s)(<think>|\u25c1think\u25b7).*$")
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
STATED = re.compile(r"(?i)(?:final answer|answer)\s*(?:is|:|=)?\s*[:：]?\s*\**\s*([-+]?[\d,]*\.?\d+)")
STATED_ZH = re.compile(r"答案\s*(?:是|为|:|：)\s*\**\s*([-+]?[\d,]*\.?\d+)")
# a number standing alone (not the 0 of 0x1f, the 2 of 2nd or the 3 of A3)
NUMBER = re.compile(r"(?<![A-Za-z_\d.])(?:[-+]?\d[\d,]*(?:\.\d+)?|[-+]?\.\d+)(?![A-Za-z_\d])")


def final_text(content):
    """The content without reasoning blocks a server left in it; None when only unterminated reasoning is there."""
    text = THINK.sub(" ", content or "")
    if THINK_OPEN.search(text):
        text = THINK_OPEN.sub(" ", text)
        if not text.strip():
            return None
    return text


def normalize(answer):
    """'1,234' -> '1234', '42.0' -> '42', '+7' -> '7', ' 12 ' -> '12'; other text lowercased and stripped."""
    text = str(answer).strip().strip("*").strip()
    plain = text.replace(",", "").replace(" ", "")
    if re.match(r"^[-+]?(\d+(\.\d*)?|\.\d+)$", plain):
        value = float(plain)
        return str(int(value)) if value == int(value) else repr(value)
    return text.lower()


def extract_answer(content):
    """The final answer of a reply's content (the reasoning is not the answer): \\boxed{x}, else the last
    "answer is x" / "Answer: x" / "答案是 x", else the last number. None when there is none (unparsed)."""
    text = final_text(content)
    if not text:
        return None
    for pattern in (BOXED, STATED, STATED_ZH):
        found = pattern.findall(text)
        if found:
            return normalize(found[-1])
    numbers = NUMBER.findall(text)
    return normalize(numbers[-1]) if numbers else None


def account(items, results):
    """The samples as the tutorial asks them recorded, and the score in points (0-100) over every planned item:
    a failed, missing or unparsed sample counts as wrong. `results`: {id: {status: ok|failed, answer, ...}}."""
    out = {"total": len(items), "completed": 0, "failed": 0, "missing": 0, "unparsed": 0, "correct": 0, "wrong": 0}
    for item in items:
        r = results.get(item["id"])
        if r is None:
            out["missing"] += 1
        elif r["status"] != "ok":
            out["failed"] += 1
        else:
            out["completed"] += 1
            if r.get("answer") is None:
                out["unparsed"] += 1
            elif r["answer"] == normalize(item["answer"]):
                out["correct"] += 1
            else:
                out["wrong"] += 1
    out["score"] = round(100.0 * out["correct"] / out["total"], 2) if out["total"] else 0.0
    return out


def passes(score, baseline, threshold):
    """vLLM-Ascend's accuracy rule (tools/aisbench.py): the score within `threshold` absolute points of the
    baseline, either way."""
    return abs(float(score) - float(baseline)) <= float(threshold)


def ask_golden(client, model, items, budget=None, concurrency=4, max_tokens=512, clock=time.time):
    """Every item as a greedy chat completion (temperature 0), `concurrency` at a time, all within `budget`
    seconds: -> {id: {status, answer, content, detail}}; items not sent in time are absent (missing)."""
    results = {}
    lock = threading.Lock()
    queue = list(items)
    deadline = clock() + budget if budget else None

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                item = queue.pop(0)
            if deadline is not None and clock() >= deadline:
                return
            body = {"model": model, "temperature": 0, "max_tokens": max_tokens,
                    "messages": [{"role": "user", "content": item["question"]}]}
            try:
                reply, _seconds = client.post("/v1/chat/completions", body)
                message = reply["choices"][0]["message"]
                content = message.get("content") or ""
                out = {"status": "ok", "answer": extract_answer(content), "content": content[-300:],
                       "reasoning_chars": len(reasoning_of(message))}
            except ApiError as e:
                out = {"status": "failed", "answer": None, "detail": str(e)[:300]}
            except (ValueError, KeyError, IndexError, TypeError) as e:
                out = {"status": "failed", "answer": None, "detail": "unexpected reply: %s: %s" % (type(e).__name__, e)}
            with lock:
                results[item["id"]] = out

    threads = [threading.Thread(target=worker) for _k in range(max(1, min(int(concurrency), len(items) or 1)))]
    for t in threads:
        t.daemon = True
        t.start()
    for t in threads:
        t.join(None if deadline is None else max(0.0, deadline - clock()) + client.timeout + 5)
    with lock:
        return dict(results)


def schema_problems(schema, value, where="arguments"):
    """What makes `value` invalid against a JSON schema's object/type/required/properties/enum (the subset tool
    definitions use); [] when valid."""
    problems = []
    kind = schema.get("type")
    types = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
    if kind in ("integer", "number"):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (
            kind == "number" or float(value) == int(value))
        if not ok:
            problems.append("%s: %r is not %s" % (where, value, "an integer" if kind == "integer" else "a number"))
    elif kind in types and not isinstance(value, types[kind]):
        problems.append("%s: %r is not of type %s" % (where, value, kind))
    if "enum" in schema and value not in schema["enum"]:
        problems.append("%s: %r is not one of %s" % (where, value, schema["enum"]))
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key in schema.get("required") or []:
            if key not in value:
                problems.append("%s: required %r is missing" % (where, key))
        for key, sub in sorted(value.items()):
            if key in props:
                problems.extend(schema_problems(props[key], sub, "%s.%s" % (where, key)))
            elif schema.get("additionalProperties") is False:
                problems.append("%s: %r is not a property of the tool" % (where, key))
    return problems


TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city"}},
                   "required": ["city"], "additionalProperties": False}}}


def api_checks(client, model):
    """-> [{name, ok, detail}]: sampling parameters honoured (max_tokens cuts with finish_reason length; n gives n
    choices; a stop string is not in the output), tool-call arguments valid JSON for the tool's schema, and
    usage.prompt_tokens present and plausible for the prompt."""
    rows = []

    def check(name, fn):
        try:
            ok, detail = fn()
        except ApiError as e:
            ok, detail = False, str(e)
        except (ValueError, KeyError, IndexError, TypeError) as e:
            ok, detail = False, "unexpected reply: %s: %s" % (type(e).__name__, e)
        rows.append({"name": name, "ok": bool(ok), "detail": detail})

    def max_tokens():
        body = {"model": model, "prompt": "Count from one to one hundred:", "max_tokens": 5, "temperature": 0,
                "ignore_eos": True}
        reply, _s = client.post("/v1/completions", body)
        used = reply["usage"]["completion_tokens"]
        finish = reply["choices"][0]["finish_reason"]
        return used <= 5 and finish == "length", "max_tokens 5: %d completion tokens, finish_reason %s" % (
            used, finish)

    def n_choices():
        body = {"model": model, "prompt": "Say hi", "max_tokens": 4, "n": 2, "temperature": 0.7}
        reply, _s = client.post("/v1/completions", body)
        got = len(reply["choices"])
        return got == 2, "n 2: %d choice(s)" % got

    def stop():
        body = {"model": model, "prompt": "Count: 1, 2, 3, 4, 5,", "max_tokens": 32, "temperature": 0, "stop": [","]}
        reply, _s = client.post("/v1/completions", body)
        text = reply["choices"][0]["text"]
        return "," not in text, "stop [\",\"]: %r" % text[:80]

    def tool_arguments():
        reply, _s = client.post("/v1/chat/completions", {
            "model": model, "tools": [TOOL], "tool_choice": "auto", "max_tokens": 256,
            "messages": [{"role": "user", "content": "What's the weather like in Beijing?"}]})
        calls = reply["choices"][0]["message"].get("tool_calls") or []
        if not calls:
            return False, "no tool call (finish_reason %s)" % reply["choices"][0].get("finish_reason")
        fn = calls[0]["function"]
        if fn.get("name") != TOOL["function"]["name"]:
            return False, "called %r, not get_weather" % fn.get("name")
        try:
            args = json.loads(fn.get("arguments") or "")
        except ValueError as e:
            return False, "arguments are not JSON: %s (%r)" % (e, (fn.get("arguments") or "")[:80])
        problems = schema_problems(TOOL["function"]["parameters"], args)
        return not problems, "; ".join(problems) or "get_weather(%s) valid for its schema" % json.dumps(args)

    def usage():
        prompt = "Name three rivers of Europe and say which one is the longest."
        body = {"model": model, "max_tokens": 16, "temperature": 0, "messages": [{"role": "user", "content": prompt}]}
        reply, _s = client.post("/v1/chat/completions", body)
        used = (reply.get("usage") or {}).get("prompt_tokens")
        # at least one token per word of the prompt; at most one per character plus a chat template's overhead
        low, high = len(prompt.split()), len(prompt) + 256
        ok = isinstance(used, int) and low <= used <= high
        return ok, "usage.prompt_tokens %s for %d words (plausible: %d-%d)" % (used, low, low, high)

    for name, fn in (("max_tokens", max_tokens), ("n", n_choices), ("stop", stop),
                     ("tool_arguments", tool_arguments), ("usage", usage)):
        check(name, fn)
    return rows


# ------------------------------------------------------------------------------ standard suites (lm-eval)

# nothing is downloaded at run time: datasets come from the task files' local paths, evaluate's metrics from its
# installed copy (datasets / huggingface_hub / evaluate honour these)
OFFLINE_ENV = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_EVALUATE_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1"}
# lm-eval's regex filter answers this when the pattern finds nothing (lm_eval/filters/extraction.py)
INVALID = "[invalid]"


def lm_eval_argv(binary, url, model, tasks, include_path, output_path, limit=None, concurrency=4, chat=True):
    """The `lm_eval run` command line against an OpenAI-compatible endpoint (lm-eval's local-chat-completions /
    local-completions models); the API key goes in the environment (OPENAI_API_KEY), never here."""
    kind = "local-chat-completions" if chat else "local-completions"
    endpoint = "%s/v1/%s" % (url.rstrip("/"), "chat/completions" if chat else "completions")
    args = "model=%s,base_url=%s,num_concurrent=%d,max_retries=2,tokenized_requests=False,tokenizer_backend=None" % (
        model, endpoint, int(concurrency))
    argv = [binary, "run", "--model", kind, "--model_args", args, "--tasks", ",".join(tasks),
            "--include_path", include_path, "--output_path", output_path, "--log_samples"]
    if chat:
        argv.append("--apply_chat_template")
    if limit:
        argv += ["--limit", str(limit)]
    return argv


def task_data_files(task_docs):
    """The local files the task documents (their YAML, parsed) read their data from: dataset_kwargs.data_files
    (a path, a list, or {split: path(s)}), and a dataset_path that is a directory or file path."""
    out = []
    for doc in task_docs:
        files = ((doc.get("dataset_kwargs") or {}).get("data_files"))
        values = files.values() if isinstance(files, dict) else [files] if files else []
        for v in values:
            out.extend(v if isinstance(v, list) else [v])
        path = doc.get("dataset_path") or ""
        if path.startswith("/"):
            out.append(path)
    return [str(p) for p in out]


def lm_eval_account(results_doc, samples):
    """-> {task: {metric, score (points), samples {total, completed, failed, missing, unparsed, correct, wrong}}}
    from what lm-eval wrote: its results file (parsed) and every task's logged samples ({task: [sample dicts]}). A
    sample is failed when no response came back, unparsed when the task's filter found no answer in it."""
    out = {}
    counts = results_doc.get("n-samples") or {}
    for task, res in sorted((results_doc.get("results") or {}).items()):
        metric = sorted(k for k in res if "," in k and not k.split(",", 1)[0].endswith("_stderr"))
        if not metric:
            continue
        key = metric[0]
        rows = samples.get(task) or []
        planned = int((counts.get(task) or {}).get("effective") or len(rows))
        acc = {"total": planned, "completed": 0, "failed": 0, "missing": max(0, planned - len(rows)), "unparsed": 0,
               "correct": 0, "wrong": 0}
        name = key.split(",", 1)[0]
        for row in rows:
            resp = [r for group in (row.get("resps") or []) for r in (group if isinstance(group, list) else [group])]
            got = row.get("filtered_resps") or []
            got = got[0] if isinstance(got, list) and got else got
            if not any(str(r).strip() for r in resp):
                acc["failed"] += 1
                continue
            acc["completed"] += 1
            if got in (None, "", INVALID):
                acc["unparsed"] += 1
            elif float(row.get(name) or 0) >= 1.0:
                acc["correct"] += 1
            else:
                acc["wrong"] += 1
        acc["score"] = round(100.0 * float(res[key]), 2)
        out[task] = {"metric": key, "score": acc["score"], "samples": acc}
    return out
