"""The simulated engine under load, against `vllm serve` of the stand-in on loopback: it saturates like vLLM's V1
scheduler (max_num_seqs, a KV cache of blocks with prefix caching and eviction), and what npuops reads of a busy
engine - the gateway agent's verdict, status's progress - tells busy from wedged."""
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from ansible_collections.npuops.ascend.plugins.module_utils import bench, status
from ansible_collections.npuops.ascend.plugins.module_utils.openai_client import Client, metric_totals
from npuops_sim import loopback
from npuops_sim.loopback import Loopback

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
AGENT = os.path.join(REPO, "collections/ansible_collections/npuops/ascend/roles/gateway/files/npuops_gateway_agent.py")


@pytest.fixture(scope="module")
def lb(tmp_path_factory):
    node = Loopback(tmp_path_factory.mktemp("load"))
    yield node
    node.close()


def metrics(engine):
    with urllib.request.urlopen(engine.url + "/metrics", timeout=10) as r:
        return r.read().decode()


def ttft(engine, prompt="hello there", out=8):
    t0 = time.time()
    status_code, raw = loopback.post(engine.url + "/v1/completions", {
        "model": "kimi-k3", "prompt": prompt, "max_tokens": out, "ignore_eos": True, "stream": True}, timeout=120)
    assert status_code == 200, raw[:300]
    return time.time() - t0


