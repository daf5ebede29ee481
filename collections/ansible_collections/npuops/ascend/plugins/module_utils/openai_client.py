# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small client for OpenAI-compatible endpoints (vLLM, the PD proxy): health, models, chat, streaming,
metrics, and the multi-turn sessions the agentic benchmarks replay. Built on ansible's open_url, so it
runs in modules on the nodes and in controller plugins alike."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import socket
import struct
import time
import zlib

from ansible.module_utils.six.moves.urllib.error import HTTPError, URLError
from ansible.module_utils.urls import open_url

from ansible_collections.npuops.ascend.plugins.module_utils.engine_progress import metric_totals


class ApiError(Exception):
    def __init__(self, msg, status=None, body=None):
        Exception.__init__(self, msg)
        self.status = status
        self.body = body


def error_message(text):
    """The message of an error body: vLLM's {"error": {"message", "type", "param", "code"}}, the API-key
    middleware's {"error": "Unauthorized"}, FastAPI's {"detail": ...}, or the text itself."""
    try:
        parsed = json.loads(text)
    except ValueError:
        return text
    if not isinstance(parsed, dict):
        return text
    err = parsed.get("error")
    if isinstance(err, dict):
        msg = err.get("message") or text
        return "%s (%s)" % (msg, err["type"]) if err.get("type") else msg
    return err or parsed.get("message") or parsed.get("detail") or text


def reasoning_of(part):
    """The reasoning text of a message or a stream delta: vLLM names it `reasoning` (ChatMessage,
    DeltaMessage since 0.2x); older servers and other engines `reasoning_content`."""
    return (part or {}).get("reasoning") or (part or {}).get("reasoning_content") or ""


EMPTY_BODY = ("an empty body with HTTP 200: the vllm-ascend PD proxy answers so when the decode side refused the "
              "request (its log says why; check the decode engines' logs and the request's max_tokens/model)")


class Client(object):
    def __init__(self, base_url, api_key=None, timeout=120.0, validate_certs=True):
        self.base = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.validate_certs = validate_certs

    def _open(self, path, body=None):
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        data = json.dumps(body).encode("utf-8") if body is not None else None
        return open_url(self.base + path, data=data, headers=headers, method="POST" if data else "GET",
                        timeout=self.timeout, validate_certs=self.validate_certs)

    def get(self, path):
        """-> (status, text, seconds); status None when nothing answered."""
        t0 = time.time()
        try:
            resp = self._open(path)
            try:
                return resp.status, resp.read().decode("utf-8", "replace"), time.time() - t0
            finally:
                resp.close()
        except HTTPError as e:
            return e.code, e.read().decode("utf-8", "replace"), time.time() - t0
        except (URLError, socket.error, OSError) as e:
            return None, str(getattr(e, "reason", e)), time.time() - t0

    def _request(self, path, body):
        """open_url, with every failure as an ApiError carrying the server's own message."""
        try:
            return self._open(path, body)
        except HTTPError as e:
            text = e.read().decode("utf-8", "replace")
            raise ApiError("HTTP %d: %s" % (e.code, str(error_message(text))[:500]), e.code, text)
        except (URLError, socket.error, OSError) as e:
            raise ApiError("no answer from %s%s: %s" % (self.base, path, getattr(e, "reason", e)))

    def post(self, path, body):
        """-> (parsed JSON, seconds); raises ApiError with the server's message."""
        t0 = time.time()
        resp = self._request(path, body)
        try:
            text = resp.read().decode("utf-8")
            if not text.strip():
                raise ApiError("%s%s returned %s" % (self.base, path, EMPTY_BODY), 200, text)
            return json.loads(text), time.time() - t0
        except (URLError, socket.error, OSError) as e:
            raise ApiError("no answer from %s%s: %s" % (self.base, path, getattr(e, "reason", e)))
        finally:
            resp.close()

    def stream(self, path, body):
        """Streams a chat or completion; -> dict(text, reasoning, chunks, ttft, itls, seconds, finish_reason, usage)."""
        body = dict(body, stream=True, stream_options={"include_usage": True})
        t0 = time.time()
        out = {"text": "", "reasoning": "", "chunks": 0, "ttft": None, "itls": [], "finish_reason": None,
               "usage": None}
        last = None
        events = 0
        resp = self._request(path, body)
        try:
            for raw in resp:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                events += 1
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if event.get("usage"):
                    out["usage"] = event["usage"]
                for choice in event.get("choices") or []:
                    delta = choice.get("delta") or {}
                    piece = delta.get("content") or choice.get("text") or ""
                    thought = reasoning_of(delta)
                    if piece or thought:
                        now = time.time()
                        if out["ttft"] is None:
                            out["ttft"] = now - t0
                        elif last is not None:
                            out["itls"].append(now - last)
                        last = now
                        out["chunks"] += 1
                        out["text"] += piece
                        out["reasoning"] += thought
                    if choice.get("finish_reason"):
                        out["finish_reason"] = choice["finish_reason"]
        finally:
            resp.close()
        if not events:
            raise ApiError("%s%s streamed %s" % (self.base, path, EMPTY_BODY), 200, "")
        out["seconds"] = time.time() - t0
        return out


