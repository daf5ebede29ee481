# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import struct
import zlib

import pytest

from ansible_collections.npuops.ascend.plugins.module_utils import bench
from ansible_collections.npuops.ascend.tests.unit.plugins.module_utils.bench_helpers import FakeEndpoint
from ansible_collections.npuops.ascend.plugins.module_utils.openai_client import (
    filler_words, metric_totals, tiny_png)


POINT = {"name": "agentic-c2", "kind": "multi_turn", "concurrency": 2, "sessions": 3, "turns": 4,
         "output_len": 8, "context_tokens": 50}


def test_multi_turn_resends_the_growing_conversation():
    fake = FakeEndpoint()
    result = bench.multi_turn(fake, "m", POINT)
    assert result["num_prompts"] == 12 and result["completed"] == 12 and result["failed"] == 0
    assert result["sent"] == 12 and result["skipped"] == 0
    assert result["completed_sessions"] == 3 and result["failed_sessions"] == 0
    # within a session every turn carries all earlier turns: the prompt only grows
    by_session = {}
    for s, t, n in zip(result["sessions_of"], result["turns_of"], result["input_lens"]):
        by_session.setdefault(s, []).append((t, n))
    for turns in by_session.values():
        lens = [n for _t, n in sorted(turns)]
        assert lens == sorted(lens) and lens[0] >= 50 and lens[-1] > lens[0] + 3 * 8
    assert result["total_output_tokens"] == 12 * 8
    assert result["mean_tpot_ms"] == pytest.approx(2.0)
    assert all(b["ignore_eos"] and b["max_tokens"] == 8 for b in fake.calls)


def test_a_failed_turn_ends_its_session_and_is_counted():
    fake = FakeEndpoint(fail_calls={2})
    result = bench.multi_turn(fake, "m", POINT)
    assert result["failed"] == 1 and result["failed_sessions"] == 1 and result["completed_sessions"] == 2
    assert result["sent"] + result["skipped"] == 12 and result["skipped"] > 0
    assert result["completed"] + result["failed"] == result["sent"]
    assert sum(1 for e in result["errors"] if e) == 1


def test_planned_counts_requests_and_sessions():
    assert bench.planned(POINT) == {"requests": 12, "sessions": 3}
    assert bench.planned({"kind": "random", "num_prompts": 64}) == {"requests": 64, "sessions": None}


def test_percentiles_interpolate_like_numpy():
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert bench.percentile(values, 50) == 3.0
    assert bench.percentile(values, 99) == pytest.approx(4.0 + 6.0 * 0.96)
    assert bench.percentile([], 99) == 0.0
    s = bench.summarize([1, 2, 3], [4], [], [5, 6])
    assert s["median_ttft_ms"] == 2 and s["p99_tpot_ms"] == 4 and s["mean_itl_ms"] == 0.0 and s["p50_e2el_ms"] == 5.5


def test_random_argv_is_a_vllm_bench_serve_command():
    argv = bench.random_argv({"name": "r", "input_len": 2048, "output_len": 512, "num_prompts": 64,
                              "concurrency": 8, "ignore_eos": True}, "http://h:8000", "kimi-k3", "/tmp/b", "r.json")
    assert argv[:3] == ["vllm", "bench", "serve"]
    opts = dict(zip(argv[3::1], argv[4::1]))
    assert opts["--random-input-len"] == "2048" and opts["--max-concurrency"] == "8"
    assert opts["--num-prompts"] == "64" and opts["--result-filename"] == "r.json"
    assert "--ignore-eos" in argv and "--save-detailed" in argv


class FakeMetrics(object):
    def __init__(self, text, status=200):
        self.text, self.status = text, status

    def get(self, path):
        assert path == "/metrics"
        return self.status, self.text, 0.0


def test_prefix_counters_sum_every_engine_and_give_the_hit_rate():
    a = 'vllm:prefix_cache_queries_total{engine="0"} 100\nvllm:prefix_cache_hits_total{engine="0"} 40\n'
    b = 'vllm:prefix_cache_queries_total{engine="1"} 300\nvllm:prefix_cache_hits_total{engine="1"} 60\n'
    before = bench.prefix_counters([FakeMetrics(a), FakeMetrics(b)])
    spec = dict.fromkeys(("spec_drafts", "spec_draft_tokens", "spec_accepted"), 0.0)
    assert before == dict(spec, queries=400.0, hits=100.0, external_queries=0.0, external_hits=0.0)
    after = dict(spec, queries=600.0, hits=250.0, external_queries=0.0, external_hits=0.0)
    assert bench.hit_rate(before, after) == 0.75
    assert bench.hit_rate(before, after, "external_") is None
    assert bench.prefix_counters([FakeMetrics(a), FakeMetrics("", status=404)]) is None  # no partial sums
    assert bench.hit_rate(before, before) is None
    assert bench.spec_decode(before, after) is None  # no draft ran


