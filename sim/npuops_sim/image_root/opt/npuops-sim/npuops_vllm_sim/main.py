"""Command line of the stand-in: `vllm serve MODEL [flags]`, `vllm bench serve [flags]`, `vllm --version`.

The flag set follows vLLM's `vllm serve` for every flag npuops emits (and a few common ones); any other flag is
refused the way argparse refuses it in vLLM: "vllm: error: unrecognized arguments: ...". The choices of
--tokenizer-mode and --kv-cache-dtype are the Literals of the emulated version (TokenizerMode in
vllm/config/model.py, CacheDType in vllm/config/cache.py), refused by argparse as vLLM's own parser does.
"""
import argparse
import json

from . import versions

VERSION = versions.vllm_version() + "+npuops.sim"


def json_arg(text):
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError("invalid JSON: %r" % text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object: %r" % text)
    return value


def serve_parser(sub):
    p = sub.add_parser("serve", allow_abbrev=False)
    p.add_argument("model_tag", nargs="?")
    p.add_argument("--model")
    add = p.add_argument
    add("--served-model-name", nargs="+")
    add("--host", default=None)
    add("--port", type=int, default=8000)
    add("--api-key")
    add("--trust-remote-code", action="store_true")
    add("--tensor-parallel-size", "-tp", type=int, default=1)
    add("--pipeline-parallel-size", "-pp", type=int, default=1)
    add("--distributed-executor-backend", choices=["mp", "ray", "uni", "external_launcher"])
    add("--nnodes", type=int, default=1)
    add("--node-rank", type=int, default=0)
    add("--master-addr", default="127.0.0.1")
    add("--master-port", type=int, default=29500)
    add("--data-parallel-size", "-dp", type=int, default=1)
    add("--data-parallel-size-local", type=int)
    add("--data-parallel-start-rank", type=int)
    add("--data-parallel-rank", type=int)
    add("--data-parallel-address")
    add("--data-parallel-rpc-port", type=int, default=29550)
    add("--data-parallel-hybrid-lb", action="store_true")
    add("--enable-expert-parallel", action="store_true")
    add("--headless", action="store_true")
    add("--api-server-count", type=int, default=1)
    add("--quantization", "-q")
    caps = versions.vllm()
    add("--tokenizer-mode", default="auto", choices=caps["tokenizer_modes"])
    add("--reasoning-parser")
    add("--tool-call-parser")
    add("--enable-auto-tool-choice", action="store_true")
    add("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    add("--max-model-len", type=int, default=32768)
    add("--max-num-seqs", type=int, default=256)
    add("--max-num-batched-tokens", type=int)
    add("--gpu-memory-utilization", type=float, default=0.9)
    add("--kv-cache-dtype", default="auto", choices=caps["kv_cache_dtypes"])
    # usage.prompt_tokens_details.cached_tokens only with this flag; usage chunks without stream_options only
    # with --enable-force-include-usage (vllm/entrypoints/openai/chat_completion/serving.py)
    add("--enable-prompt-tokens-details", action="store_true")
    add("--enable-force-include-usage", action="store_true")
    add("--block-size", type=int, default=128)
    add("--compilation-config", "-cc", type=json_arg)
    add("--safetensors-load-strategy", choices=["eager", "lazy", "prefetch", "torchao"])
    add("--load-format", default="auto")
    add("--enforce-eager", action="store_true")
    add("--seed", type=int, default=0)
    add("--kv-transfer-config", type=json_arg)
    add("--speculative-config", type=json_arg)
    add("--additional-config", type=json_arg)
    # the Kimi-K3 recipes' tokenizer, dtype, multimodal and hybrid-cache options (vllm/engine/arg_utils.py)
    add("--tokenizer")
    add("--dtype", default="auto")
    add("--allowed-local-media-path", default="")
    add("--mm-processor-cache-gb", type=float, default=4)
    add("--mm-encoder-tp-mode", choices=["weights", "data"], default="weights")
    add("--limit-mm-per-prompt", type=json_arg)
    add("--skip-mm-profiling", action="store_true")
    add("--mamba-cache-mode", default="none")
    add("--language-model-only", action="store_true")
    return p


def bench_parser(sub):
    b = sub.add_parser("bench", allow_abbrev=False)
    bsub = b.add_subparsers(dest="bench_cmd", required=True)
    p = bsub.add_parser("serve", allow_abbrev=False)
    add = p.add_argument
    add("--backend", default="vllm")
    add("--base-url")
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=8000)
    add("--endpoint", default="/v1/completions")
    add("--model")
    add("--tokenizer")
    add("--tokenizer-mode", default="auto")
    add("--trust-remote-code", action="store_true")
    add("--served-model-name")
    add("--dataset-name", default="random")
    add("--dataset-path")
    add("--random-input-len", type=int, default=1024)
    add("--random-output-len", type=int, default=128)
    add("--num-prompts", type=int, default=1000)
    add("--max-concurrency", type=int)
    add("--request-rate", type=float, default=float("inf"))
    add("--ignore-eos", action="store_true")
    add("--save-result", action="store_true")
    add("--save-detailed", action="store_true")
    add("--result-dir", default=".")
    add("--result-filename")
    add("--percentile-metrics", default="ttft,tpot,itl")
    add("--metric-percentiles", default="99")
    add("--ready-check-timeout-sec", type=int, default=600)
    add("--num-warmups", type=int, default=0)
    add("--metadata", nargs="*")
    add("--label")
    add("--seed", type=int, default=0)
    return p


def main(argv):
    ap = argparse.ArgumentParser(prog="vllm", allow_abbrev=False)
    ap.add_argument("--version", action="store_true")
    sub = ap.add_subparsers(dest="subparser")
    serve_parser(sub)
    bench_parser(sub)
    args = ap.parse_args(argv)
    if args.version:
        print(VERSION)
        return 0
    if args.subparser == "serve":
        from . import serve
        return serve.run(args)
    if args.subparser == "bench":
        from . import bench
        return bench.run(args)
    ap.print_help()
    return 2