def engines_totals(clients, names):
    """metric_totals of every engine's GET /metrics summed (each DP or PD front has its own); None when one of them
    has no metrics, so that a partial sum never passes for the whole."""
    totals = dict((n, 0.0) for n in names)
    for client in clients:
        status, text, _s = client.get("/metrics")
        if status != 200:
            return None
        for name, value in metric_totals(text, names).items():
            totals[name] += value
    return totals


def tiny_png(width=2, height=2):
    """A valid RGB PNG of a solid colour (the image check needs neither the network nor an image library)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    raw = b"".join(b"\x00" + b"\x10\x80\xe0" * width for _row in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


# what a filler word costs at most under a real tokenizer when the endpoint cannot count (a word and a number: up to
# three tokens), so that a prompt sized without /tokenize stays within its budget
FILLER_TOKENS_PER_WORD_MAX = 3


def sized_prompt(client, model, target, seed=0, attempts=4):
    """A filler prompt of at most `target` tokens as the served engine counts them: vLLM's POST /tokenize
    (vllm/entrypoints/serve/tokenize: {count, max_model_len, tokens}) on a first guess, then scaled until the count
    is within 3 % under the target. -> (text, tokens counted or None, how: "tokenize" or "estimate"). Without
    /tokenize (a PD proxy has none) the prompt is sized at FILLER_TOKENS_PER_WORD_MAX tokens per word, under the
    target whatever the tokenizer."""
    target = int(target)
    words = max(1, target // 2)
    text, count = filler_words(words, seed), None
    for _attempt in range(attempts):
        try:
            resp, _s = client.post("/tokenize", {"model": model, "prompt": text})
        except ApiError as e:
            if e.status in (404, 405):
                words = max(1, target // FILLER_TOKENS_PER_WORD_MAX)
                return filler_words(words, seed), None, "estimate"
            raise
        count = int(resp["count"])
        if target * 0.97 <= count <= target:
            break
        words = max(1, int(words * target * 0.985 / max(count, 1)))
        text = filler_words(words, seed)
        count = None
    if count is None:
        resp, _s = client.post("/tokenize", {"model": model, "prompt": text})
        count = int(resp["count"])
    return text, count, "tokenize"


def filler_words(n, seed=0):
    """A prompt of n words (distinct words, so prefix caching only helps where prefixes repeat); a tokenizer makes
    more tokens of them: sized_prompt sizes it in tokens."""
    words = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
             "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango")
    return " ".join("%s%d" % (words[(i * 7 + seed) % len(words)], (i + seed) % 97) for i in range(n))