def test_a_drafts_acceptance_is_vllms_over_every_engine():
    """vLLM's definitions (vllm/v1/spec_decode/metrics.py): acceptance rate = accepted / draft tokens, mean acceptance
    length = 1 + accepted / drafts; summed over the serving engines between the two readings."""
    def engine(n, drafts, proposed, accepted):
        return FakeMetrics('vllm:spec_decode_num_drafts_total{engine="%d"} %d\n'
                           'vllm:spec_decode_num_draft_tokens_total{engine="%d"} %d\n'
                           'vllm:spec_decode_num_accepted_tokens_total{engine="%d"} %d\n'
                           % (n, drafts, n, proposed, n, accepted))
    before = bench.prefix_counters([engine(0, 10, 70, 20), engine(1, 0, 0, 0)])
    after = bench.prefix_counters([engine(0, 60, 420, 120), engine(1, 50, 350, 110)])
    # 100 drafts of 7 tokens, 210 accepted
    assert bench.spec_decode(before, after) == {"drafts": 100, "draft_tokens": 700, "accepted_tokens": 210,
                                                "acceptance_rate": 0.3, "mean_acceptance_length": 3.1}


def test_metric_totals_skip_comments_and_nan():
    text = "# HELP x\nfoo_total{a=\"1\"} 2\nfoo_total{a=\"2\"} 3.5\nfoo_total{a=\"3\"} NaN\nbar 1\n"
    assert metric_totals(text, ["foo_total", "baz"]) == {"foo_total": 5.5, "baz": 0.0}


def test_tiny_png_is_a_valid_png():
    png = tiny_png(3, 2)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (3, 2)
    idat_len = struct.unpack(">I", png[33:37])[0]
    raw = zlib.decompress(png[41:41 + idat_len])
    assert len(raw) == 2 * (1 + 3 * 3)
    mpl_image = pytest.importorskip("matplotlib.image")
    import io
    assert mpl_image.imread(io.BytesIO(png), format="png").shape[:2] == (2, 3)


def test_filler_words_have_the_asked_length_and_differ_by_seed():
    assert len(filler_words(500).split()) == 500
    assert filler_words(50, seed=1) != filler_words(50, seed=2)
    json.dumps(filler_words(10))


def test_pulled_kv_is_counted_apart_from_prefix_cache_hits():
    """A PD decode engine (prefix caching off) reports the KV it pulled under vllm:external_prefix_cache_*
    only; the prefix hit rate is the prefill engines' own."""
    prefill = ('vllm:prefix_cache_queries_total{engine="0"} 1000\nvllm:prefix_cache_hits_total{engine="0"} 650\n'
               'vllm:external_prefix_cache_queries_total{engine="0"} 350\n'
               'vllm:external_prefix_cache_hits_total{engine="0"} 0\n')
    decode = ('vllm:prefix_cache_queries_total{engine="0"} 0\nvllm:prefix_cache_hits_total{engine="0"} 0\n'
              'vllm:external_prefix_cache_queries_total{engine="0"} 1000\n'
              'vllm:external_prefix_cache_hits_total{engine="0"} 1000\n')
    zero = dict.fromkeys(("queries", "hits", "external_queries", "external_hits"), 0.0)
    after = bench.prefix_counters([FakeMetrics(prefill), FakeMetrics(decode)])
    assert bench.hit_rate(zero, after) == 0.65
    assert bench.hit_rate(zero, after, "external_") == round(1000 / 1350.0, 4)


def test_the_key_travels_on_stdin_and_is_exported_to_the_bench_only():
    """The shell the module starts in the container reads the key from stdin and exports it: run here with `env`
    for the engine CLI's `exec -i <container>`, the argv holds no key and the bench's environment does."""
    import subprocess
    secret = "sk-bench-stdin-7a1"
    args, kwargs = bench.exec_argv("env", "ctr", ["printenv", "OPENAI_API_KEY"], secret)
    assert secret not in json.dumps(args) and args[:3] == ["env", "exec", "-i"]
    shell = args[args.index("sh"):]  # what `exec -i ctr` runs inside the container
    out = subprocess.run(shell, input=kwargs["data"] + "\n", capture_output=True, text=True, check=True)
    assert out.stdout.strip() == secret
    assert bench.exec_argv("docker", "ctr", ["cat", "x"]) == (["docker", "exec", "ctr", "cat", "x"], {})


@pytest.mark.parametrize("errors, refused", [
    (["Unauthorized"] * 4, True),  # vllm bench serve: output.error = response.reason
    (["HTTP 401: Unauthorized"] * 2, True),  # our multi-turn driver (ApiError)
    (["Unauthorized", "HTTP 500: boom"], False),
    (["", ""], False),
])
def test_a_point_refused_with_401_is_named(errors, refused):
    assert bench.refused_by_key({"completed": 0, "failed": len(errors), "errors": errors}) is refused
    assert bench.refused_by_key({"completed": 1, "failed": len(errors), "errors": errors}) is False


