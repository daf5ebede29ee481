"""`vllm bench serve` of the stand-in: the random dataset against /v1/completions (streamed), with the
result file vLLM writes (same keys; --save-detailed adds the per-request arrays)."""
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

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


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


def one(base, endpoint, model, prompt, out_len, ignore_eos, api_key):
    body = {"model": model, "prompt": prompt, "max_tokens": out_len, "stream": True, "ignore_eos": ignore_eos,
            "stream_options": {"include_usage": True}}
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    t0 = time.perf_counter()
    res = {"ttft": 0.0, "itl": [], "latency": 0.0, "output_len": 0, "text": "", "error": "", "success": False,
           "start_time": t0}
    last = None
    try:
        req = urllib.request.Request(base + endpoint, data=json.dumps(body).encode(), headers=headers)
        with urllib.request.urlopen(req, timeout=3600) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                ev = json.loads(line[5:])
                if ev.get("usage"):
                    res["output_len"] = ev["usage"].get("completion_tokens", res["output_len"])
                for ch in ev.get("choices") or []:
                    piece = ch.get("text") or (ch.get("delta") or {}).get("content") or ""
                    if piece:
                        now = time.perf_counter()
                        if last is None:
                            res["ttft"] = now - t0
                        else:
                            res["itl"].append(now - last)
                        last = now
                        res["text"] += piece
        res["latency"] = time.perf_counter() - t0
        res["success"] = True
    except (urllib.error.URLError, OSError, ValueError) as e:
        res["error"] = str(e)
    return res


def run(args):
    base = (args.base_url or "http://%s:%d" % (args.host, args.port)).rstrip("/")
    api_key = os.environ.get("OPENAI_API_KEY") or os.environ.get("VLLM_API_KEY")
    model = args.model or wait_ready(base, args.ready_check_timeout_sec)
    if args.dataset_name != "random":
        raise SystemExit("vllm bench serve (simulated image): only --dataset-name random is available")
    rnd = random.Random(args.seed)
    prompts = [" ".join(rnd.choice(WORDS) + str(rnd.randint(0, 99)) for _ in range(args.random_input_len))
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
            results[i] = one(base, args.endpoint, model, prompts[i], args.random_output_len, args.ignore_eos, api_key)
            with lock:
                state["active"] -= 1

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
           "label": args.label, "model_id": model, "tokenizer_id": args.tokenizer or model,
           "num_prompts": args.num_prompts, "request_rate": "inf" if args.request_rate == float("inf")
           else args.request_rate, "burstiness": 1.0, "max_concurrency": args.max_concurrency, "duration": duration,
           "completed": len(ok), "failed": len(results) - len(ok), "total_input_tokens": total_in,
           "total_output_tokens": total_out, "request_throughput": len(ok) / duration,
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
                   latencies=[r["latency"] for r in results], start_times=[r["start_time"] for r in results],
                   generated_texts=[r["text"] for r in results], errors=[r["error"] for r in results])
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
