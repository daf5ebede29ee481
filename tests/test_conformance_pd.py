"""Conformance of the simulated PD proxy (vllm-ascend's load_balance_proxy_server_example.py, lines v0.23.0 and
main) and of a prefill/decode engine pair behind it, checked with the official openai SDK and our own clients,
on loopback (npuops_sim.loopback). The real script's behaviour is cited in the stand-in's docstring.
"""
import json
import urllib.error
import urllib.request

import openai
import pytest

from ansible_collections.npuops.ascend.plugins.module_utils import bench, probe
from ansible_collections.npuops.ascend.plugins.module_utils.openai_client import ApiError, Client, metric_totals
from npuops_sim.loopback import Loopback, free_port, post

KEY = "sk-npuops-pd-conformance-91c2"
K3 = ("--reasoning-parser", "kimi_k3", "--tool-call-parser", "kimi_k3", "--enable-auto-tool-choice")


def kv_config(role, port):
    return json.dumps({"kv_connector": "MooncakeConnectorV1", "kv_role": role, "kv_port": str(port),
                       "engine_id": role, "kv_connector_extra_config": {"prefill": {"dp_size": 1, "tp_size": 1},
                                                                        "decode": {"dp_size": 1, "tp_size": 1}}})


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    lb = Loopback(tmp_path_factory.mktemp("pd"))
    try:
        env = {"VLLM_API_KEY": KEY}
        prefill = lb.engine(*K3 + ("--kv-transfer-config", kv_config("kv_producer", free_port())), env=env)
        decode = lb.engine(*K3 + ("--kv-transfer-config", kv_config("kv_consumer", free_port()),
                                  "--no-enable-prefix-caching"), env=env)
        keyed = {"OPENAI_API_KEY": KEY}
        yield {"lb": lb, "prefill": prefill, "decode": decode,
               "v0.23.0": lb.proxy([prefill], [decode], tag="v0.23.0-a3", env=keyed),
               "main": lb.proxy([prefill], [decode], tag="main-a3", env=keyed),
               "v0.23.0-nokey": lb.proxy([prefill], [decode], tag="v0.23.0-a3"),
               "main-nokey": lb.proxy([prefill], [decode], tag="main-a3")}
    finally:
        lb.close()


def sdk(url, key=KEY):
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)


def raw_post(url, body, key=KEY):
    return post(url, body, key)


CHAT = dict(model="kimi-k3", messages=[{"role": "user", "content": probe.QUESTION}], max_tokens=256)


# ---------------------------------------------------------------------------------- the key (#13 finding 1)

@pytest.mark.parametrize("line", ["v0.23.0", "main"])
def test_the_proxy_sends_its_own_key_and_ignores_the_clients(pd, line):
    """auth_headers(): `Bearer $OPENAI_API_KEY` from the proxy's environment, whatever the client sent."""
    resp = sdk(pd[line].url, key="sk-anything-the-client-sends").chat.completions.create(**CHAT)
    assert probe.ANSWER in resp.choices[0].message.content


@pytest.mark.parametrize("line,error", [("v0.23.0", openai.InternalServerError), ("main", openai.AuthenticationError)])
def test_without_its_own_key_the_proxy_fails_even_for_the_right_client_key(pd, line, error):
    """The engines get `Bearer None`: v0.23.0 lets the prefill's 401 escape as a 500, main forwards the 401."""
    with pytest.raises(error):
        sdk(pd[line + "-nokey"].url).chat.completions.create(**CHAT)
    assert KEY not in pd[line + "-nokey"].output()


# ---------------------------------------------------------------------------------- routes (finding 4)

def test_v023_proxy_has_no_models_route_and_our_probe_asks_an_engine(pd):
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(pd["v0.23.0"].url + "/v1/models", timeout=10)
    assert e.value.code == 404
    assert [m.id for m in sdk(pd["main"].url).models.list()] == ["kimi-k3"]
    rows, model = probe.run_checks(Client(pd["v0.23.0"].url, KEY, timeout=60), health_path="/healthcheck",
                                   long_prompt_tokens=2000, models_client=Client(pd["prefill"].url, KEY))
    assert model == "kimi-k3" and [r["name"] for r in rows if not r["ok"]] == [], rows
    models = [r for r in rows if r["name"] == "models"][0]
    assert "the front door has no /v1/models; asked %s" % pd["prefill"].url in models["detail"]


