"""Conformance of the simulated engine, checked with real clients: the official openai SDK and our own probe and
streaming client, against `vllm serve` of the stand-in on loopback (npuops_sim.loopback: plain processes, no
root). What the real vLLM does is cited at each test; the issue's findings are named (#13 finding N).
"""
import http.client
import json
import os
import re
import urllib.request

import openai
import pytest

from ansible_collections.npuops.ascend.plugins.module_utils import probe
from ansible_collections.npuops.ascend.plugins.module_utils.openai_client import ApiError, Client, metric_totals
from npuops_sim import loopback
from npuops_sim import weights as sim_weights
from npuops_sim.loopback import Loopback

KEY = "sk-npuops-conformance-7f3a"
K3 = ("--reasoning-parser", "kimi_k3", "--tool-call-parser", "kimi_k3", "--enable-auto-tool-choice")


@pytest.fixture(scope="module")
def lb(tmp_path_factory):
    node = Loopback(tmp_path_factory.mktemp("engine"))
    yield node
    node.close()


@pytest.fixture(scope="module")
def engine(lb):
    return lb.engine(*K3, env={"VLLM_API_KEY": KEY})


@pytest.fixture(scope="module")
def sdk(engine):
    return openai.OpenAI(base_url=engine.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def post(url, body, key=KEY):
    return loopback.post(url, body, key)


events = loopback.sse_events


# ---------------------------------------------------------------------------------- every smoke check, SDK

def test_sdk_chat_answers_with_reasoning_apart(sdk):
    """vLLM's ChatMessage carries the reasoning text as `reasoning` (0.23.0 .. 0.32.0; #13 finding 3)."""
    resp = sdk.chat.completions.create(model="kimi-k3", messages=[{"role": "user", "content": probe.QUESTION}],
                                       max_tokens=256)
    msg = resp.choices[0].message
    assert probe.ANSWER in msg.content and resp.choices[0].finish_reason == "stop"
    extra = msg.model_extra
    assert extra.get("reasoning") and "reasoning_content" not in extra
    assert resp.usage.completion_tokens > 0 and resp.usage.prompt_tokens_details is None  # finding 8


def test_sdk_stream_with_usage_and_reasoning_deltas(sdk):
    stream = sdk.chat.completions.create(model="kimi-k3", messages=[{"role": "user", "content": probe.QUESTION}],
                                         max_tokens=256, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    tokens = [c for c in chunks if c.choices and (c.choices[0].delta.content or
                                                  (c.choices[0].delta.model_extra or {}).get("reasoning"))]
    usage = [c.usage for c in chunks if c.usage]
    assert len(usage) == 1 and not chunks[-1].choices and usage[0].completion_tokens == len(tokens)
    assert any((c.choices[0].delta.model_extra or {}).get("reasoning") for c in tokens)
    # the finish reason rides on the last token's chunk: no empty trailing chunk (finding 7)
    assert tokens[-1].choices[0].finish_reason == "stop"
    assert [c for c in chunks if c.choices and c.choices[0].finish_reason] == [tokens[-1]]


def test_sdk_tool_call(sdk):
    resp = sdk.chat.completions.create(model="kimi-k3", tools=[probe.WEATHER_TOOL], tool_choice="auto",
                                       messages=[{"role": "user", "content": "What's the weather like in Beijing?"}])
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].function.name == "get_weather"
    assert json.loads(choice.message.tool_calls[0].function.arguments)["city"] == "Beijing"


def test_sdk_image(sdk):
    import base64
    from ansible_collections.npuops.ascend.plugins.module_utils.openai_client import tiny_png
    url = "data:image/png;base64," + base64.b64encode(tiny_png()).decode()
    resp = sdk.chat.completions.create(model="kimi-k3", messages=[{"role": "user", "content": [
        {"type": "text", "text": "Describe this image."}, {"type": "image_url", "image_url": {"url": url}}]}])
    assert "2x2 PNG" in resp.choices[0].message.content


@pytest.mark.parametrize("kwargs,error,param,text", [
    # _check_model (vllm/entrypoints/openai/engine/serving.py): 404 NotFoundError, param "model"
    (dict(model="kimi-k2"), openai.NotFoundError, "model", "The model `kimi-k2` does not exist."),
    # SamplingParams._verify_args: VLLMValidationError -> 400 BadRequestError, param "max_tokens"
    (dict(max_tokens=0), openai.BadRequestError, "max_tokens", "max_tokens must be at least 1, got 0."),
    # vllm/renderers/params.py (0.27.1: max_model_len - max_tokens is the room for the prompt)
    (dict(max_tokens=40000), openai.BadRequestError, "input_tokens", "This model's maximum context length is 32768"),
])
def test_sdk_errors_have_vllms_shape(sdk, kwargs, error, param, text):
    """{"error": {message, type, param, code}} (create_error_response; #13 finding 5)."""
    args = dict(model="kimi-k3", messages=[{"role": "user", "content": "hi"}])
    args.update(kwargs)
    with pytest.raises(error) as e:
        sdk.chat.completions.create(**args)
    body = e.value.response.json()["error"]
    assert body["param"] == param and text in body["message"] and body["code"] == e.value.status_code
    assert body["type"] == {404: "NotFoundError", 400: "BadRequestError"}[e.value.status_code]


def test_sdk_wrong_key_is_401(engine):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=engine.url + "/v1", api_key="sk-wrong", max_retries=0).models.list()


