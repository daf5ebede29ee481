"""The stand-in's "model": deterministic answers, token accounting, prefix cache, metrics, KV hand-over."""
import base64
import hashlib
import json
import os
import queue
import random
import re
import socket
import struct
import threading
import time
import uuid
from collections import OrderedDict

from . import scheduler as sched
from . import versions

# a deterministic sub-word split, as a BPE tokenizer gives more tokens than words (about 1.5 per English word here:
# runs of at most four letters or digits), so that nothing sized in words passes for sized in tokens
TOKEN = re.compile(r"[\u2E80-\u9FFF\uF900-\uFAFF\uFF00-\uFFEF]|[A-Za-z0-9_]{1,4}|[^\s]")
# a token with the whitespace before it: streamed pieces concatenate to the text, as vLLM's detokenizer's do
PIECE = re.compile(r"\s*(?:%s)" % TOKEN.pattern)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")  # FINISH_REASON_STRINGS, vllm/v1/engine
PREFILL_TOKENS_PER_S = float(os.environ.get("NPUOPS_SIM_PREFILL_TPS", "200000"))
SECONDS_PER_TOKEN = float(os.environ.get("NPUOPS_SIM_TPOT", "0.002"))
# the node's hardware profile (the driver's lib64 is mounted into engine containers): the simulator's runtime
# faults are read from it; engine_wedge is an engine whose API answers (/health 200) while no token comes out,
# as when a collective hangs on the NPUs
PROFILE = os.environ.get("NPUOPS_SIM_PROFILE", "/usr/local/Ascend/driver/lib64/npuops_sim/profile.json")
# speculative decoding: the chance that a matching draft's token at a position is accepted given those before it were
# (a stand-in's choice: about 3 tokens per step at k = 7), and what a verify step of 1 + k tokens costs beside a plain
# decode step (the draft's eager proposal and the wider verify)
SPEC_ACCEPT = float(os.environ.get("NPUOPS_SIM_SPEC_ACCEPT", "0.7"))
SPEC_STEP_COST_PER_TOKEN = 0.05
BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
           40.0, 80.0, 160.0, 640.0, 2560.0)


# Kimi-K3's vocabulary size (its config.json): the range of the token ids /tokenize returns
VOCAB = 163840
# vLLM's default token budget per step for the API server (EngineArgs default_max_num_batched_tokens, 0.8 on)
DEFAULT_BATCHED_TOKENS = 8192


def kv_tokens():
    """The KV cache of one engine (DP rank), in tokens: what the node profile's HBM leaves in a real one (the stand-in
    is given it: NPUOPS_SIM_KV_TOKENS, e.g. the field report's 468,750 on 2 x 910C)."""
    return int(os.environ.get("NPUOPS_SIM_KV_TOKENS", "2000000"))


def _chain_sizes(first, rest):
    if first is not None:
        yield first
    for size in rest:
        yield size


class ClientGone(Exception):
    """The client closed its connection while its request waited or ran (vLLM aborts the request)."""


class RequestError(Exception):
    def __init__(self, msg, code=400, param=None):
        Exception.__init__(self, msg)
        self.code = code
        self.param = param


ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 501: "NotImplementedError"}


def error(msg, code=400, param=None):
    """vLLM's ErrorResponse: {"error": {message, type, param, code}} (create_error_response in
    vllm/entrypoints/serve/utils/error_response.py, 0.23.0; the same shape in 0.32.0)."""
    return {"error": {"message": msg, "type": ERROR_TYPES.get(code, "InternalServerError"), "param": param,
                      "code": code}}


def faults(name):
    """The node's faults of kind `name` (its profile's records)."""
    try:
        with open(PROFILE) as f:
            return [x for x in json.load(f).get("faults", []) if x.get("fault") == name]
    except (OSError, ValueError):
        return []


def has_fault(name):
    return bool(faults(name))


# when this engine started: a wedge set before it (the fault's "at") does not hold it (a restart cures a hung collective)
STARTED = time.time()


def wedged():
    return any(x.get("at") is None or x["at"] >= STARTED for x in faults("engine_wedge"))


def garbled():
    """The `garbled` fault: the engine answers junk while /health, /v1/models and every request still return 200,
    as multi-node deployments do when a collective or a kernel computes wrong (vllm-ascend #11019, #11394, #16608)."""
    return has_fault("garbled")