def load(engine, n, out, stop=None, prompt="load"):
    """`n` clients, each sending completions of `out` tokens one after another until `stop` is set (or once)."""
    failures = []

    def client():
        while True:
            code, raw = loopback.post(engine.url + "/v1/completions", {
                "model": "kimi-k3", "prompt": prompt, "max_tokens": out, "ignore_eos": True}, timeout=300)
            if code != 200:
                failures.append(raw[:200])
            if stop is None or stop.is_set():
                return
    threads = [threading.Thread(target=client, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads, failures


def test_at_three_times_max_num_seqs_requests_wait_and_the_first_token_comes_later(lb):
    """vLLM's scheduler runs at most max_num_seqs requests; the others wait in its queue (vllm:num_requests_waiting)
    and their first token waits with them."""
    engine = lb.engine("--max-num-seqs", "4", env={"NPUOPS_SIM_TPOT": "0.01"})
    alone = ttft(engine)
    threads, failures = load(engine, 12, 200)
    time.sleep(0.5)
    text = metrics(engine)
    totals = metric_totals(text, ["vllm:num_requests_running", "vllm:num_requests_waiting"])
    loaded = ttft(engine)
    for t in threads:
        t.join(120)
    assert totals["vllm:num_requests_running"] == 4 and totals["vllm:num_requests_waiting"] >= 7, totals
    assert loaded > 5 * alone and loaded > 0.5, (alone, loaded)
    assert not failures
    engine.proc.terminate()


def agentic(engine, sessions, context):
    point = {"name": "a", "series": "a", "kind": "multi_turn", "concurrency": sessions, "sessions": sessions,
             "turns": 4, "output_len": 16, "context_tokens": context}
    client = Client(engine.url, timeout=300)
    return bench.run_point(point, client, "kimi-k3", None, None, [client])


def test_agentic_sessions_keep_their_prefix_while_they_fit_the_kv_cache_and_lose_it_when_they_do_not(lb):
    """The field report's collapse in small: an 18,000-token KV cache holds two sessions of 3,000 tokens with room to
    spare (follow-up turns hit >= 0.9) but not four of 8,000 (each turn evicts the others' prefixes: <= 0.2)."""
    engine = lb.engine("--max-num-seqs", "8", "--block-size", "16", "--max-model-len", "16384",
                       env={"NPUOPS_SIM_KV_TOKENS": "18000"})
    fits = agentic(engine, 2, 3000)
    assert fits["failed"] == 0 and fits["npuops"]["follow_up_hit_rate"] >= 0.9, fits["npuops"]
    assert all(2900 <= n <= 3000 for n in fits["context_tokens_counted"])  # sized by the engine's /tokenize
    overflows = agentic(engine, 4, 8000)
    assert overflows["failed"] == 0 and overflows["npuops"]["follow_up_hit_rate"] <= 0.2, overflows["npuops"]
    engine.proc.terminate()


def set_fault(lb, fault):
    with open(lb.profile) as f:
        profile = json.load(f)
    profile["faults"] = [{"fault": fault}] if fault else []
    with open(lb.profile, "w") as f:
        json.dump(profile, f)


def agent_says(port):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        return s.recv(64).decode().strip()


def test_the_gateway_agent_keeps_a_busy_engine_up_and_takes_a_wedged_one_down(lb, tmp_path):
    """The real agent against a saturated engine: up while requests wait and tokens come; down within its stall
    window once the engine wedges (/health still 200); up again when it steps again. status's progress reading says
    the same."""
    engine = lb.engine("--max-num-seqs", "2", env={"NPUOPS_SIM_TPOT": "0.01"})
    port = loopback.free_port()
    config = tmp_path / "agent.json"
    config.write_text(json.dumps({"bind": "127.0.0.1", "stall_seconds": 2, "interval": 0.5, "probe_timeout": 2,
                                  "probe_every": 1, "servers": [{"name": "a-1", "agent_port": port, "url": engine.url,
                                                                 "model": "kimi-k3"}]}))
    agent = subprocess.Popen([sys.executable, AGENT, str(config)], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    stop = threading.Event()
    try:
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                assert agent_says(port) == "up"
                break
            except OSError:
                time.sleep(0.2)
        threads, failures = load(engine, 6, 100, stop)
        time.sleep(1)
        seen = set()
        for _ in range(8):  # 4 s of a saturated engine
            seen.add(agent_says(port))
            time.sleep(0.5)
        assert seen == {"up"}
        busy = status.progress([engine.url], 1.0)
        assert busy["progressing"] and busy["in_flight"] >= 4 and busy["waiting"] >= 2, busy
        set_fault(lb, "engine_wedge")
        t0, verdict = time.time(), "up"
        while verdict == "up" and time.time() - t0 < 10:
            time.sleep(0.2)
            verdict = agent_says(port)
        assert verdict == "down" and time.time() - t0 < 5, time.time() - t0
        wedged = status.progress([engine.url], 1.0)
        assert not wedged["progressing"] and wedged["in_flight"] >= 4, wedged
        set_fault(lb, None)
        t0 = time.time()
        while agent_says(port) != "up" and time.time() - t0 < 10:
            time.sleep(0.2)
        assert agent_says(port) == "up"
        stop.set()
        for t in threads:
            t.join(60)
        assert not failures
    finally:
        stop.set()
        set_fault(lb, None)
        os.killpg(agent.pid, 15)
        agent.wait(10)
        engine.proc.terminate()


def test_a_wedged_engine_keeps_its_scheduler_gauges_where_its_last_step_left_them(lb):
    """vLLM V1 sets its running/waiting gauges from the stats the engine core sends with each step: a core stuck in a
    collective sends none, so clients that give up on it leave the gauges as they were - what lets status say "no
    progress" with the requests it holds. When it steps again the gauges follow its scheduler again."""
    engine = lb.engine("--max-num-seqs", "2", env={"NPUOPS_SIM_TPOT": "0.02"})
    gone = []

    def impatient():
        # a streaming client that stops reading and hangs up after 3 s, as a client timeout does
        sock = socket.create_connection(("127.0.0.1", int(engine.url.rsplit(":", 1)[1])), timeout=10)
        body = json.dumps({"model": "kimi-k3", "prompt": "wedge", "max_tokens": 2000, "ignore_eos": True,
                           "stream": True}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(3)
        sock.close()
        gone.append(1)
    try:
        threads = [threading.Thread(target=impatient, daemon=True) for _ in range(5)]
        for t in threads:
            t.start()
        time.sleep(1)
        set_fault(lb, "engine_wedge")
        time.sleep(0.6)  # the engine notices within a step (it checks every 0.25 s)
        for t in threads:
            t.join(20)
        assert len(gone) == 5
        time.sleep(1)  # the aborts have reached the scheduler
        wedged = status.progress([engine.url], 1.0)
        assert not wedged["progressing"] and wedged["in_flight"] == 5 and wedged["waiting"] == 3, wedged
        set_fault(lb, None)
        deadline = time.time() + 10
        live = status.progress([engine.url], 0.5)
        while live["in_flight"] and time.time() < deadline:
            live = status.progress([engine.url], 0.5)
        assert live["in_flight"] == 0, live  # the aborted requests are gone once it steps again
    finally:
        set_fault(lb, None)
        engine.proc.terminate()