# ---------------------------------------------------------------------------------- our clients

def test_our_probe_passes_every_check_on_the_engine(engine):
    rows, model = probe.run_checks(Client(engine.url, KEY, timeout=60), long_prompt_tokens=3000)
    assert model == "kimi-k3" and [r["name"] for r in rows if not r["ok"]] == [], rows


def test_our_stream_counts_reasoning_tokens_from_the_first(engine):
    """On real vLLM the thinking streams as `reasoning` deltas: a client that reads only reasoning_content takes
    the first *answer* token for TTFT and misses the thinking tokens (#13 finding 3)."""
    client = Client(engine.url, KEY, timeout=60)
    out = client.stream("/v1/chat/completions", {"model": "kimi-k3", "max_tokens": 256,
                                                  "messages": [{"role": "user", "content": probe.QUESTION}]})
    full, _s = client.post("/v1/chat/completions", {"model": "kimi-k3", "max_tokens": 256,
                                                    "messages": [{"role": "user", "content": probe.QUESTION}]})
    msg = full["choices"][0]["message"]
    assert out["reasoning"] == msg["reasoning"] and out["text"] == msg["content"]
    assert out["chunks"] == out["usage"]["completion_tokens"] == full["usage"]["completion_tokens"]
    assert len(out["itls"]) == out["chunks"] - 1


def test_our_client_names_vllms_error_message(engine):
    with pytest.raises(ApiError) as e:
        Client(engine.url, KEY).post("/v1/chat/completions", {"model": "nope", "messages": [
            {"role": "user", "content": "hi"}]})
    assert e.value.status == 404 and "The model `nope` does not exist. (NotFoundError)" in str(e.value)


# ---------------------------------------------------------------------------------- smaller findings (8)

