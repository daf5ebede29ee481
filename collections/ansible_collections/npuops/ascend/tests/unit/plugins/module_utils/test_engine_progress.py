# -*- coding: utf-8 -*-
"""One definition of "the engine serves" (module_utils/engine_progress.py) for its three askers: status, the rollout's
and validate's `token` check (probe.run_checks), and the gateway agent that runs on the gateway host alone."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.npuops.ascend.plugins.module_utils import engine_progress, probe, status
from ansible_collections.npuops.ascend.plugins.module_utils.openai_client import Client

COLLECTION = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
AGENT = os.path.join(COLLECTION, "roles", "gateway", "files", "npuops_gateway_agent.py")
SHARED = os.path.join(COLLECTION, "plugins", "module_utils", "engine_progress.py")


def load_agent():
    spec = importlib.util.spec_from_file_location("npuops_gateway_agent_under_test", AGENT)
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)
    return agent


@pytest.fixture
def recorder():
    """An engine that records each POST body and answers with the completion the test sets."""
    seen, answer = [], {"body": {"choices": [{"text": "4"}], "usage": {"completion_tokens": 1}}}

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            body = answer.get("metrics", "").encode()
            self.send_response(200 if self.path == "/metrics" and body else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            seen.append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
            body = json.dumps(answer["body"]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield "http://127.0.0.1:%d" % srv.server_address[1], seen, answer
    srv.shutdown()


def ask_all(url):
    """What status, the `token` check and the gateway agent each conclude of one engine."""
    rows, _model = probe.run_checks(Client(url, timeout=5), "kimi-k3", ["token"])
    return [status.one_token(url, "kimi-k3", timeout=5)["ok"], rows[0]["ok"],
            load_agent().one_token(url, "kimi-k3", None, 5)]


def test_status_the_token_check_and_the_gateway_agent_send_the_same_one_token_request(recorder):
    url, seen, _answer = recorder
    assert ask_all(url) == [True, True, True]
    assert seen == [("/v1/completions", {"model": "kimi-k3", "prompt": "ping", "max_tokens": 1, "temperature": 0})] * 3


def test_an_answer_without_a_token_is_no_token_to_any_of_them(recorder):
    url, _seen, answer = recorder
    answer["body"] = {"choices": [{"text": ""}], "usage": {"completion_tokens": 0}}
    assert ask_all(url) == [False, False, False]
    answer["body"] = {"choices": [], "usage": {"completion_tokens": 1}}
    assert ask_all(url) == [False, False, False]


def test_the_token_check_runs_only_when_asked():
    assert "token" in probe.CHOICES and "token" not in probe.ALL
    assert [c for c in probe.CHOICES if c != "token"] == list(probe.ALL)


METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="kimi-k3"} 3.0
vllm:num_requests_running{engine="1",model_name="kimi-k3"} 1.0
vllm:num_requests_waiting{engine="0",model_name="kimi-k3"} 2.0
vllm:num_requests_waiting{engine="1",model_name="kimi-k3"} NaN
vllm:generation_tokens_total{engine="0",model_name="kimi-k3"} 120.0
vllm:generation_tokens_total{engine="1",model_name="kimi-k3"} 80.0
vllm:iteration_tokens_total_count{engine="0",model_name="kimi-k3"} 7.0
vllm:iteration_tokens_total_sum{engine="0",model_name="kimi-k3"} 900.0
"""


def test_a_progress_reading_sums_the_dp_ranks_and_leaves_nan_and_other_series_out():
    assert engine_progress.progress_reading(METRICS) == {"running": 4.0, "waiting": 2.0, "generated": 200.0,
                                                         "steps": 7.0}


def test_metrics_without_a_generated_token_counter_are_no_reading():
    assert engine_progress.progress_reading("# a proxy\nproxy_requests_total 5\n") is None
    assert engine_progress.progress_reading("vllm:num_requests_running 1.0\n") is None


def test_the_agent_and_status_read_the_same_progress_from_an_engine(recorder):
    url, _seen, answer = recorder
    agent = load_agent()
    assert agent.read_metrics(url, 5) is None  # no /metrics: HAProxy's HTTP check alone decides
    answer["metrics"] = METRICS
    assert agent.read_metrics(url, 5) == {"running": 4.0, "waiting": 2.0, "generated": (200.0, 7.0)}
    assert status.progress([url], 0.1)["detail"] == "6 requests in flight (2 waiting), 0 tokens and 0 engine steps in 0s"


def test_the_agent_runs_with_only_the_shared_file_beside_it_as_the_gateway_role_installs_them(tmp_path):
    for src in (AGENT, SHARED):
        shutil.copy(src, str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-I", "-c", "import runpy, sys; sys.path.insert(0, %r); "
         "m = runpy.run_path(%r, run_name='installed'); print(m['engine_progress'].__file__)"
         % (str(tmp_path), str(tmp_path / "npuops_gateway_agent.py"))],
        capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(tmp_path / "engine_progress.py")
