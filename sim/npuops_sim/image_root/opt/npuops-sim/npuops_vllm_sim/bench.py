"""`vllm bench serve` of the stand-in: the random dataset against /v1/completions (streamed), with the
result file vLLM writes (same keys; --save-detailed adds the per-request arrays).

As vllm/benchmarks/serve.py and lib/endpoint_request_func.py of the emulated version do: the tokenizer is loaded
first, from --tokenizer or else from --model (a served name such as `kimi-k3` is no tokenizer: it fails), with
custom tokenizer code only under --trust-remote-code; random datasets force ignore_eos on OpenAI-compatible
backends; every streamed chunk with choices is a token event (the first is TTFT, the others ITL samples) and a
request's latency ends at its last such chunk; `latencies` is saved only by versions that have it (0.32)."""
import json
import math
import os
import random
import statistics
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime

from . import versions

OPENAI_COMPATIBLE_BACKENDS = ("openai", "vllm", "openai-chat", "vllm-chat", "openai-audio", "openai-embeddings")

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()
ONE_TOKEN_WORDS = [w for w in WORDS if len(w) <= 4] + [str(n) for n in range(100)]


def percentile(values, p):
    if not values:
        return 0.0
    s = sorted(values)
    k = (len(s) - 1) * p / 100.0
    f, c = math.floor(k), math.ceil(k)
    return s[int(k)] if f == c else s[f] + (s[c] - s[f]) * (k - f)


def wait_ready(base, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(base + "/v1/models", timeout=5) as r:
                if r.status == 200:
                    return json.loads(r.read())["data"][0]["id"]
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError):
            pass
        time.sleep(1)
    raise SystemExit("vllm bench serve: the endpoint %s did not answer within %ds" % (base, timeout))


def load_tokenizer(tokenizer_id, mode, trust_remote_code):
    """get_tokenizer(): a local directory (or a hub id, which an offline cluster cannot fetch), custom code only
    with trust_remote_code, a tokenizer mode this vLLM has."""
    if mode not in versions.vllm()["tokenizer_modes"]:
        raise SystemExit("ValueError: Unknown tokenizer mode: %s" % mode)
    if not os.path.isdir(tokenizer_id):
        raise SystemExit("OSError: %s is not a local folder and is not a valid model identifier listed on "
                         "'https://huggingface.co/models'\nIf this is a private repository, make sure to pass a token "
                         "having permission to this repo (pass --tokenizer <the model directory>)" % tokenizer_id)
    auto_map = {}
    for name in ("tokenizer_config.json", "config.json"):
        try:
            with open(os.path.join(tokenizer_id, name)) as f:
                auto_map.update(json.load(f).get("auto_map") or {})
        except (OSError, ValueError):
            pass
    if "AutoTokenizer" in auto_map and not trust_remote_code:
        raise SystemExit("ValueError: The repository %s contains custom code which must be executed to correctly "
                         "load the model. You can inspect the repository content at %s .\n Please pass the argument "
                         "`trust_remote_code=True` to allow custom code to be run." % (tokenizer_id, tokenizer_id))