def test_run_point_fails_naming_the_key_when_every_request_got_401():
    class Refusing(FakeEndpoint):
        base = "http://10.0.0.1:8000"

        def stream(self, path, body):
            raise bench.ApiError("HTTP 401: Unauthorized", 401)
    point = dict(POINT, sessions=2, turns=2)
    with pytest.raises(bench.ApiError, match="401 Unauthorized by http://10.0.0.1:8000: the API key"):
        bench.run_point(point, Refusing(), "m", None, "/tmp", [])


def test_a_random_point_whose_initial_request_is_refused_fails_naming_the_key():
    """vllm bench serve sends one test request first and exits when it fails (its error is the HTTP reason)."""
    class Endpoint(object):
        base = "http://10.0.0.1:8000"

    def refused(argv):
        return 1, "", "ValueError: Initial test run failed - Please make sure benchmark arguments are correctly " \
                      "specified. Error: Unauthorized"
    point = {"name": "random-c2", "kind": "random", "concurrency": 2, "input_len": 8, "output_len": 4,
             "num_prompts": 2, "ignore_eos": True}
    with pytest.raises(bench.ApiError, match="401 Unauthorized by http://10.0.0.1:8000: the API key"):
        bench.run_point(point, Endpoint(), "m", refused, "/tmp", [])


def test_the_access_check_names_the_key_on_401_and_passes_other_errors_on():
    class Endpoint(object):
        base = "http://10.0.0.1:8000"

        def __init__(self, status):
            self.status = status

        def post(self, path, body):
            assert path == "/v1/completions" and body["max_tokens"] == 1
            if self.status:
                raise bench.ApiError("HTTP %d: nope" % self.status, self.status)
            return {}, 0.01
    bench.check_access(Endpoint(None), "m")
    with pytest.raises(bench.ApiError, match="401 Unauthorized by http://10.0.0.1:8000: the API key"):
        bench.check_access(Endpoint(401), "m")
    with pytest.raises(bench.ApiError, match="HTTP 503: nope"):
        bench.check_access(Endpoint(503), "m")


def test_a_prompt_is_sized_in_the_engines_tokens_through_tokenize():
    """A tokenizer makes more tokens than words (here 2 per word): the prompt is sized by what /tokenize counts, within
    3 % under the target; without /tokenize (a PD proxy) at 3 tokens per word, never over it."""
    from ansible_collections.npuops.ascend.plugins.module_utils.openai_client import sized_prompt
    engine = FakeEndpoint(tokens_per_word=2)
    text, counted, how = sized_prompt(engine, "m", 80000, seed=7)
    assert how == "tokenize" and 0.97 * 80000 <= counted <= 80000 and counted == engine.count(text)
    assert engine.tokenized[0]["model"] == "m"
    engine = FakeEndpoint(tokens_per_word=3)
    text, counted, how = sized_prompt(engine, "m", 2000)
    assert 0.97 * 2000 <= counted <= 2000
    proxy = FakeEndpoint(tokens_per_word=3, tokenize=False)
    text, counted, how = sized_prompt(proxy, "m", 2000)
    assert how == "estimate" and counted is None and proxy.count(text) <= 2000


def test_the_agentic_context_is_sized_in_tokens_and_the_follow_up_hit_rate_leaves_out_first_turns():
    point = {"name": "a-c2", "series": "a", "kind": "multi_turn", "concurrency": 2, "sessions": 2, "turns": 3,
             "output_len": 4, "context_tokens": 1000}
    engine = FakeEndpoint(tokens_per_word=2)
    result = bench.multi_turn(engine, "m", point)
    assert result["context_sizing"] == ["tokenize"]
    assert all(970 <= n <= 1000 for n in result["context_tokens_counted"])
    first = [n for n, t in zip(result["input_lens"], result["turn_index"]) if t == 0]
    assert len(first) == 2 and all(970 <= n < 1040 for n in first)
    # the engine's counters around the point: 12 000 prompt tokens asked, 9 000 of them cached
    spec = dict.fromkeys(("spec_drafts", "spec_draft_tokens", "spec_accepted", "external_queries", "external_hits"), 0)
    before = dict(spec, queries=1000.0, hits=0.0)
    queries = float(sum(result["input_lens"]))
    after = dict(spec, queries=1000.0 + queries, hits=0.9 * (queries - sum(first)))
    assert bench.follow_up_hit_rate(before, after, result) == 0.9
    assert bench.follow_up_hit_rate(before, after, {"input_lens": [5], "completed": 1}) is None  # random points
    assert bench.mean_input_tokens(result) == round(queries / 6, 1)
