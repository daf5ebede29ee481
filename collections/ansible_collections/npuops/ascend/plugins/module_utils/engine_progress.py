# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What says an engine serves: a one-token completion, and the progress counters of its /metrics.

The one definition of both for every asker: status (module_utils/status.py), the rollout's and the validate role's
checks (openai_probe's `token`), and the gateway agent, which runs on the gateway host without the collection: the
gateway role copies this file beside it. So: Python's standard library only, nothing imported from the collection.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

# what says an engine makes progress: requests in flight, generated tokens, engine steps (vLLM's
# vllm:iteration_tokens_total histogram counts one per step: a long prefill chunk moves it before a token comes out)
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
GENERATED, STEPS = "vllm:generation_tokens_total", "vllm:iteration_tokens_total_count"
PROGRESS_METRICS = (RUNNING, WAITING, GENERATED, STEPS)

# one Prometheus text-format sample: name, optional labels, value
_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+([-+0-9.eE]+|NaN)$")


def _samples(text, names):
    """(name, value) of each sample of `names` in a Prometheus text exposition, NaN left out."""
    for line in text.splitlines():
        m = None if line.startswith("#") else _SAMPLE.match(line.strip())
        if m and m.group(1) in names and m.group(3) != "NaN":
            yield m.group(1), float(m.group(3))


def metric_totals(text, names):
    """Sum of each Prometheus counter/gauge in `names` over all its label sets (all DP engines of one API server)."""
    totals = dict((n, 0.0) for n in names)
    for name, value in _samples(text, names):
        totals[name] += value
    return totals


def progress_reading(text):
    """One engine's /metrics text -> {running, waiting, generated, steps}, or None when it has no generated-token
    counter (not a vLLM engine's metrics: a prefill/decode proxy's, say)."""
    if next(_samples(text, (GENERATED,)), None) is None:
        return None
    t = metric_totals(text, PROGRESS_METRICS)
    return {"running": t[RUNNING], "waiting": t[WAITING], "generated": t[GENERATED], "steps": t[STEPS]}


def one_token_request(model):
    """The body of the one-token completion (POST /v1/completions) every asker sends: the cheapest request that
    goes through the scheduler, the model and the sampler, greedy so that it does not depend on a seed."""
    return {"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0}


def token_came(answer):
    """Whether a /v1/completions answer (parsed JSON) carries a generated token: a choice, and a usage that does not
    say zero completion tokens."""
    if not isinstance(answer, dict):
        return False
    choices = answer.get("choices")
    usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
    return bool(choices) and isinstance(choices, list) and (usage.get("completion_tokens", 1) or 0) >= 1