# vllm-ascend #16870 (fixed by #16824): a paged attention kernel computed physical_block_id * stride in int32 and
# read the wrong scales from physical block 29,077 on; the service then answers gibberish with HTTP 200. The
# stand-in applies it to every model: a configuration whose KV cache has more blocks (a smaller --block-size, a
# larger cache) answers junk, so a rollout can break answers
OVERFLOW_BLOCKS = 29077
# a question with an arithmetic expression, answered as a model that can compute would
ARITHMETIC = re.compile(r"(-?\d+)\s*([-+*x×])\s*(-?\d+)")


def nonfinite():
    """The `nonfinite` fault: a tensor of the engine turned non-finite (NaN / inf), as vLLM-Ascend's Kimi-K3 FAQ describes
    ("a worker abort, a non-finite tensor, or a graph replay failure"): every request still answers HTTP 200, but its
    token log-probabilities are not finite numbers."""
    return has_fault("nonfinite")


def chat_logprobs(steps, body):
    """A chat choice's `logprobs` when the request asks for them ("logprobs": true): one entry per generated token
    (vLLM's ChatCompletionLogProbsContent: token, logprob, bytes, top_logprobs), else None. A non-finite log-probability
    reaches the client as null (pydantic serializes NaN and inf as null in JSON: ser_json_inf_nan='null')."""
    if not body.get("logprobs"):
        return None
    bad = nonfinite()
    k = int(body.get("top_logprobs") or 0)
    out = []
    for i, (_field, piece) in enumerate(steps):
        value = None if bad else -round(0.001 + 0.05 * (i % 7), 4)
        entry = {"token": piece, "logprob": value, "bytes": list(piece.encode("utf-8"))}
        entry["top_logprobs"] = [{"token": piece, "logprob": value, "bytes": entry["bytes"]}][:k]
        out.append(entry)
    return {"content": out}


def stop_strings(body):
    stop = body.get("stop")
    return [stop] if isinstance(stop, str) else [w for w in (stop or []) if isinstance(w, str) and w]


def tokens(text):
    return TOKEN.findall(text or "")


def pieces(text):
    """The text as streamed: one piece per token, whitespace kept."""
    return PIECE.findall(text or "")


class Histogram(object):
    def __init__(self):
        self.counts = [0] * len(BUCKETS)
        self.total = 0.0
        self.n = 0

    def observe(self, v):
        self.total += v
        self.n += 1
        for i, b in enumerate(BUCKETS):
            if v <= b:
                self.counts[i] += 1


class Stats(object):
    """Per-engine (DP rank) counters with vLLM's metric names."""

    def __init__(self):
        # requests preempted for KV blocks (the scheduler's); vLLM counts it as vllm:num_preemptions
        # (vllm/v1/metrics/loggers.py), which prometheus_client exposes as vllm:num_preemptions_total
        self.preemptions = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.external_queries = 0
        self.external_hits = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success = {}
        # speculative decoding, as vLLM's SpecDecodingProm counts it (vllm/v1/spec_decode/metrics.py): drafts (one per
        # request per verify step), draft tokens proposed, accepted tokens, and accepted tokens per draft position
        self.spec_drafts = 0
        self.spec_draft_tokens = 0
        self.spec_accepted = 0
        self.spec_accepted_per_pos = []
        self.ttft = Histogram()
        self.e2e = Histogram()
        self.tpot = Histogram()


