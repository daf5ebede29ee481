"""Conformance of the benchmark path: the simulated `vllm bench serve` behaves as the real one of its version, our
bench client passes what the real one needs, our report reads the JSON of every supported version, and vLLM's own
bench request functions (from the registry's vllm package, marker `vllm`: tools/vllm_argcheck.sh runs them with
.venv-vllm) count what our report counts, on the simulated engine (npuops_sim.loopback, no root).
"""
import json
import os
import subprocess

import pytest

from ansible_collections.npuops.ascend.plugins.module_utils import bench
from ansible_collections.npuops.ascend.plugins.module_utils.openai_client import Client
from ansible_collections.npuops.ascend.plugins.modules.vllm_bench import point_errors
from ansible_collections.npuops.ascend.plugins.plugin_utils import report
from npuops_sim.loopback import Loopback

HERE = os.path.dirname(os.path.abspath(__file__))
VLLM_VENV = os.environ.get("NPUOPS_VLLM_VENV", os.path.join(HERE, "..", ".venv-vllm"))
POINT = {"name": "random-c2", "series": "random", "kind": "random", "concurrency": 2, "input_len": 64,
         "output_len": 80, "num_prompts": 4, "ignore_eos": True}


@pytest.fixture(scope="module")
def lb(tmp_path_factory):
    node = Loopback(tmp_path_factory.mktemp("bench"))
    yield node
    node.close()


@pytest.fixture(scope="module")
def engines(lb):
    return dict((tag, lb.engine(tag=tag)) for tag in ("v0.23.0-a3", "main-a3", "v0.32.0-a3"))


def stand_in_bench(lb, tag, tmp_path, *extra):
    out = tmp_path / tag
    proc = lb.vllm(["bench", "serve", "--backend", "vllm", "--base-url", lb_url(lb, tag), "--model", "kimi-k3",
                    "--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "80",
                    "--num-prompts", "4", "--max-concurrency", "2", "--save-result", "--save-detailed",
                    "--result-dir", str(out), "--result-filename", "r.json"] + list(extra), tag=tag)
    return proc, (json.loads((out / "r.json").read_text()) if proc.returncode == 0 else None)


def lb_url(lb, tag):
    return lb.urls[tag]


@pytest.fixture(autouse=True)
def _urls(lb, engines):
    lb.urls = dict((tag, e.url) for tag, e in engines.items())


# ---------------------------------------------------------------------------------- tokenizer (#13 finding 2)

def test_the_bench_loads_its_tokenizer_from_model_unless_told(lb, tmp_path):
    """vllm/benchmarks/serve.py: tokenizer_id = --tokenizer or --model; Kimi's tokenizer is custom code."""
    proc, _r = stand_in_bench(lb, "main-a3", tmp_path)
    assert proc.returncode != 0 and "kimi-k3 is not a local folder" in proc.stdout + proc.stderr
    proc, _r = stand_in_bench(lb, "main-a3", tmp_path, "--tokenizer", lb.model)
    assert proc.returncode != 0 and "trust_remote_code=True" in proc.stdout + proc.stderr
    proc, result = stand_in_bench(lb, "main-a3", tmp_path, "--tokenizer", lb.model, "--trust-remote-code")
    assert proc.returncode == 0 and result["completed"] == 4 and result["tokenizer_id"] == lb.model


def test_our_bench_passes_the_tokenizer_the_real_bench_needs(lb, tmp_path):
    def exec_in_container(argv):
        if argv[0] == "cat":
            with open(argv[1]) as f:
                return 0, f.read(), ""
        proc = lb.vllm(argv[1:], tag="main-a3")
        return proc.returncode, proc.stdout, proc.stderr
    client = Client(lb_url(lb, "main-a3"), timeout=60)
    result = bench.run_point(POINT, client, "kimi-k3", exec_in_container, str(tmp_path), [client],
                             {"path": lb.model, "mode": "kimi_k3", "trust_remote_code": True})
    assert result["completed"] == 4 and result["failed"] == 0 and result["tokenizer_id"] == lb.model


# ---------------------------------------------------------------------------------- bench JSON (finding 7)