def one(base, endpoint, model, prompt, out_len, ignore_eos, api_key):
    body = {"model": model, "prompt": prompt, "repetition_penalty": 1.0, "max_tokens": out_len, "logprobs": None,
            "stream": True, "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    t0 = time.perf_counter()
    res = {"ttft": 0.0, "itl": [], "latency": 0.0, "output_len": 0, "text": "", "error": "", "success": False,
           "start_time": t0}
    last = None
    recent = t0
    try:
        req = urllib.request.Request(base + endpoint, data=json.dumps(body).encode(), headers=headers)
        with urllib.request.urlopen(req, timeout=3600) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                ev = json.loads(line[5:])
                choices = ev.get("choices")
                if choices:  # a chunk with choices is a token event even when its text is empty
                    now = time.perf_counter()
                    if last is None:
                        res["ttft"] = now - t0
                    else:
                        res["itl"].append(now - recent)
                    last = recent = now
                    res["text"] += choices[0].get("text") or ""
                elif ev.get("usage"):
                    res["output_len"] = ev["usage"].get("completion_tokens", res["output_len"])
        res["latency"] = recent - t0
        res["success"] = last is not None
        if not res["success"]:
            res["error"] = "Never received a valid chunk to calculate TTFT.This response will be marked as failed!"
    except urllib.error.HTTPError as e:
        res["error"] = e.reason or ""  # vLLM: output.error = response.reason (benchmarks/lib/endpoint_request_func.py)
    except (urllib.error.URLError, OSError, ValueError) as e:
        res["error"] = str(e)
    return res


def initial_test(base, endpoint, served, prompt, output_len, ignore_eos, api_key, timeout, interval=5):
    """vLLM's initial test run (benchmarks/serve.py, lib/ready_checker.py wait_for_endpoint): one request, retried
    every 5 s until it succeeds or --ready-check-timeout-sec ends; then the run stops with its error."""
    if timeout <= 0:
        print("Skipping endpoint ready check.")
        return
    deadline = time.perf_counter() + timeout
    print("Waiting for endpoint to become up in %d seconds" % timeout)
    while True:
        out = one(base, endpoint, served, prompt, output_len, ignore_eos, api_key)
        if out["success"]:
            print("Initial test run completed.")
            return
        print("WARNING Endpoint is not ready. Error='%s'" % str(out["error"]).rstrip().rsplit("\n", 1)[-1])
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            raise SystemExit("ValueError: Initial test run failed - Please make sure benchmark arguments are "
                             "correctly specified. Error: %s" % out["error"])
        time.sleep(min(interval, remaining))


def run(args):
    base = (args.base_url or "http://%s:%d" % (args.host, args.port)).rstrip("/")
    api_key = os.environ.get("OPENAI_API_KEY") or os.environ.get("VLLM_API_KEY")
    model = args.model or wait_ready(base, args.ready_check_timeout_sec)
    tokenizer_id = args.tokenizer if args.tokenizer is not None else model
    load_tokenizer(tokenizer_id, args.tokenizer_mode, args.trust_remote_code)
    if args.dataset_name != "random":
        raise SystemExit("vllm bench serve (simulated image): only --dataset-name random is available")
    if args.backend in OPENAI_COMPATIBLE_BACKENDS:
        args.ignore_eos = True  # "when using random datasets, default to ignoring EOS"
    served = args.served_model_name or model
    rnd = random.Random(args.seed)
    # vLLM's RandomDataset samples token ids, so a prompt is --random-input-len tokens: here words that are one token
    # each under the stand-in's tokenizer
    prompts = [" ".join(rnd.choice(ONE_TOKEN_WORDS) for _ in range(args.random_input_len))
               for _ in range(args.num_prompts)]
    results = [None] * len(prompts)
    limit = threading.Semaphore(args.max_concurrency or len(prompts))
    lock = threading.Lock()
    state = {"active": 0, "max_active": 0}

    def worker(i):
        with limit:
            with lock:
                state["active"] += 1
                state["max_active"] = max(state["max_active"], state["active"])
            results[i] = one(base, args.endpoint, served, prompts[i], args.random_output_len, args.ignore_eos, api_key)
            with lock:
                state["active"] -= 1

    initial_test(base, args.endpoint, served, prompts[0], args.random_output_len, args.ignore_eos, api_key,
                 args.ready_check_timeout_sec)
    print("Starting main benchmark run: %d prompts, concurrency %s" % (len(prompts), args.max_concurrency))
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    duration = time.perf_counter() - t0
    ok = [r for r in results if r["success"]]
    ttfts = [r["ttft"] * 1000 for r in ok]
    itls = [x * 1000 for r in ok for x in r["itl"]]
    tpots = [(r["latency"] - r["ttft"]) / (r["output_len"] - 1) * 1000 for r in ok if r["output_len"] > 1]
    e2els = [r["latency"] * 1000 for r in ok]
    total_in = args.random_input_len * len(ok)
    total_out = sum(r["output_len"] for r in ok)
    out = {"date": datetime.now().strftime("%Y%m%d-%H%M%S"), "endpoint_type": "vllm", "backend": args.backend,
           "label": args.label, "model_id": model, "tokenizer_id": tokenizer_id,
           "num_prompts": args.num_prompts, "request_rate": "inf" if args.request_rate == float("inf")
           else args.request_rate, "burstiness": 1.0, "max_concurrency": args.max_concurrency, "duration": duration,
           "completed": len(ok), "failed": len(results) - len(ok), "total_input_tokens": total_in,
           "total_output_tokens": total_out, "request_throughput": len(ok) / duration, "request_goodput": None,
           "output_throughput": total_out / duration, "total_token_throughput": (total_in + total_out) / duration,
           "max_concurrent_requests": state["max_active"]}
    pcts = [float(p) for p in args.metric_percentiles.split(",")]
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        if name not in args.percentile_metrics.split(","):
            continue
        out["mean_%s_ms" % name] = statistics.mean(values) if values else 0.0
        out["median_%s_ms" % name] = statistics.median(values) if values else 0.0
        out["std_%s_ms" % name] = statistics.pstdev(values) if values else 0.0
        for p in pcts:
            out["p%s_%s_ms" % (("%g" % p), name)] = percentile(values, p)
    for item in args.metadata or []:
        key, _sep, value = item.partition("=")
        out[key] = value
    if args.save_detailed:
        out.update(input_lens=[args.random_input_len] * len(results), output_lens=[r["output_len"] for r in results],
                   ttfts=[r["ttft"] for r in results], itls=[r["itl"] for r in results],
                   start_times=[r["start_time"] for r in results],
                   generated_texts=[r["text"] for r in results], errors=[r["error"] for r in results])
        if versions.vllm()["bench_latencies"]:
            out["latencies"] = [r["latency"] for r in results]
    print("============ Serving Benchmark Result ============")
    for k in ("completed", "failed", "duration", "output_throughput", "mean_ttft_ms", "mean_tpot_ms"):
        print("%-40s %s" % (k, out.get(k)))
    if args.save_result:  # as in vLLM, --save-detailed only adds the per-request lists to a saved result
        os.makedirs(args.result_dir, exist_ok=True)
        name = args.result_filename or "vllm-%sqps-concurrency%s-%s-%s.json" % (
            out["request_rate"], args.max_concurrency, model.replace("/", "_"), out["date"])
        with open(os.path.join(args.result_dir, name), "w") as f:
            json.dump(out, f)
    return 0 if ok else 1