class KvConnector(object):
    """MooncakeConnector stand-in: a producer serves each request's KV on its side-channel port (kv_port +
    dp_rank * tp * pp); a consumer pulls it from the host/port the producer's response names. The two sides'
    kv_connector_extra_config must be identical, as Mooncake requires."""

    def __init__(self, config, host, port):
        self.config = config
        self.role = config.get("kv_role")
        self.host = host
        self.port = port
        self.engine_id = config.get("engine_id") or str(uuid.uuid4())
        self.extra = json.dumps(config.get("kv_connector_extra_config") or {}, sort_keys=True)
        self.store = OrderedDict()
        self.lock = threading.Lock()

    def start(self):
        if self.role not in ("kv_producer", "kv_both"):
            return
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            srv.bind((self.host, self.port))
        except OSError as e:
            raise SystemExit("zmq.error.ZMQError: Address already in use (addr='tcp://%s:%d'): %s"
                             % (self.host, self.port, e))
        srv.listen(64)
        threading.Thread(target=self._serve, args=(srv,), daemon=True).start()

    def _serve(self, srv):
        while True:
            conn, _peer = srv.accept()
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn):
        f = conn.makefile("rw")
        try:
            ask = json.loads(f.readline())
            if json.dumps(ask.get("extra_config") or {}, sort_keys=True) != self.extra:
                reply = {"error": "kv_connector_extra_config differs between prefill (%s) and decode (%s)"
                                  % (self.extra, json.dumps(ask.get("extra_config"), sort_keys=True))}
            else:
                with self.lock:
                    kv = self.store.pop(ask.get("request_id"), None)
                reply = {"ok": True, "kv": kv} if kv else {"error": "no KV for request %s" % ask.get("request_id")}
            f.write(json.dumps(reply) + "\n")
            f.flush()
        finally:
            conn.close()

    def keep(self, request_id, prompt_digest, n, garbage=False):
        with self.lock:
            self.store[request_id] = {"digest": prompt_digest, "tokens": n, "garbage": garbage}
            while len(self.store) > 4096:
                self.store.popitem(last=False)

    def pull(self, host, port, request_id, timeout=10.0):
        try:
            conn = socket.create_connection((host, int(port)), timeout=timeout)
        except OSError as e:
            raise RequestError("Mooncake transfer failed: cannot connect to %s:%s: %s" % (host, port, e), 500)
        f = conn.makefile("rw")
        f.write(json.dumps({"request_id": request_id, "extra_config": json.loads(self.extra)}) + "\n")
        f.flush()
        reply = json.loads(f.readline() or "{}")
        conn.close()
        if reply.get("error"):
            raise RequestError("Mooncake transfer failed: %s" % reply["error"], 500)
        return reply["kv"]