def test_random_datasets_force_ignore_eos(lb, tmp_path):
    """'when using random datasets, default to ignoring EOS' on OpenAI-compatible backends."""
    proc, result = stand_in_bench(lb, "v0.23.0-a3", tmp_path, "--tokenizer", lb.model, "--trust-remote-code")
    assert proc.returncode == 0 and result["output_lens"] == [80] * 4  # the engine stops at 64 without ignore_eos
    assert point_errors([dict(POINT, ignore_eos=False)]) == [
        "points[0] (random-c2): ignore_eos is false, but vllm bench serve forces ignore_eos for the random dataset "
        "(vllm/benchmarks/serve.py): drop it, or use a multi_turn point"]


@pytest.mark.parametrize("tag,has_latencies", [("v0.23.0-a3", False), ("main-a3", False), ("v0.32.0-a3", True)])
def test_our_report_reads_the_bench_json_of_each_version(lb, tmp_path, tag, has_latencies):
    proc, result = stand_in_bench(lb, tag, tmp_path, "--tokenizer", lb.model, "--trust-remote-code")
    assert proc.returncode == 0 and ("latencies" in result) == has_latencies
    assert [len(itl) for itl in result["itls"]] == [n - 1 for n in result["output_lens"]]
    result["npuops"] = {"point": POINT, "planned": bench.planned(POINT)}
    summary = report.write(str(tmp_path / "report"), [result], {"model": "kimi-k3"})
    assert summary["adds_up"] and summary["table"][0]["requests"] == 4
    rows = [json.loads(line) for line in (tmp_path / "report" / "requests.jsonl").read_text().splitlines()]
    for i, row in enumerate(rows):
        assert row["latency_s"] == pytest.approx(result["ttfts"][i] + sum(result["itls"][i]))
        assert row["itl_count"] == row["output_len"] - 1 == 79


# ---------------------------------------------------------------------------------- vLLM's own request functions

def vllm_versions():
    root = os.path.join(VLLM_VENV, "versions")
    return sorted(os.listdir(root)) if os.path.isdir(root) else ["(no .venv-vllm: run tools/vllm_argcheck.sh)"]


@pytest.mark.vllm
@pytest.mark.parametrize("version", vllm_versions())
def test_vllms_own_request_functions_count_what_our_report_counts(lb, tmp_path, version):
    """async_request_openai_completions of each installed vLLM counts every chunk with choices as a token: one
    TTFT, then one ITL per further token, so a stray empty finishing chunk would show as one ITL too many. Its
    counts, through vLLM's calculate_metrics, are what our report and the stand-in's bench show."""
    env = dict(os.environ, PYTHONPATH=os.path.join(VLLM_VENV, "versions", version))
    proc = subprocess.run([os.path.join(VLLM_VENV, "bin", "python"), os.path.join(HERE, "vllm_bench_driver.py"),
                           lb_url(lb, "main-a3"), "kimi-k3", "6", "3", "64", "40"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    real = json.loads(proc.stdout.strip().splitlines()[-1])
    assert real["vllm_version"] == version and real["completed"] == 6 and real["failed"] == 0
    assert real["output_lens"] == [40] * 6 and [len(i) for i in real["itls"]] == [39] * 6
    real["npuops"] = {"point": dict(POINT, num_prompts=6, output_len=40),
                      "planned": {"requests": 6, "sessions": None}}
    summary = report.write(str(tmp_path / "report"), [real], {"model": "kimi-k3"})
    assert summary["adds_up"] and summary["table"][0]["requests"] == real["completed"]
    rows = [json.loads(line) for line in (tmp_path / "report" / "requests.jsonl").read_text().splitlines()]
    assert [r["itl_count"] for r in rows] == [len(i) for i in real["itls"]]
    # 0.23/0.27 take TTFT from a second perf_counter() call: TTFT + ITLs is the latency within microseconds
    assert [r["latency_s"] for r in rows] == pytest.approx(real["request_latencies"], abs=1e-4)
    assert summary["table"][0]["output_tok_s"] == round(real["output_throughput"], 1)
