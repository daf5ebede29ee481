# -*- coding: utf-8 -*-
"""The OpenAI-compatible client against a real HTTP server on loopback."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from ansible_collections.npuops.ascend.plugins.module_utils.openai_client import ApiError, Client, metric_totals

KEY = "sk-test-123"


class Handler(BaseHTTPRequestHandler):
    seen = []

    def log_message(self, *args):
        pass

    def _send(self, status, body, ctype="application/json"):
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.seen.append(("GET", self.path, self.headers.get("Authorization")))
        self._send(200, json.dumps({"data": [{"id": "kimi-k3"}]}))

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(("POST", self.path, self.headers.get("Authorization")))
        if self.headers.get("Authorization") != "Bearer " + KEY:
            return self._send(401, json.dumps({"message": "invalid API key"}))
        if len(body["messages"][0]["content"]) > 100:
            return self._send(400, json.dumps({"object": "error", "message": "prompt too long for max_model_len"}))
        if not body.get("stream"):
            return self._send(200, json.dumps({"choices": [{"message": {"content": "391"}}]}))
        events = [{"choices": [{"delta": {"reasoning_content": "17*23"}}]},
                  {"choices": [{"delta": {"content": "3"}}]},
                  {"choices": [{"delta": {"content": "91"}, "finish_reason": "stop"}]},
                  {"choices": [], "usage": {"completion_tokens": 3}}]
        stream = "".join("data: %s\n\n" % json.dumps(e) for e in events) + "data: [DONE]\n\n"
        self._send(200, stream, "text/event-stream")


@pytest.fixture
def url():
    Handler.seen = []
    srv = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever)
    thread.daemon = True
    thread.start()
    yield "http://127.0.0.1:%d" % srv.server_address[1]
    srv.shutdown()
    thread.join(5)
    srv.server_close()


def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return "http://127.0.0.1:%d" % port


def chat(content):
    return {"model": "kimi-k3", "messages": [{"role": "user", "content": content}]}


def test_get_and_post_send_the_key_and_parse_the_answer(url):
    client = Client(url, api_key=KEY, timeout=5)
    status, text, _s = client.get("/v1/models")
    assert status == 200 and json.loads(text)["data"][0]["id"] == "kimi-k3"
    answer, _s = client.post("/v1/chat/completions", chat("17*23?"))
    assert answer["choices"][0]["message"]["content"] == "391"
    assert [a for _m, _p, a in Handler.seen] == ["Bearer " + KEY] * 2


def test_http_errors_carry_the_servers_message_for_post_and_stream(url):
    with pytest.raises(ApiError, match=r"^HTTP 401: invalid API key$") as e:
        Client(url, api_key="wrong", timeout=5).post("/v1/chat/completions", chat("hi"))
    assert e.value.status == 401
    with pytest.raises(ApiError, match=r"^HTTP 400: prompt too long for max_model_len$") as e:
        Client(url, api_key=KEY, timeout=5).stream("/v1/chat/completions", chat("x" * 200))
    assert e.value.status == 400


def test_stream_splits_reasoning_from_the_answer_and_times_the_first_token(url):
    out = Client(url, api_key=KEY, timeout=5).stream("/v1/chat/completions", chat("17*23?"))
    assert out["text"] == "391" and out["reasoning"] == "17*23" and out["chunks"] == 3
    assert out["finish_reason"] == "stop" and out["usage"] == {"completion_tokens": 3}
    assert 0 <= out["ttft"] <= out["seconds"] and len(out["itls"]) == 2


def test_nothing_listening_is_no_answer_not_a_crash():
    url = closed_port()
    status, text, _s = Client(url, timeout=2).get("/health")
    assert status is None and text
    for call in (lambda c: c.post("/v1/chat/completions", chat("hi")),
                 lambda c: c.stream("/v1/chat/completions", chat("hi"))):
        with pytest.raises(ApiError, match="no answer from %s/v1/chat/completions" % url):
            call(Client(url, timeout=2))


def test_metric_totals_sum_every_engine_and_skip_nan():
    text = "\n".join([
        "# HELP vllm:prefix_cache_hits_total hits",
        'vllm:prefix_cache_hits_total{engine="0",model_name="kimi-k3"} 30.0',
        'vllm:prefix_cache_hits_total{engine="1",model_name="kimi-k3"} 12',
        "vllm:prefix_cache_queries_total NaN",
        "vllm:num_requests_running 2",
    ])
    assert metric_totals(text, ["vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"]) == {
        "vllm:prefix_cache_hits_total": 42.0, "vllm:prefix_cache_queries_total": 0.0}
