# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The smoke checks a served model must pass, the way its users use it. Each returns one row
``{name, ok, detail, latency_s}``; a check that raises is a failed row, never an aborted run."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import json
import math
import time

from ansible_collections.npuops.ascend.plugins.module_utils.engine_progress import one_token_request, token_came
from ansible_collections.npuops.ascend.plugins.module_utils.openai_client import (
    ApiError, reasoning_of, sized_prompt, tiny_png)

QUESTION = "用一句话介绍你自己，并计算 17*23"
ANSWER = "391"
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city"}},
                   "required": ["city"]}}}
# the smoke checks, run unless asked otherwise
ALL = ("health", "models", "chat", "reasoning", "tool_call", "image", "long_prompt", "stream")
# and what may be asked: also `token`, the one-token request status and the gateway agent send (`chat` answers more)
CHOICES = ALL[:2] + ("token",) + ALL[2:]


def row(name, ok, detail, latency):
    return {"name": name, "ok": bool(ok), "detail": detail, "latency_s": round(latency, 3)}


def _message(resp):
    return ((resp.get("choices") or [{}])[0]).get("message") or {}


def answer_problem(resp, max_tokens):
    """What is wrong with a chat answer that came with HTTP 200, or None: not exactly one choice, a null choice, or its
    token log-probabilities (asked for) missing, not one per generated token (usage.completion_tokens; max_tokens when
    it stopped on length), or not finite numbers."""
    choices = resp.get("choices")
    if not isinstance(choices, list) or len(choices) != 1:
        return "%s choice(s) where one was asked" % (len(choices) if isinstance(choices, list) else "no")
    choice = choices[0]
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        return "its choice is null"
    content = ((choice.get("logprobs") or {}).get("content")) if isinstance(choice.get("logprobs"), dict) else None
    if not content:
        return "no token log-probabilities, which were asked for"
    wanted = (resp.get("usage") or {}).get("completion_tokens")
    if choice.get("finish_reason") == "length":
        wanted = max_tokens
    if wanted is not None and len(content) != int(wanted):
        return "%d token log-probabilities for %s generated tokens" % (len(content), wanted)
    bad = [i for i, t in enumerate(content) if not isinstance(t, dict) or isinstance(t.get("logprob"), bool)
           or not isinstance(t.get("logprob"), (int, float)) or math.isnan(t["logprob"]) or math.isinf(t["logprob"])]
    if bad:
        return "%d of %d token log-probabilities are not finite (first at token %d)" % (len(bad), len(content), bad[0])
    return None


