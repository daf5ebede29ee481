"""Drive an OpenAI-compatible endpoint with vLLM's own benchmark code, and print the result as vLLM's
`vllm bench serve --save-detailed` saves it (tests/test_conformance_bench.py runs this with the vLLM venv).

Uses, unchanged, the installed vLLM's async_request_openai_completions (vllm/benchmarks/lib/
endpoint_request_func.py) for every request and calculate_metrics (vllm/benchmarks/serve.py) for the counts;
the per-request lists are the ones serve.py's benchmark() writes (`latencies` only where that version does).
Argv: base_url model num_prompts concurrency input_words output_len
"""
import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import vllm_cpu  # noqa: E402,F401

import aiohttp  # noqa: E402
from vllm import __version__ as vllm_version  # noqa: E402
from vllm.benchmarks.datasets import SampleRequest  # noqa: E402
from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_completions  # noqa
from vllm.benchmarks.serve import calculate_metrics  # noqa: E402


async def run(base, model, n, concurrency, words, output_len):
    prompts = [" ".join("w%d_%d" % (i, k) for k in range(words)) for i in range(n)]
    limit = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        async def one(prompt):
            async with limit:
                return await async_request_openai_completions(RequestFuncInput(
                    prompt=prompt, api_url=base + "/v1/completions", prompt_len=words, output_len=output_len,
                    model=model, ignore_eos=True), session)
        t0 = time.perf_counter()
        outputs = await asyncio.gather(*[one(p) for p in prompts])
        duration = time.perf_counter() - t0
    requests = [SampleRequest(prompt=p, prompt_len=words, expected_output_len=output_len) for p in prompts]
    metrics, actual_output_lens = calculate_metrics(requests, outputs, duration, None, [50.0, 99.0], {})
    result = {"vllm_version": vllm_version, "num_prompts": n, "max_concurrency": concurrency, "duration": duration,
              "completed": metrics.completed, "failed": metrics.failed, "total_input_tokens": metrics.total_input,
              "total_output_tokens": metrics.total_output, "output_throughput": metrics.output_throughput,
              "total_token_throughput": metrics.total_token_throughput,
              "mean_ttft_ms": metrics.mean_ttft_ms, "mean_tpot_ms": metrics.mean_tpot_ms,
              "input_lens": [o.prompt_len for o in outputs], "output_lens": actual_output_lens,
              "ttfts": [o.ttft for o in outputs], "itls": [o.itl for o in outputs],
              "start_times": [o.start_time for o in outputs], "generated_texts": [o.generated_text for o in outputs],
              "errors": [o.error for o in outputs], "request_latencies": [o.latency for o in outputs]}
    return result


if __name__ == "__main__":
    base, model, n, conc, words, out_len = sys.argv[1:7]
    print(json.dumps(asyncio.run(run(base, model, int(n), int(conc), int(words), int(out_len)))))
