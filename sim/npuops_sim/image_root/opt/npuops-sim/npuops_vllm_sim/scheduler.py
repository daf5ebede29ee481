"""The stand-in's scheduler, modelled on vLLM V1's (vllm/v1/core/sched/scheduler.py, kv_cache_manager.py,
block_pool.py), so that a busy engine behaves like one.

Every step: the running requests first (a decode step each, or the next chunk of a prompt), then waiting requests
while fewer than max_num_seqs run, within a budget of max_num_batched_tokens tokens per step (chunked prefill). The KV
cache is a pool of block_size-token blocks; a new request first looks up the longest prefix of full prompt blocks
that is cached (automatic prefix caching: the last prompt token is always computed), blocks of finished requests stay
cached until a new allocation evicts the least recently used of them, and when a running request cannot get a block
the last running request is preempted (its blocks freed, recomputed later: vLLM's RECOMPUTE) and goes back to the
front of the waiting queue. A step takes the time of a small cost model: the prompt tokens it computes at a prefill
rate, plus a decode step that grows with the batch. NPUOPS_SIM_SPEED runs the same shapes faster.
"""
import collections
import hashlib
import os
import queue
import threading
import time

SPEED = float(os.environ.get("NPUOPS_SIM_SPEED", "1") or 1)
# a decode step's time grows with the sequences in it (the field report: TPOT 48.7 ms at 1 concurrent request and
# 197.7 ms at 64 on 2 x 910C, random 2048/512, where prefill chunks share the steps too)
DECODE_GROWTH_PER_SEQ = float(os.environ.get("NPUOPS_SIM_DECODE_GROWTH", "0.03"))


class Seq(object):
    """One request in the scheduler: its prompt tokens, the tokens it is to emit and in what steps (a draft emits
    several per step), where it stands, and a queue of what each step emitted (None when it is finished)."""

    def __init__(self, toks, steps, step_mult=1.0, external=False, connector=False, rank=0):
        self.toks = toks
        self.steps = list(steps)  # tokens emitted per step: the first with the prefill, then one per decode step
        self.n_out = sum(self.steps)
        self.step_mult = step_mult
        self.external = external  # its prompt's KV comes from a prefill engine (PD decode side)
        self.connector = connector or external  # the engine has a KV connector (its external queries are counted)
        self.rank = rank
        self.target = len(toks)  # tokens to prefill (the prompt; after a preemption, the prompt and the output so far)
        self.computed = 0
        self.kv = 0  # tokens in the KV cache
        self.emitted = 0
        self.hashed = []  # cached blocks it holds (prefix-cache keys)
        self.plain = 0  # blocks it holds that are not (yet) cached
        self.looked_up = False  # once: its first admission's hits are its usage's cached tokens
        self.pending_lookup = True  # at each admission (a preempted request looks up again)
        self.local = 0  # prefix-cache hit of its first admission, in tokens
        self.external_queries = self.external_hits = 0
        self.t0 = time.time()
        self.t_first = None
        self.events = queue.Queue()
        self.done = False
        self._keys = None

    def keys(self, block):
        """The prefix-cache keys of the prompt's full blocks, hashed once (admission and every prefill chunk read them)."""
        if self._keys is None:
            self._keys = block_keys(self.toks, block, len(self.toks))
        return self._keys

    @property
    def prefilling(self):
        return self.computed < self.target


class BlockPool(object):
    """KV blocks: free ones, and cached ones (by the hash of the prompt up to the end of the block) with the number
    of requests holding each; a cached block nobody holds is free too and is evicted least recently used first."""

    def __init__(self, num_blocks):
        self.total = max(1, int(num_blocks))
        self.free = self.total
        self.refs = {}
        self.evictable = collections.OrderedDict()

    def available(self):
        return self.free + len(self.evictable)

    def take(self, n):
        if n > self.available():
            return False
        use = min(n, self.free)
        self.free -= use
        for _ in range(n - use):
            key, _v = self.evictable.popitem(last=False)
            del self.refs[key]
        return True

    def hit(self, key):
        if key not in self.refs:
            return False
        self.refs[key] += 1
        self.evictable.pop(key, None)
        return True

    def insert(self, key):
        """A block just filled with prompt tokens becomes cached (held by its request); False when another request
        cached the same block first (the caller keeps its own as a plain block)."""
        if key in self.refs:
            return False
        self.refs[key] = 1
        return True

    def release(self, hashed, plain):
        for key in hashed:
            self.refs[key] -= 1
            if self.refs[key] == 0:
                self.evictable[key] = True
        self.free += plain

    def usage(self):
        return round(1.0 - float(self.available()) / self.total, 4)