def run_checks(client, model=None, checks=ALL, health_path="/health", long_prompt_tokens=8000, max_tokens=256,
               models_client=None, budget=None, clock=time.time):
    """-> (rows, model). Later checks reuse what earlier ones learned (the model name, the chat answer).
    `models_client`: where to ask for /v1/models when the front door has none (the vllm-ascend v0.23.0 PD
    proxy serves no /v1/models: its routes are completions, chat, healthcheck, reset_prefix_cache, instances).
    `budget`: seconds all the checks together may take; a frozen engine fails the checks within it (each request
    gets at most what is left) and the ones after it are not run, rather than every check waiting its timeout."""
    rows = []
    state = {"model": model, "chat": None}
    deadline = clock() + budget if budget else None
    per_request = client.timeout

    def check(name, fn):
        if name not in checks:
            return
        if deadline is not None:
            left = deadline - clock()
            if left < 1:
                rows.append(row(name, False, "not run: the checks' budget of %ds was spent (a frozen or very slow "
                                             "service?)" % budget, 0))
                return
            for c in (client, models_client):
                if c is not None:
                    c.timeout = min(per_request, left)
        t0 = clock()
        try:
            ok, detail = fn()
        except ApiError as e:
            ok, detail = False, str(e)
        except (ValueError, KeyError, TypeError, IndexError) as e:
            ok, detail = False, "unexpected answer: %s: %s" % (type(e).__name__, e)
        rows.append(row(name, ok, detail, clock() - t0))

    def health():
        status, text, _s = client.get(health_path)
        return status == 200, "%s -> %s" % (health_path, status if status is not None else text)

    def models():
        status, text, _s = client.get("/v1/models")
        where = ""
        if status == 404 and models_client is not None:
            status, text, _s = models_client.get("/v1/models")
            where = " (the front door has no /v1/models; asked %s)" % models_client.base
        if status != 200:
            return False, "/v1/models -> %s: %s%s" % (status, text[:200], where)
        ids = [m["id"] for m in json.loads(text)["data"]]
        if state["model"] is None and ids:
            state["model"] = ids[0]
        return state["model"] in ids, "serves %s%s" % (", ".join(ids), where)

    def token():
        resp, _s = client.post("/v1/completions", one_token_request(state["model"]))
        came = token_came(resp)
        return came, "a token" if came else "an answer without a token: %s" % str(resp)[:200]

    def chat_once():
        if state["chat"] is None:
            # with log-probabilities: "An HTTP 200 response alone is not a sufficient pass condition" (the vLLM-Ascend
            # Kimi-K3 guide, vllm-ascend #14454: one non-null choice, the requested number of finite log-probabilities)
            state["chat"], _s = client.post("/v1/chat/completions", {
                "model": state["model"], "messages": [{"role": "user", "content": QUESTION}],
                "max_tokens": max_tokens, "temperature": 0, "logprobs": True})
        return state["chat"]

    def chat():
        resp = chat_once()
        whole = answer_problem(resp, max_tokens)
        if whole:
            return False, "HTTP 200, but %s (an HTTP 200 alone is no pass: the vLLM-Ascend Kimi-K3 guide)" % whole
        content = _message(resp).get("content") or ""
        if ANSWER in content:
            return True, "answer: %s" % content[:160].replace("\n", " ")
        return False, ("wrong answer (17*23 is %s; garbage like this usually means HCCL runs without device "
                       "addresses: /etc/hccn.conf on every node, see preflight): %s"
                       % (ANSWER, content[:160].replace("\n", " ")))

    def reasoning():
        msg = _message(chat_once())
        thought, content = reasoning_of(msg), msg.get("content") or ""
        ok = bool(thought) and thought.strip() not in content
        return ok, ("reasoning apart from the answer: %s" % thought[:120]) if ok else \
            "no separate reasoning (message.reasoning, or reasoning_content on older servers; is --reasoning-parser " \
            "set?)"

    def tool_call():
        resp, _s = client.post("/v1/chat/completions", {
            "model": state["model"], "tools": [WEATHER_TOOL], "tool_choice": "auto", "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "What's the weather like in Beijing today?"}]})
        choice = resp["choices"][0]
        calls = (choice.get("message") or {}).get("tool_calls") or []
        if choice.get("finish_reason") != "tool_calls" or not calls:
            return False, "finish_reason %s, %d tool calls (is --tool-call-parser / --enable-auto-tool-choice set?)" \
                % (choice.get("finish_reason"), len(calls))
        fn = calls[0]["function"]
        args = json.loads(fn["arguments"])
        return fn["name"] == "get_weather" and bool(args.get("city")), "%s(%s)" % (fn["name"], fn["arguments"])

    def image():
        url = "data:image/png;base64," + base64.b64encode(tiny_png()).decode()
        resp, _s = client.post("/v1/chat/completions", {
            "model": state["model"], "max_tokens": max_tokens, "messages": [{"role": "user", "content": [
                {"type": "text", "text": "Describe this image in one sentence."},
                {"type": "image_url", "image_url": {"url": url}}]}]})
        content = _message(resp).get("content") or ""
        return bool(content.strip()), "answer: %s" % content[:160]

    def long_prompt():
        # sized in the engine's tokens (its /tokenize), not in words: a tokenizer makes more tokens than words
        filler, _count, how = sized_prompt(client, state["model"], long_prompt_tokens)
        prompt = filler + "\n\n" + QUESTION
        resp, _s = client.post("/v1/chat/completions", {
            "model": state["model"], "max_tokens": max_tokens, "messages": [{"role": "user", "content": prompt}]})
        used = (resp.get("usage") or {}).get("prompt_tokens", 0)
        content = _message(resp).get("content") or ""
        ok = used >= long_prompt_tokens * (0.9 if how == "tokenize" else 0.3) and ANSWER in content
        return ok, "%d prompt tokens (sized by %s); answer: %s" % (used, how, content[:100])

    def stream():
        out = client.stream("/v1/chat/completions", {
            "model": state["model"], "max_tokens": max_tokens, "messages": [{"role": "user", "content": QUESTION}]})
        usage = out["usage"] or {}
        ok = out["chunks"] > 1 and out["ttft"] is not None and ANSWER in out["text"] and \
            usage.get("completion_tokens") == out["chunks"]
        return ok, "TTFT %.3fs, %d chunks, %s completion tokens in the usage chunk, finish %s" % (
            out["ttft"] or -1, out["chunks"], usage.get("completion_tokens", "no"), out["finish_reason"])

    for name, fn in (("health", health), ("models", models), ("token", token), ("chat", chat), ("reasoning", reasoning),
                     ("tool_call", tool_call), ("image", image), ("long_prompt", long_prompt), ("stream", stream)):
        check(name, fn)
    return rows, state["model"]