def test_keep_alive_survives_a_401(engine):
    """uvicorn reads the refused request's body: the next request on the same connection is served."""
    host, port = engine.url.rsplit("/", 1)[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    body = json.dumps({"model": "kimi-k3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    conn.request("POST", "/v1/chat/completions", body, {"Authorization": "Bearer wrong",
                                                        "Content-Type": "application/json"})
    first = conn.getresponse()
    assert first.status == 401 and json.loads(first.read()) == {"error": "Unauthorized"}
    conn.request("POST", "/v1/chat/completions", body, {"Authorization": "Bearer " + KEY,
                                                        "Content-Type": "application/json"})
    second = conn.getresponse()
    assert second.status == 200 and json.loads(second.read())["object"] == "chat.completion"
    conn.close()


def test_no_usage_chunk_without_stream_options(engine):
    status, raw = post(engine.url + "/v1/completions", {"model": "kimi-k3", "prompt": "a b c", "max_tokens": 5,
                                                        "stream": True})
    assert status == 200 and not [e for e in events(raw) if "usage" in e]
    status, raw = post(engine.url + "/v1/completions", {"model": "kimi-k3", "prompt": "a b c", "max_tokens": 5,
                                                        "stream": True, "stream_options": {"include_usage": True}})
    assert [e["usage"]["completion_tokens"] for e in events(raw) if "usage" in e] == [5]


def test_cached_tokens_only_with_enable_prompt_tokens_details(lb, engine):
    prompt = " ".join("w%d" % i for i in range(600))
    for _ in range(2):
        _s, raw = post(engine.url + "/v1/completions", {"model": "kimi-k3", "prompt": prompt, "max_tokens": 2})
    assert "prompt_tokens_details" not in json.loads(raw)["usage"]
    detailed = lb.engine("--enable-prompt-tokens-details")
    for _ in range(2):
        _s, raw = post(detailed.url + "/v1/completions", {"model": "kimi-k3", "prompt": prompt, "max_tokens": 2})
    assert json.loads(raw)["usage"]["prompt_tokens_details"]["cached_tokens"] == 512  # 4 full blocks of 128


def test_streamed_text_keeps_its_whitespace(engine):
    body = {"model": "kimi-k3", "messages": [{"role": "user", "content": probe.QUESTION}], "max_tokens": 256}
    _s, raw = post(engine.url + "/v1/chat/completions", body)
    whole = json.loads(raw)["choices"][0]["message"]
    _s, raw = post(engine.url + "/v1/chat/completions", dict(body, stream=True))
    deltas = [e["choices"][0]["delta"] for e in events(raw) if e["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == whole["content"]
    assert "".join(d.get("reasoning") or "" for d in deltas) == whole["reasoning"]
    assert " " in whole["reasoning"]


def test_metrics_finish_reasons_are_vllms(engine):
    """FINISH_REASON_STRINGS (vllm/v1/engine): stop, length, abort, error, repetition; a parsed tool call is
    `tool_calls` to the client but `stop` to the engine."""
    client = Client(engine.url, KEY)
    before = metric_totals(client.get("/metrics")[1], ["vllm:request_success_total"])
    client.post("/v1/chat/completions", {"model": "kimi-k3", "tools": [probe.WEATHER_TOOL], "messages": [
        {"role": "user", "content": "What's the weather like in Beijing?"}]})
    text = client.get("/metrics")[1]
    reasons = set(line.split('finished_reason="', 1)[1].split('"', 1)[0] for line in text.splitlines()
                  if line.startswith("vllm:request_success_total{"))
    assert reasons == {"stop", "length", "abort", "error", "repetition"}
    assert metric_totals(text, ["vllm:request_success_total"])["vllm:request_success_total"] == \
        before["vllm:request_success_total"] + 1


# ---------------------------------------------------------------------------------- versions (9)

@pytest.mark.parametrize("tag,flags,message", [
    # vLLM 0.23.0 has no kimi_k3 parsers: validate_api_server_args refuses them at server setup
    ("v0.23.0-a3", K3, "KeyError: 'invalid tool call parser: kimi_k3"),
    ("v0.23.0-a3", ("--reasoning-parser", "kimi_k3"), "KeyError: 'invalid reasoning parser: kimi_k3"),
    # TokenizerMode (vllm/config/model.py) of 0.23.0 has no kimi_k3: argparse refuses it
    ("v0.23.0-a3", ("--tokenizer-mode", "kimi_k3"), "argument --tokenizer-mode: invalid choice: 'kimi_k3'"),
    # CacheDType has no int8 in any version
    ("main-a3", ("--kv-cache-dtype", "int8"), "argument --kv-cache-dtype: invalid choice: 'int8'"),
    ("main-a3", ("--reasoning-parser", "no_such_parser"), "invalid reasoning parser: no_such_parser"),
])
def test_the_engine_refuses_what_its_version_lacks(lb, tag, flags, message):
    e = lb.engine(*flags, tag=tag, ready=False)
    e.proc.wait(timeout=60)
    assert e.proc.returncode != 0 and message in e.output()


def test_each_tag_serves_its_own_version(lb):
    for tag, version in (("v0.23.0-a3", "0.23.0"), ("main-a3", "0.27.1"), ("v0.32.0-a3", "0.32.0")):
        e = lb.engine("--reasoning-parser", "kimi_k2", tag=tag)
        assert json.loads(urllib.request.urlopen(e.url + "/version", timeout=10).read())["version"] == version
        e.proc.terminate()


def test_context_overflow_per_version(lb):
    """0.23/0.27 reserve max_tokens out of max_model_len (a prompt plus max_tokens over it is refused); 0.32 clamps
    max_tokens and refuses only a prompt over max_model_len (vllm/renderers/params.py, get_max_tokens)."""
    body = {"model": "kimi-k3", "prompt": "a b c", "max_tokens": 40000}
    old, new = lb.engine(tag="v0.23.0-a3"), lb.engine(tag="v0.32.0-a3")
    status, raw = post(old.url + "/v1/completions", body)
    assert status == 400 and json.loads(raw)["error"]["param"] == "input_tokens"
    status, raw = post(new.url + "/v1/completions", dict(body, ignore_eos=True, max_tokens=70))
    assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 70
    status, raw = post(new.url + "/v1/completions", dict(body, prompt=" ".join(["x"] * 33000)))
    assert status == 400 and "exceeds this limit even without any output tokens" in json.loads(raw)["error"]["message"]


def test_every_served_name_is_accepted_and_the_first_answers(lb):
    """vLLM's --served-model-name takes several names (nargs="+"): /v1/models lists each, a request may name any,
    and every answer names the first (vllm/entrypoints/openai/serving_models.py: is_base_model, model_name()).
    What a replica on other weights behind the gateway relies on: its own name answers, the service's is accepted."""
    canary = lb.engine(served=["kimi-k3-v2", "kimi-k3"])
    sdk = openai.OpenAI(base_url=canary.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    assert [m.id for m in sdk.models.list().data] == ["kimi-k3-v2", "kimi-k3"]
    for asked in ("kimi-k3", "kimi-k3-v2"):
        done = sdk.completions.create(model=asked, prompt="hi", max_tokens=2)
        assert done.model == "kimi-k3-v2"
        chat = sdk.chat.completions.create(model=asked, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert chat.model == "kimi-k3-v2"
    with pytest.raises(openai.NotFoundError, match="The model `kimi-k3-v1` does not exist."):
        sdk.completions.create(model="kimi-k3-v1", prompt="hi", max_tokens=2)


# ---------------------------------------------------------------------------------- speculative decoding (DSpark)

def dspark(lb, **changes):
    """The Kimi-K3 tutorial's section 5.2 config (draft TP and draft max_model_len to the loopback engine's TP1 and
    32768 tokens) with `changes`; the draft checkpoint is a small one of its own."""
    draft = os.path.join(lb.root, "models", "dspark")
    if not os.path.isdir(draft):
        sim_weights.write_model(draft, 1 << 16, files=1)
    cfg = {"method": "dspark", "model": draft, "num_speculative_tokens": 7, "draft_tensor_parallel_size": 1,
           "max_model_len": 4096, "draft_sample_method": "greedy", "enforce_eager": True}
    cfg.update(changes)
    return ["--speculative-config", json.dumps(dict((k, v) for k, v in cfg.items() if v is not None))]


def test_a_draft_exports_vllms_spec_decode_metrics(lb):
    """vLLM's SpecDecodingProm (vllm/v1/spec_decode/metrics.py): drafts, draft tokens, accepted tokens and accepted
    tokens per position (label `position`, one series per draft position), only when a draft runs."""
    plain = lb.engine()
    assert "spec_decode" not in urllib.request.urlopen(plain.url + "/metrics", timeout=10).read().decode()
    plain.proc.terminate()
    e = lb.engine(*dspark(lb))
    sdk = openai.OpenAI(base_url=e.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    done = sdk.completions.create(model="kimi-k3", prompt="hi", max_tokens=200, extra_body={"ignore_eos": True})
    assert done.usage.completion_tokens == 200
    text = urllib.request.urlopen(e.url + "/metrics", timeout=10).read().decode()
    names = ["vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
             "vllm:spec_decode_num_accepted_tokens_total"]
    got = metric_totals(text, names)
    drafts, proposed, accepted = (got[n] for n in names)
    # 199 tokens after the prefill's first: each verify step emits its accepted draft tokens plus one of its own
    assert drafts > 0 and proposed == 7 * drafts and drafts + accepted == 199, got
    per_pos = [float(m[1]) for m in re.findall(
        r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{engine="0",model_name="kimi-k3",position="(\d+)"\} '
        r'(\S+)$', text, re.M)]
    assert len(per_pos) == 7 and sum(per_pos) == accepted
    assert per_pos == sorted(per_pos, reverse=True) and per_pos[0] > 0  # a later position needs the earlier ones


@pytest.mark.parametrize("changes, message", [
    ({"num_speculative_tokens": 0}, "ValueError: Expected num_speculative_tokens to be greater than zero (0)."),
    ({"num_speculative_tokens": 16}, "npu_fused_infer_attention_score TND layout's limit of 16"),
    ({"draft_tensor_parallel_size": 2}, "speculative_draft_tensor_parallel_size=2 cannot be other value than 1 or "
                                        "target model tensor_parallel_size"),
    ({"max_model_len": 65536}, "speculative_max_model_len=65536 cannot be larger than target_max_model_len=32768"),
    ({"model": "/nonexistent/dspark"}, "OSError: /nonexistent/dspark does not exist"),
    ({"num_draft_tokens": 7}, "1 validation error for SpeculativeConfig"),
])
def test_the_engine_refuses_a_speculative_config_as_vllm_does(lb, changes, message):
    e = lb.engine(*dspark(lb, **changes), ready=False)
    e.proc.wait(timeout=60)
    assert e.proc.returncode != 0 and message in e.output(), e.output()[-2000:]


def test_chat_log_probabilities_as_vllm_returns_them_and_the_probe_fails_a_200_without_finite_ones(lb, sdk, engine):
    """vLLM's chat logprobs (ChatCompletionLogProbs: content, one entry per generated token with token, logprob, bytes,
    top_logprobs), read with the SDK; the validate stage's chat check asks for them ("An HTTP 200 response alone is
    not a sufficient pass condition", the vLLM-Ascend Kimi-K3 guide) and fails when a non-finite tensor makes them
    null (the fault nonfinite), naming the check."""
    r = sdk.chat.completions.create(model="kimi-k3", messages=[{"role": "user", "content": "What is 17*23?"}],
                                    max_tokens=64, temperature=0, logprobs=True, top_logprobs=1)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens and all(t.logprob <= 0 for t in content)
    assert all(len(t.top_logprobs) == 1 for t in content)
    plain = sdk.chat.completions.create(model="kimi-k3", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    assert plain.choices[0].logprobs is None  # not asked, none given
    with open(lb.profile) as f:
        profile = json.load(f)
    try:
        profile["faults"] = [{"fault": "nonfinite"}]
        with open(lb.profile, "w") as f:
            json.dump(profile, f)
        rows, _model = probe.run_checks(Client(engine.url, KEY, timeout=60), checks=["chat"])
    finally:
        profile["faults"] = []
        with open(lb.profile, "w") as f:
            json.dump(profile, f)
    assert rows[0]["name"] == "chat" and not rows[0]["ok"]
    assert rows[0]["detail"].startswith("HTTP 200, but ") and "token log-probabilities are not finite" in \
        rows[0]["detail"], rows[0]
    rows, _model = probe.run_checks(Client(engine.url, KEY, timeout=60), checks=["chat"])
    assert rows[0]["ok"], rows[0]


def test_a_jemalloc_preload_crashes_an_engine_of_the_line_that_refuses_it(lb):
    """vllm-ascend #17155: "The current Kimi K3 configuration on Atlas 800 A3 with vLLM-Ascend v0.27.1rc does not
    support LD_PRELOAD=/usr/lib64/libjemalloc.so.2". The v0.27.1rc stand-in crashes at start with it (SIGSEGV;
    upstream published no log), the main line's serves; the deviation no_jemalloc_preload's empty value serves."""
    import signal
    jemalloc = {"LD_PRELOAD": "/usr/lib64/libjemalloc.so.2"}
    crashed = lb.engine(*K3, tag="v0.27.1rc1-a3", env=jemalloc, ready=False)
    crashed.proc.wait(60)
    assert crashed.proc.returncode == -signal.SIGSEGV, (crashed.proc.returncode, crashed.output()[-2000:])
    assert "Fatal Python error: Segmentation fault" in crashed.output()
    for tag, env in (("main-a3", jemalloc), ("v0.27.1rc1-a3", {"LD_PRELOAD": ""})):
        served = lb.engine(*K3, tag=tag, env=env)
        assert served.proc.poll() is None
        served.proc.terminate()
        served.proc.wait(30)