def test_our_probe_passes_every_check_through_the_main_proxy(pd):
    rows, _model = probe.run_checks(Client(pd["main"].url, KEY, timeout=60), health_path="/healthcheck",
                                    long_prompt_tokens=2000)
    assert [r["name"] for r in rows if not r["ok"]] == [], rows


# ---------------------------------------------------------------------------------- errors (finding 5)

@pytest.mark.parametrize("line", ["v0.23.0", "main"])
def test_a_decode_side_refusal_is_200_with_an_empty_body(pd, line):
    """max_tokens 0: the prefill copy has max_tokens 1 and passes; the decode side refuses after the
    StreamingResponse started, so the client sees 200 and nothing."""
    status, body = raw_post(pd[line].url + "/v1/chat/completions", dict(CHAT, max_tokens=0))
    assert (status, body) == (200, b"")
    with pytest.raises(ApiError) as e:
        Client(pd[line].url, KEY).post("/v1/chat/completions", dict(CHAT, max_tokens=0))
    assert "empty body with HTTP 200" in str(e.value) and "decode side refused" in str(e.value)


def test_a_prefill_side_refusal_per_line(pd):
    """v0.23.0: 500 Internal Server Error; main: the engine's status and body (PR #12097)."""
    status, body = raw_post(pd["v0.23.0"].url + "/v1/chat/completions", dict(CHAT, model="kimi-k2"))
    assert (status, body) == (500, b"Internal Server Error")
    with pytest.raises(openai.NotFoundError) as e:
        sdk(pd["main"].url).chat.completions.create(**dict(CHAT, model="kimi-k2"))
    assert e.value.response.json()["error"]["param"] == "model"


# ---------------------------------------------------------------------------------- smoke checks, SDK

def test_sdk_smoke_checks_through_the_main_proxy(pd):
    client = sdk(pd["main"].url)
    resp = client.chat.completions.create(**CHAT)
    assert probe.ANSWER in resp.choices[0].message.content and resp.choices[0].message.model_extra["reasoning"]
    # main writes the prefill's cached_tokens into the decode's usage, 0 when the prefill reported none
    assert resp.usage.prompt_tokens_details.cached_tokens == 0
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **CHAT))
    tokens = [c for c in chunks if c.choices and (c.choices[0].delta.content or
                                                  (c.choices[0].delta.model_extra or {}).get("reasoning"))]
    assert chunks[-1].usage.completion_tokens == len(tokens) and not chunks[-1].choices
    calls = client.chat.completions.create(model="kimi-k3", tools=[probe.WEATHER_TOOL], messages=[
        {"role": "user", "content": "What's the weather like in Beijing?"}])
    assert calls.choices[0].finish_reason == "tool_calls"


# ---------------------------------------------------------------------------------- prefix cache (finding 6)

def test_pulled_kv_is_no_prefix_cache_hit(pd):
    """The decode engine (prefix caching off) records no prefix-cache stats; the KV it pulls counts under
    vllm:external_prefix_cache_* (vllm/v1/core/sched/scheduler.py). The hit rate the bench reports is the
    prefill engine's own."""
    engines = [Client(pd["prefill"].url, KEY), Client(pd["decode"].url, KEY)]
    prefill_before = bench.prefix_counters(engines[:1])
    point = {"name": "agentic", "kind": "multi_turn", "concurrency": 2, "sessions": 2, "turns": 3,
             "output_len": 8, "context_tokens": 700}
    result = bench.run_point(point, Client(pd["main"].url, KEY, timeout=60), "kimi-k3", None, None, engines)
    assert result["completed"] == 6 and result["failed"] == 0
    names = ["vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
             "vllm:external_prefix_cache_queries_total", "vllm:external_prefix_cache_hits_total"]
    decode = metric_totals(engines[1].get("/metrics")[1], names)
    assert decode["vllm:prefix_cache_queries_total"] == decode["vllm:prefix_cache_hits_total"] == 0
    assert decode["vllm:external_prefix_cache_hits_total"] == decode["vllm:external_prefix_cache_queries_total"] > 0
    prefill_only = bench.hit_rate(prefill_before, bench.prefix_counters(engines[:1]))
    assert 0 < result["npuops"]["prefix_cache_hit_rate"] == prefill_only < 1
    assert result["npuops"]["external_prefix_cache_hit_rate"] is not None
