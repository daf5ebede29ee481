# -*- coding: utf-8 -*-
"""Test helpers for the benchmark driver."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.npuops.ascend.plugins.module_utils.openai_client import ApiError


class FakeEndpoint(object):
    """Stands in for the HTTP client: counts prompt tokens the way a tokenizer that splits on spaces would,
    and fails the requests listed in `fail` ((session-seed, turn) is not known here, so by call number)."""

    def __init__(self, fail_calls=(), tokens_per_word=2, tokenize=True):
        self.calls = []
        self.fail_calls = set(fail_calls)
        self.tokens_per_word = tokens_per_word
        self.tokenize = tokenize
        self.tokenized = []

    def count(self, text):
        return len(text.split()) * self.tokens_per_word

    def post(self, path, body):
        """POST /tokenize as vLLM answers it ({count, max_model_len, tokens}); 404 when the endpoint has none."""
        if path != "/tokenize" or not self.tokenize:
            raise ApiError("HTTP 404: Not Found", 404)
        self.tokenized.append(body)
        n = self.count(body["prompt"])
        return {"count": n, "max_model_len": 1000000, "tokens": list(range(n)), "token_strs": None}, 0.001

    def stream(self, path, body):
        self.calls.append(body)
        if len(self.calls) in self.fail_calls:
            raise ApiError("HTTP 500: engine died")
        prompt = sum(self.count(m["content"]) for m in body["messages"])
        n = body["max_tokens"]
        return {"text": " ".join(["tok"] * n), "reasoning": "", "chunks": n, "ttft": 0.01,
                "itls": [0.002] * (n - 1), "seconds": 0.01 + 0.002 * (n - 1), "finish_reason": "length",
                "usage": {"prompt_tokens": prompt, "completion_tokens": n}}