class Engine(object):
    def __init__(self, served, path, args, garbage, dp_ranks, complete, speculative=None):
        self.speculative = speculative
        names = [served] if isinstance(served, str) else list(served)
        self.served, self.names = names[0], names
        self.path = path
        self.args = args
        self.garbage = garbage
        # members of this engine's group whose HCCL device addresses are unset: collectives over them
        # return garbage on every rank, not only theirs (filled in by the rendezvous)
        self.broken_peers = []
        self.complete = complete
        # one step of every rank of the group per request (set by the rendezvous; none for a lone engine)
        self.step = lambda: None
        self.kv = None
        self.engines = [Stats() for _ in range(max(1, dp_ranks))]
        self.next_engine = 0
        self.lock = threading.Lock()
        cap = kv_tokens()
        self.overflow = cap // args.block_size > OVERFLOW_BLOCKS
        # one scheduler for the DP ranks this process serves: each rank's max_num_seqs, token budget and KV cache
        dp = len(self.engines)

        def preempted(seq):
            self.engines[seq.rank].preemptions += 1
        self.scheduler = sched.Scheduler(
            args.max_num_seqs * dp, (args.max_num_batched_tokens or DEFAULT_BATCHED_TOKENS) * dp, args.block_size,
            cap * dp, args.enable_prefix_caching, PREFILL_TOKENS_PER_S * dp, SECONDS_PER_TOKEN, parallel=dp,
            stalled=wedged, on_preempt=preempted)
        self.created = int(time.time())

    def ready(self):
        return self.complete.is_set()

    def models(self):
        return {"object": "list", "data": [{"id": name, "object": "model", "created": self.created,
                                            "owned_by": "vllm", "root": self.path, "parent": None,
                                            "max_model_len": self.args.max_model_len} for name in self.names]}

    # ------------------------------------------------------------------ requests
    def _check_model(self, body):
        model = body.get("model")
        if model and model not in self.names:
            raise RequestError("The model `%s` does not exist." % model, 404, "model")

    def tokenize(self, body):
        """POST /tokenize (vllm/entrypoints/serve/tokenize/serving.py): a prompt or chat messages -> {count,
        max_model_len, tokens, token_strs}, counted as a request of the same body counts its prompt tokens."""
        self._check_model(body)
        toks = self._prompt(body, "messages" in body)[0]
        return {"count": len(toks), "max_model_len": self.args.max_model_len,
                "tokens": [int(hashlib.sha256(t.encode()).hexdigest()[:8], 16) % VOCAB for t in toks],
                "token_strs": None}

    def prepare(self, body, chat):
        self._check_model(body)
        toks, question, images = self._prompt(body, chat)
        return self._limits(body, chat, toks, question, images)

    def _prompt(self, body, chat):
        """-> (prompt tokens, the question asked, image URLs)."""
        images = []
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise RequestError("messages must be a non-empty list", 400, "messages")
            parts = []
            for m in msgs:
                content = m.get("content")
                if isinstance(content, list):
                    for c in content:
                        if c.get("type") == "text":
                            parts.append(c.get("text", ""))
                        elif c.get("type") == "image_url":
                            images.append(((c.get("image_url") or {}).get("url") or ""))
                elif content:
                    parts.append(str(content))
                for call in m.get("tool_calls") or []:
                    parts.append(json.dumps(call))
            prompt = "\n".join(parts)
            last_user = next((m for m in reversed(msgs) if m.get("role") == "user"), {})
            question = last_user.get("content")
            if isinstance(question, list):
                question = " ".join(c.get("text", "") for c in question if c.get("type") == "text")
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list):
                prompt = " ".join(str(p) for p in prompt)
            question = prompt or ""
        return tokens(prompt) + ["<img>"] * (576 * len(images)), question, images

    def _limits(self, body, chat, toks, question, images):
        max_tokens = body.get("max_tokens")
        if max_tokens is None:
            max_tokens = body.get("max_completion_tokens")
        # SamplingParams._verify_args (vllm/sampling_params.py): VLLMValidationError, whose str() carries the
        # parameter and value
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise RequestError("max_tokens must be at least 1, got %r. (parameter=max_tokens, value=%r)"
                               % (max_tokens, max_tokens), 400, "max_tokens")
        limit = self.args.max_model_len
        overflow = versions.vllm().get("context_overflow", "reserve")
        if overflow == "reserve" and max_tokens is not None and len(toks) + max_tokens > limit:
            # vllm/renderers/params.py (0.23.0, 0.27.1): max_input_tokens = max_model_len - max_tokens
            raise RequestError(
                "This model's maximum context length is %d tokens. However, you requested %d output tokens and your "
                "prompt contains %d input tokens, for a total of %d tokens. Please reduce the length of the input "
                "prompt or the number of requested output tokens. (parameter=input_tokens, value=%d)"
                % (limit, max_tokens, len(toks), len(toks) + max_tokens, len(toks)), 400, "input_tokens")
        if len(toks) >= limit:
            # 0.32.0: only the prompt must fit (max_tokens is clamped by get_max_tokens)
            raise RequestError(
                "This model's maximum context length is %d tokens. However, your prompt contains %d input tokens, "
                "which exceeds this limit even without any output tokens. Please reduce the length of the input "
                "prompt. (parameter=input_tokens, value=%d)" % (limit, len(toks), len(toks)), 400, "input_tokens")
        room = limit - len(toks)
        kvp = body.get("kv_transfer_params") or {}
        return {"chat": chat, "body": body, "prompt_tokens": toks, "question": question or "", "images": images,
                "max_tokens": min(max_tokens, room) if max_tokens else min(4096, room), "kv": kvp,
                "id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex}

    def answer(self, req):
        """-> (reasoning, content, tool_calls) for a request."""
        body, q = req["body"], req["question"]
        if self.garbage or self.broken_peers or req.get("garbage_kv") or self.overflow or garbled():
            rnd = random.Random(hashlib.sha256(q.encode()).digest())
            junk = "的 of ]] 血 。。 ## <unk> tens 零 ,, 0x ?? 了 _ a the 亿".split()
            return None, " ".join(rnd.choice(junk) for _ in range(24)), None
        tools = body.get("tools") or []
        names = [t.get("function", {}).get("name") for t in tools]
        if tools and body.get("tool_choice", "auto") != "none" and "get_weather" in names and \
                re.search(r"weather|天气|气温", q, re.I):
            city = re.search(r"(?:in|at|for)\s+([A-Z][\w\- ]+?)(?:[?.!,]|$)", q) or \
                re.search(r"([\u4e00-\u9fff]{2,4}?)(?:的)?(?:天气|气温)", q)
            args = {"city": (city.group(1).strip() if city else "Beijing")}
            call = {"id": "chatcmpl-tool-" + uuid.uuid4().hex[:24], "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps(args, ensure_ascii=False)}}
            return "The user wants the weather; I will call get_weather.", None, [call]
        content = "我是 Kimi，由月之暗面开发的人工智能助手。"
        reasoning = "The user asks who I am"
        m = ARITHMETIC.search(q)
        if m:
            a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
            value = a + b if op == "+" else a - b if op == "-" else a * b
            op = "*" if op in "x×" else op
            content += " %d%s%d=%d。" % (a, op, b, value)
            reasoning += " and to compute %d%s%d; %d%s%d = %d." % (a, op, b, a, op, b, value)
        for url in req["images"]:
            content += " " + describe_image(url)
        if len(req["prompt_tokens"]) > 2000:
            content += " (I read all %d tokens of your message.)" % len(req["prompt_tokens"])
        kwargs = body.get("chat_template_kwargs") or {}
        if not self.args.reasoning_parser or kwargs.get("thinking") is False:
            reasoning = None
        return reasoning, content, None

    def _start(self, req, steps, step_mult=1.0):
        """Submits the request to the scheduler: the group's step first (a rank that cannot take part fails it),
        the KV pulled from the prefill engine on a PD decode side. -> (stats, seq).

        What the scheduler counts follows vLLM (vllm/v1/core/sched/scheduler.py, kv_cache_manager.py): prefix-cache
        queries and hits only with prefix caching on; with a KV connector, external queries are the tokens not
        cached locally and external hits the tokens the connector loads (MooncakeConnector: the whole prompt of a
        remote-prefill request, vllm-ascend mooncake_connector.py get_num_new_matched_tokens)."""
        t0 = time.time()
        with self.lock:
            rank = self.next_engine % len(self.engines)
            self.next_engine += 1
        self.step()
        external = False
        if self.kv and req["kv"].get("do_remote_prefill"):
            kv = self.kv.pull(req["kv"].get("remote_host"), req["kv"].get("remote_port"), req["kv"].get("request_id"))
            # KV computed by a prefill whose collectives were garbage decodes to garbage
            req["garbage_kv"] = bool(kv.get("garbage"))
            external = True
        seq = sched.Seq(req["prompt_tokens"], steps, step_mult, external=external, connector=bool(self.kv), rank=rank)
        seq.t0 = t0
        self.scheduler.submit(seq)
        return self.engines[rank], seq

    def _emitted(self, seq, alive=None):
        """The tokens of each step the request gets, until it is finished; a request whose client went away is
        aborted (vLLM aborts it) and ClientGone raised."""
        try:
            while True:
                try:
                    size = seq.events.get(timeout=0.5)
                except queue.Empty:
                    if alive is not None and not alive():
                        raise ClientGone()
                    continue
                if size is None:
                    return
                yield size
        finally:
            if not seq.done:
                self.scheduler.abort(seq)

    @staticmethod
    def _cache(seq):
        return {"local": seq.local, "external_queries": seq.external_queries, "external_hits": seq.external_hits,
                "ttft": (seq.t_first or time.time()) - seq.t0, "t0": seq.t0}

    def decode_steps(self, req, n_out):
        """How the engine produces `n_out` tokens: [tokens of each step] and what its draft did. The first token comes
        with the prefill; with a draft (--speculative-config) every later step proposes k tokens, accepts a prefix
        of them (each position with SPEC_ACCEPT given the ones before; a garbled target accepts none) and emits the
        accepted ones plus the target's own. -> (steps, the cost of a step against a plain decode step, {drafts,
        draft_tokens, accepted, per_pos})."""
        spec = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": []}
        if not self.speculative or n_out <= 1:
            return [1] * n_out, 1.0, spec
        k = int(self.speculative["num_speculative_tokens"])
        accept = 0.0 if (self.garbage or garbled()) else SPEC_ACCEPT
        spec["per_pos"] = [0] * k
        draw = random.Random(req["id"])
        steps, left = [1], n_out - 1
        while left > 0:
            accepted = 0
            while accepted < k and draw.random() < accept:
                accepted += 1
            accepted = min(accepted, left - 1)
            spec["drafts"] += 1
            spec["draft_tokens"] += k
            spec["accepted"] += accepted
            for pos in range(accepted):
                spec["per_pos"][pos] += 1
            steps.append(accepted + 1)
            left -= accepted + 1
        return steps, 1 + SPEC_STEP_COST_PER_TOKEN * k, spec

    def _finish(self, stats, req, cache, n_out, reason, spec=None):
        e2e = time.time() - cache["t0"]
        with self.lock:
            if spec and spec["drafts"]:
                stats.spec_drafts += spec["drafts"]
                stats.spec_draft_tokens += spec["draft_tokens"]
                stats.spec_accepted += spec["accepted"]
                per_pos = stats.spec_accepted_per_pos
                per_pos.extend([0] * (len(spec["per_pos"]) - len(per_pos)))
                for pos, count in enumerate(spec["per_pos"]):
                    per_pos[pos] += count
            if self.args.enable_prefix_caching:
                stats.prefix_queries += len(req["prompt_tokens"])
                stats.prefix_hits += cache["local"]
            stats.external_queries += cache["external_queries"]
            stats.external_hits += cache["external_hits"]
            stats.prompt_tokens += len(req["prompt_tokens"])
            stats.generation_tokens += n_out
            stats.success[reason] = stats.success.get(reason, 0) + 1
            stats.ttft.observe(cache["ttft"])
            stats.e2e.observe(e2e)
            if n_out > 1:
                stats.tpot.observe((e2e - cache["ttft"]) / (n_out - 1))

    def _usage(self, req, cache, n):
        usage = {"prompt_tokens": len(req["prompt_tokens"]), "total_tokens": len(req["prompt_tokens"]) + n,
                 "completion_tokens": n}
        cached = cache["local"] + cache["external_hits"]
        # only with --enable-prompt-tokens-details, and only when something was cached (serving.py)
        if self.args.enable_prompt_tokens_details and cached:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return usage

    def _output(self, req):
        """-> (steps, calls, reason, metric_reason): steps are (field, piece) per output token, within max_tokens;
        the finish reason the client sees, and the one the engine's metrics record (the engine knows no tool
        calls: a parsed tool call finished with `stop`)."""
        reasoning, content, calls = self.answer(req)
        if not req["chat"]:
            n = req["max_tokens"] if req["body"].get("ignore_eos") else min(req["max_tokens"], 64)
            reason = "length" if n == req["max_tokens"] else "stop"
            return [("text", " tok")] * n, None, reason, reason
        field = versions.vllm()["reasoning_field"]
        steps = [(field, p) for p in pieces(reasoning)] + [("content", p) for p in pieces(content)]
        if calls:
            return steps, calls, "tool_calls", "stop"
        reason = "length" if len(steps) > req["max_tokens"] else "stop"
        return steps[:req["max_tokens"]], None, reason, reason

    def generate(self, req, alive=None):
        if req["kv"].get("do_remote_decode") and self.kv:
            return self._prefill_only(req, alive)
        steps, calls, reason, metric_reason = self._output(req)
        n = len(steps)
        decode, step_mult, spec = self.decode_steps(req, n)
        stats, seq = self._start(req, decode, step_mult)
        for _size in self._emitted(seq, alive):
            pass
        cache = self._cache(seq)
        self._finish(stats, req, cache, n, metric_reason, spec)
        text = dict((f, "".join(p for g, p in steps if g == f) or None) for f in
                    ("content", "text", versions.vllm()["reasoning_field"]))
        # stop strings end the output before them (finish_reason stop, stop_reason the string: vLLM's
        # StopChecker); `n` samples n choices of the prompt (SamplingParams.n), each counted in the usage
        stop_reason = None
        key = "content" if req["chat"] else "text"
        for word in stop_strings(req["body"]):
            if text[key] and word in text[key]:
                text[key], reason, stop_reason = text[key][:text[key].index(word)], "stop", word
        choices = max(1, int(req["body"].get("n") or 1))
        usage = self._usage(req, cache, n * choices)
        if req["chat"]:
            field = versions.vllm()["reasoning_field"]
            msg = {"role": "assistant", "content": None if calls else text["content"], field: text[field],
                   "tool_calls": calls or []}
            logprobs = chat_logprobs(steps, req["body"])
            return {"id": req["id"], "object": "chat.completion", "created": int(time.time()), "model": self.served,
                    "choices": [{"index": i, "message": msg, "logprobs": logprobs, "finish_reason": reason,
                                 "stop_reason": stop_reason} for i in range(choices)], "usage": usage}
        return {"id": req["id"], "object": "text_completion", "created": int(time.time()), "model": self.served,
                "choices": [{"index": i, "text": text["text"] or "", "logprobs": None, "finish_reason": reason,
                             "stop_reason": stop_reason} for i in range(choices)], "usage": usage}

    def _prefill_only(self, req, alive=None):
        """The prefill side of PD: one token, and where the decode side fetches the KV from."""
        stats, seq = self._start(req, [1])
        for _size in self._emitted(seq, alive):
            pass
        cache = self._cache(seq)
        rid = req["kv"].get("request_id") or req["id"]
        self.kv.keep(rid, hashlib.sha256("\x00".join(req["prompt_tokens"]).encode()).hexdigest(),
                     len(req["prompt_tokens"]), bool(self.garbage or self.broken_peers))
        self._finish(stats, req, cache, 1, "length")
        params = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": self.kv.engine_id,
                  "remote_host": self.kv.host, "remote_port": self.kv.port, "remote_block_ids": [0],
                  "request_id": rid}
        choice = {"index": 0, "finish_reason": "length"}
        choice.update({"message": {"role": "assistant", "content": ""}} if req["chat"] else {"text": ""})
        return {"id": req["id"], "object": "chat.completion" if req["chat"] else "text_completion",
                "model": self.served, "choices": [choice], "usage": self._usage(req, cache, 1),
                "kv_transfer_params": params}

    def generate_stream(self, req, alive=None):
        """SSE events as vLLM's serving.py streams them: for chat a first role chunk; one chunk per output token,
        the last one carrying finish_reason (no empty trailing chunk); a usage chunk only when
        stream_options.include_usage (or --enable-force-include-usage); then [DONE]. A client that hangs up before
        its first token is aborted too (Starlette's StreamingResponse listens for the disconnect beside the stream,
        and vLLM aborts the request when it is cancelled)."""
        steps, calls, reason, metric_reason = self._output(req)
        decode, step_mult, spec = self.decode_steps(req, len(steps))
        stats, seq = self._start(req, decode, step_mult)
        emitted = self._emitted(seq, alive)
        # the prefill (and a KV pull) fails before the response starts; the first token comes with it
        first = next(emitted, None)
        created = int(time.time())
        kind = "chat.completion.chunk" if req["chat"] else "text_completion"
        opts = req["body"].get("stream_options") or {}
        include_usage = bool(opts.get("include_usage")) or self.args.enable_force_include_usage
        continuous = include_usage and bool(opts.get("continuous_usage_stats"))

        def chunk(delta, finish=None, n=0):
            if req["chat"]:
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": delta.get("text", ""), "logprobs": None, "finish_reason": finish}
            event = {"id": req["id"], "object": kind, "created": created, "model": self.served, "choices": [choice]}
            if continuous:
                event["usage"] = {"prompt_tokens": len(req["prompt_tokens"]), "completion_tokens": n,
                                  "total_tokens": len(req["prompt_tokens"]) + n}
            return json.dumps(event)

        if req["chat"]:
            yield chunk({"role": "assistant", "content": ""})
        last = len(steps) - 1 if not calls else None
        i = 0
        try:
            for size in _chain_sizes(first, emitted):
                # a step's tokens arrive together (a verify step emits the accepted draft tokens and the target's own)
                for field, piece in steps[i:i + size]:
                    yield chunk({field: piece}, reason if i == last else None, i + 1)
                    i += 1
        finally:
            emitted.close()  # a client that went away: the request is aborted
        if calls:
            yield chunk({"tool_calls": [dict(c, index=i) for i, c in enumerate(calls)]}, reason, len(steps))
        cache = self._cache(seq)
        self._finish(stats, req, cache, len(steps), metric_reason, spec)
        if include_usage:
            yield json.dumps({"id": req["id"], "object": kind, "created": created, "model": self.served,
                              "choices": [], "usage": self._usage(req, cache, len(steps))})
        yield "[DONE]"

    # ------------------------------------------------------------------ metrics
    def metrics(self):
        lines = []
        name = self.served
        series = [(str(i), s) for i, s in enumerate(self.engines)]

        def emit(metric, kind, value_of, extra=""):
            lines.append("# TYPE %s %s" % (metric, kind))
            for engine, s in series:
                lines.append('%s{engine="%s",model_name="%s"%s} %s' % (metric, engine, name, extra, value_of(s)))

        counts = self.scheduler.counts()
        rank_of = dict((id(st), i) for i, st in enumerate(self.engines))
        emit("vllm:num_requests_running", "gauge", lambda s: counts.get(rank_of[id(s)], (0, 0))[0])
        emit("vllm:num_requests_waiting", "gauge", lambda s: counts.get(rank_of[id(s)], (0, 0))[1])
        usage = self.scheduler.pool.usage()
        emit("vllm:kv_cache_usage_perc", "gauge", lambda s: usage)
        emit("vllm:prefix_cache_queries_total", "counter", lambda s: s.prefix_queries)
        emit("vllm:prefix_cache_hits_total", "counter", lambda s: s.prefix_hits)
        emit("vllm:external_prefix_cache_queries_total", "counter", lambda s: s.external_queries)
        emit("vllm:external_prefix_cache_hits_total", "counter", lambda s: s.external_hits)
        emit("vllm:num_preemptions_total", "counter", lambda s: s.preemptions)
        emit("vllm:prompt_tokens_total", "counter", lambda s: s.prompt_tokens)
        emit("vllm:generation_tokens_total", "counter", lambda s: s.generation_tokens)
        if self.speculative:
            # vLLM's SpecDecodingProm (vllm/v1/spec_decode/metrics.py), exported only with a speculative config
            emit("vllm:spec_decode_num_drafts_total", "counter", lambda s: s.spec_drafts)
            emit("vllm:spec_decode_num_draft_tokens_total", "counter", lambda s: s.spec_draft_tokens)
            emit("vllm:spec_decode_num_accepted_tokens_total", "counter", lambda s: s.spec_accepted)
            k = int(self.speculative["num_speculative_tokens"])
            lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter")
            for engine, s in series:
                per_pos = s.spec_accepted_per_pos + [0] * (k - len(s.spec_accepted_per_pos))
                for pos in range(k):
                    lines.append('vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="%s",model_name="%s",'
                                 'position="%d"} %d' % (engine, name, pos, per_pos[pos]))
        # one observation per engine step, of the tokens it scheduled (vllm/v1/metrics/loggers.py); the stand-in's DP
        # ranks share one scheduler, reported on engine 0
        lines += ["# TYPE vllm:iteration_tokens_total histogram",
                  'vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="%s"} %d' % (
                      name, self.scheduler.steps),
                  'vllm:iteration_tokens_total_count{engine="0",model_name="%s"} %d' % (name, self.scheduler.steps),
                  'vllm:iteration_tokens_total_sum{engine="0",model_name="%s"} %d' % (name, self.scheduler.step_tokens)]
        lines.append("# TYPE vllm:request_success_total counter")
        for engine, s in series:
            for reason in FINISH_REASONS:
                lines.append('vllm:request_success_total{engine="%s",finished_reason="%s",model_name="%s"} %d'
                             % (engine, reason, name, s.success.get(reason, 0)))
        for metric, attr in (("vllm:time_to_first_token_seconds", "ttft"), ("vllm:e2e_request_latency_seconds", "e2e"),
                             ("vllm:request_time_per_output_token_seconds", "tpot")):
            lines.append("# TYPE %s histogram" % metric)
            for engine, s in series:
                h = getattr(s, attr)
                for b, c in zip(BUCKETS, h.counts):
                    lines.append('%s_bucket{engine="%s",le="%s",model_name="%s"} %d' % (metric, engine, b, name, c))
                lines.append('%s_bucket{engine="%s",le="+Inf",model_name="%s"} %d' % (metric, engine, name, h.n))
                lines.append('%s_sum{engine="%s",model_name="%s"} %f' % (metric, engine, name, h.total))
                lines.append('%s_count{engine="%s",model_name="%s"} %d' % (metric, engine, name, h.n))
        return "\n".join(lines) + "\n"


def describe_image(url):
    """What the stand-in 'sees': the size of a PNG/JPEG data URL."""
    if not url.startswith("data:"):
        return "(I cannot fetch images from %s)" % url.split(":", 1)[0]
    try:
        raw = base64.b64decode(url.split(",", 1)[1])
    except (ValueError, IndexError):
        return "(the image could not be decoded)"
    if raw[:8] == b"\x89PNG\r\n\x1a\n":
        w, h = struct.unpack(">II", raw[16:24])
        return "The image is a %dx%d PNG." % (w, h)
    if raw[:2] == b"\xff\xd8":
        return "The image is a JPEG."
    return "(the image format is not recognized)"
