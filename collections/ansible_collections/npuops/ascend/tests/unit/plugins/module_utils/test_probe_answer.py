# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.npuops.ascend.plugins.module_utils import probe


def answer(n=3, finish="stop", logprob=-0.1, completion=None, choices=None):
    lp = {"content": [{"token": "t%d" % i, "logprob": logprob, "bytes": [116], "top_logprobs": []} for i in range(n)]}
    choice = {"index": 0, "message": {"role": "assistant", "content": "17*23=391"}, "logprobs": lp,
              "finish_reason": finish}
    return {"choices": [choice] if choices is None else choices,
            "usage": {"completion_tokens": n if completion is None else completion}}


def test_an_answer_passes_with_one_choice_and_one_finite_log_probability_per_generated_token():
    assert probe.answer_problem(answer(), 256) is None
    # stopped on length: as many as max_tokens
    assert probe.answer_problem(answer(8, "length"), 8) is None


def test_an_http_200_alone_is_no_pass():
    """The vLLM-Ascend Kimi-K3 guide (vllm-ascend #14454): one non-null choice and the requested number of finite
    token log-probabilities."""
    assert probe.answer_problem(answer(choices=[None]), 256) == "its choice is null"
    assert probe.answer_problem(answer(choices=[]), 256) == "0 choice(s) where one was asked"
    assert probe.answer_problem({"choices": None}, 256) == "no choice(s) where one was asked"
    two = answer()
    two["choices"] = two["choices"] * 2
    assert probe.answer_problem(two, 256) == "2 choice(s) where one was asked"
    missing = answer()
    missing["choices"][0]["logprobs"] = None
    assert probe.answer_problem(missing, 256) == "no token log-probabilities, which were asked for"
    assert probe.answer_problem(answer(3, completion=5), 256) == "3 token log-probabilities for 5 generated tokens"
    assert probe.answer_problem(answer(3, "length"), 8) == "3 token log-probabilities for 8 generated tokens"
    # NaN serialized as null by vLLM's pydantic; inf and NaN as Python reads them from non-strict JSON
    for bad in (None, float("nan"), float("-inf"), True, "x"):
        assert probe.answer_problem(answer(logprob=bad), 256) == \
            "3 of 3 token log-probabilities are not finite (first at token 0)", bad