def block_keys(toks, block, upto):
    """The prefix-cache keys of the full blocks of toks[:upto]: each the hash of everything up to its end."""
    h = hashlib.sha256()
    out = []
    for i in range(upto // block):
        h.update("\x00".join(toks[i * block:(i + 1) * block]).encode())
        h.update(b"\x01")
        out.append(h.hexdigest())
    return out


class Scheduler(object):
    def __init__(self, max_num_seqs, max_num_batched_tokens, block_size, kv_tokens, prefix_caching,
                 prefill_tokens_per_s, decode_step_s, parallel=1, stalled=lambda: False, on_preempt=lambda seq: None):
        self.max_seqs = max(1, int(max_num_seqs))
        self.budget = max(1, int(max_num_batched_tokens))
        self.block = max(1, int(block_size))
        self.pool = BlockPool(int(kv_tokens) // self.block)
        self.prefix_caching = prefix_caching
        self.prefill_tps = float(prefill_tokens_per_s)
        self.decode_s = float(decode_step_s)
        self.parallel = max(1, int(parallel))  # DP ranks stepping side by side (a batch is split between them)
        self.stalled = stalled  # a wedged engine: no step is taken (its API still answers)
        self.frozen = None  # the scheduler's counts as the last step left them, while stalled
        self.on_preempt = on_preempt
        self.waiting = collections.deque()
        self.running = []
        self.cond = threading.Condition()
        self.prefix_queries = self.prefix_hits = 0
        self.preemptions = 0
        # tokens of every engine step (vLLM's vllm:iteration_tokens_total histogram)
        self.steps = 0
        self.step_tokens = 0
        threading.Thread(target=self._loop, daemon=True).start()

    # --------------------------------------------------------------------------------------- requests
    def submit(self, seq):
        with self.cond:
            self.waiting.append(seq)
            self.cond.notify()

    def abort(self, seq):
        """The client went away (vLLM aborts the request): its blocks are freed."""
        with self.cond:
            if seq.done:
                return
            if seq in self.running:
                self.running.remove(seq)
            elif seq in self.waiting:
                self.waiting.remove(seq)
            self._free(seq)
            seq.done = True

    def counts(self):
        """-> {rank: (running, waiting)}: what the last step published while the engine is wedged (vLLM V1's API
        server sets its scheduler gauges from the SchedulerStats the engine core sends with each step's outputs -
        vllm/v1/metrics/loggers.py, PrometheusStatLogger.record - so a core stuck in a collective leaves them where
        its last step put them, whatever the clients abort meanwhile)."""
        with self.cond:
            if self.frozen is not None and self.stalled():
                return dict(self.frozen)
            self.frozen = None  # stepping again (an idle engine's loop would not look until a request comes)
            return self._live_counts()

    def _live_counts(self):
        with self.cond:
            out = {}
            for seq in self.running:
                r, w = out.get(seq.rank, (0, 0))
                out[seq.rank] = (r + 1, w)
            for seq in self.waiting:
                r, w = out.get(seq.rank, (0, 0))
                out[seq.rank] = (r, w + 1)
            return out

    # --------------------------------------------------------------------------------------- blocks
    def _blocks_for(self, tokens):
        return -(-tokens // self.block)

    def _held(self, seq):
        return len(seq.hashed) + seq.plain

    def _grow(self, seq, tokens):
        need = self._blocks_for(tokens) - self._held(seq)
        if need <= 0:
            return True
        if not self.pool.take(need):
            return False
        seq.plain += need
        return True

    def _free(self, seq):
        self.pool.release(seq.hashed, seq.plain)
        seq.hashed, seq.plain = [], 0

    def _cache_prompt(self, seq):
        """The prompt's full blocks become cached as the prefill completes them."""
        if not self.prefix_caching:
            return
        keys = seq.keys(self.block)[:min(seq.computed, len(seq.toks)) // self.block]
        for key in keys[len(seq.hashed):]:
            if seq.plain and self.pool.insert(key):
                seq.hashed.append(key)
                seq.plain -= 1

    def _lookup(self, seq):
        """Admission of a new (or preempted) request: the cached prefix it can reuse, counted as vLLM counts prefix
        queries and hits; with a KV connector, what the prefill engine computed."""
        hits = 0
        if self.prefix_caching:
            for key in seq.keys(self.block)[:max(0, len(seq.toks) - 1) // self.block]:
                if not self.pool.hit(key):
                    break
                seq.hashed.append(key)
                hits += self.block
            self.prefix_queries += len(seq.toks)
            self.prefix_hits += hits
        if not seq.looked_up:
            seq.local = hits
            if seq.connector:
                seq.external_queries = len(seq.toks) - hits
            if seq.external:
                seq.external_hits = seq.external_queries
        seq.looked_up = True
        seq.pending_lookup = False
        seq.computed = seq.kv = hits
        if seq.external and seq.emitted == 0:
            # the prompt's KV was pulled from the prefill engine: only its last token is computed here
            seq.computed = seq.kv = max(hits, len(seq.toks) - 1)

    def _preempt(self, seq):
        self.running.remove(seq)
        self._free(seq)
        seq.target = len(seq.toks) + seq.emitted
        seq.computed = seq.kv = 0
        seq.pending_lookup = True
        self.waiting.appendleft(seq)
        self.preemptions += 1
        self.on_preempt(seq)

    # --------------------------------------------------------------------------------------- steps
    def _schedule(self):
        budget, plan, preempted = self.budget, [], False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.target - seq.computed, budget) if seq.prefilling else seq.steps[0] if seq.steps else 1
            while not self._grow(seq, seq.kv + n):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq not in self.running:
                break
            plan.append((seq, n))
            budget -= n if seq.prefilling else 1
            i += 1
        while self.waiting and len(self.running) < self.max_seqs and budget > 0 and not preempted:
            seq = self.waiting[0]
            if seq.pending_lookup:
                self._lookup(seq)
            n = min(seq.target - seq.computed, budget)
            if n <= 0:
                n = 1
            if not self._grow(seq, seq.kv + n):
                break
            self.waiting.popleft()
            self.running.append(seq)
            plan.append((seq, n))
            budget -= n
        return plan

    def _cost(self, plan):
        prefill = sum(n for seq, n in plan if seq.prefilling)
        decoding = [seq for seq, _n in plan if not seq.prefilling]
        seconds = prefill / self.prefill_tps
        if decoding:
            mult = max(seq.step_mult for seq in decoding)
            per_rank = -(-len(decoding) // self.parallel)
            seconds += self.decode_s * mult * (1 + DECODE_GROWTH_PER_SEQ * (per_rank - 1))
        elif prefill:
            seconds += self.decode_s  # the step that samples the first token
        return seconds / SPEED

    def _advance(self, plan):
        now = time.time()
        for seq, n in plan:
            if seq.done or seq not in self.running:
                continue
            if seq.prefilling:
                seq.computed += n
                seq.kv += n
                self._cache_prompt(seq)
                if seq.prefilling:
                    continue
                if seq.emitted:
                    continue  # recomputed after a preemption: decoding goes on with the next step
                size = seq.steps.pop(0) if seq.steps else 1
                seq.t_first = now
            else:
                size = seq.steps.pop(0) if seq.steps else 1
                seq.kv += size
            size = min(size, seq.n_out - seq.emitted)
            seq.emitted += size
            seq.events.put(size)
            if seq.emitted >= seq.n_out:
                self.running.remove(seq)
                self._free(seq)
                seq.done = True
                seq.events.put(None)

    def _loop(self):
        stall_checked, stalled = 0.0, False
        while True:
            with self.cond:
                while not self.running and not self.waiting:
                    self.cond.wait(1.0)
            if time.time() - stall_checked > 0.25:
                stalled, stall_checked = self.stalled(), time.time()
                with self.cond:
                    if stalled and self.frozen is None:
                        self.frozen = self._live_counts()
                    elif not stalled:
                        self.frozen = None
            if stalled:
                time.sleep(0.25)
                continue
            with self.cond:
                plan = self._schedule()
            seconds = self._cost(plan) if plan else 0.01
            time.sleep(seconds)
            with self.cond:
                self._advance(plan)
                if plan:
                    self.steps += 1
                    self.step_tokens += sum(n for _seq, n in plan)
