"""Token-level engine following vLLM V1's scheduler, with a fitted step-time model.

Each engine step (vLLM ``Scheduler.schedule()`` then one forward pass; reference/simulation.md §3):

1. RUNNING requests first, in admission order, from a token budget of ``max_num_batched_tokens``: a
   decoding request takes 1 token, a request still prefilling takes ``min(remaining, budget)`` tokens
   (chunked prefill). KV blocks of ``block_size`` tokens are allocated as a request's tokens grow.
2. When an allocation fails, the most recently admitted running request is preempted (recompute: its
   blocks are freed, ``computed`` reset to 0, it goes to the FRONT of the waiting queue, its
   ``preemptions`` count goes up), repeatedly, until the allocation fits or the request itself was
   the one preempted.
3. Only in a step without preemption are WAITING requests admitted, first come first served, while
   budget remains and fewer than ``max_num_seqs`` run; admission stops at the first request whose
   first chunk's blocks do not fit.
4. The step lasts ``StepTimeModel.step_time`` (admit.engine.steptime). At its end every scheduled request
   whose prompt (plus, after a preemption, its earlier output) is fully computed samples one token; a
   request that has produced ``output_tokens`` tokens finishes and frees its blocks. The output length is
   known only to the engine's bookkeeping, never to the scheduler.

A request submitted during a step waits for the next step boundary, as in vLLM. With a front-end delay
``d`` (``Preset.frontend_delay_s``, or the constructor's ``frontend_delay_s``; 0 by default, and then nothing
below changes), a request submitted at ``t`` joins the waiting queue only at ``t + d``: the server's HTTP,
tokenising and API-server-to-engine-core hop, which hold no KV and no batch slot. Its arrival there is an
engine event (``next_event_time``). ``num_waiting`` counts the scheduler's queue only, as vLLM's gauge does;
``tenant_tokens`` counts requests in the front end too.

Speed. Stretches where nothing can change the batch — every running request decoding, no waiting work
that could be admitted, nobody finishing, no KV allocation that could fail — are simulated as one
*macro-step* of k decode steps in closed form: each decoding request's context grows by one per step,
so the step times form an arithmetic series ``base + kv_read·n·j``. Decoding requests advance in
lockstep against one shared counter ``G`` (a request's token count is ``c + G``), so a macro-step costs
O(1) whatever the batch size; block usage is kept as per-residue counts so ``Σ ceil((c+G)/16)`` is O(16).
A ``submit``, ``abort`` or ``sync`` inside a macro-step commits the whole steps done by then; the first
two also cut the macro-step short at the end of the step in progress. ``macro_steps=False`` runs the same
engine one step at a time (the reference the tests compare against), and so does setting ``on_tokens``.

Hooks and counters for a serving front-end (the emulator): ``on_tokens(req, n_new, now)`` is called when a
request produces output tokens; ``abort(req, now)`` removes a request; ``num_preemptions``,
``prompt_tokens_total``, ``generation_tokens_total``, ``prefill_tokens_computed``, ``num_steps`` and
``iteration_tokens`` (tokens per step → number of steps) mirror vLLM's Prometheus counters, and
``request_intervals(req)`` gives vLLM's per-request queue/prefill/decode/inference times.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from admit.engine.presets import Preset, get_preset
from admit.engine.request import Request
from admit.engine.steptime import StepTimeModel

TokenListener = Callable[[Request, int, float], None]


class _Seq:
    """The engine's record of one running request (a new one each time the request is admitted)."""

    __slots__ = ("alive", "blocks", "c", "lock", "order", "req")

    def __init__(self, req: Request, order: int) -> None:
        self.req = req
        self.order = order
        self.c = 0  # in lockstep: the request holds c + G tokens (prompt + generated)
        self.blocks = 0  # KV blocks held, when not in lockstep
        self.lock = False
        self.alive = True


@dataclass(frozen=True)
class RequestIntervals:
    """vLLM's per-request intervals (vllm/v1/metrics/stats.py), in seconds."""

    queue: float  # first scheduled − entered the engine
    prefill: float  # first token − first scheduled (preemptions included)
    decode: float  # finished − first token
    inference: float  # finished − first scheduled


def request_intervals(req: Request) -> RequestIntervals:
    return RequestIntervals(
        queue=req.first_scheduled - req.dispatched,
        prefill=req.first_token - req.first_scheduled,
        decode=req.finished - req.first_token,
        inference=req.finished - req.first_scheduled,
    )


class TokenEngine:
    def __init__(
        self,
        preset: Preset | str = "h200-llama3-8b",
        *,
        max_num_batched_tokens: int | None = None,
        max_num_seqs: int | None = None,
        num_gpu_blocks: int | None = None,
        step_model: StepTimeModel | None = None,
        macro_steps: bool = True,
        frontend_delay_s: float | None = None,
    ) -> None:
        p = get_preset(preset) if isinstance(preset, str) else preset
        self.preset = p
        self.step_model = step_model or p.step
        self.frontend_delay_s = float(p.frontend_delay_s if frontend_delay_s is None else frontend_delay_s)
        if not (self.frontend_delay_s >= 0 and math.isfinite(self.frontend_delay_s)):
            raise ValueError(f"frontend_delay_s must be a finite number >= 0, got {frontend_delay_s!r}")
        self.block_size = p.block_size
        self.max_num_batched_tokens = int(max_num_batched_tokens or p.max_num_batched_tokens)
        self.max_num_seqs = int(max_num_seqs or p.max_num_seqs)
        self.num_gpu_blocks = int(num_gpu_blocks or p.num_gpu_blocks)
        self.max_model_len = p.max_model_len
        for name in ("max_num_batched_tokens", "max_num_seqs", "num_gpu_blocks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}), as vLLM requires"
            )
        self.macro_steps = macro_steps
        self.on_tokens: TokenListener | None = None

        self._waiting: deque[Request] = deque()
        self._arriving: deque[tuple[float, Request]] = deque()  # in the front end: (time it reaches waiting, req)
        self._running: dict[Request, _Seq] = {}  # admission order
        self._partials: list[_Seq] = []  # running, not in lockstep (prefilling); at most one between steps
        self._explicit_blocks = 0  # blocks held by requests not in lockstep
        self._order = 0
        # lockstep decoders: aggregates over c, the heap of finishing counters
        bs = self.block_size
        self._G = 0
        self._n = 0
        self._A = 0  # Σ c
        self._sumq = 0  # Σ (c + bs − 1) // bs
        self._cnt = [0] * bs  # counts of (c + bs − 1) % bs
        self._heap: list[tuple[int, int, _Seq]] = []
        # the step (or macro-step) in flight
        self._busy = False
        self._k = 0  # steps left in the macro-step, the one in progress included; 0 = wake-up event
        self._t0 = 0.0  # start of the step in progress
        self._end = math.inf
        self._base = 0.0  # duration of the step in progress
        self._slope = 0.0  # increase of the step duration per further step
        self._chunks: list[tuple[_Seq, int]] = []  # prefill chunks of the step in progress
        self._step_tokens = 0
        # counters (vLLM's Prometheus names in the module docstring)
        self.num_preemptions = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.prefill_tokens_computed = 0
        self.num_steps = 0
        self.iteration_tokens: dict[int, int] = {}

    # ------------------------------------------------------------------ Engine protocol
    def submit(self, req: Request, now: float) -> None:
        need = req.prompt_tokens + req.output_tokens
        if req.prompt_tokens < 1 or req.output_tokens < 1:
            raise ValueError(f"{req!r}: prompt_tokens and output_tokens must be >= 1")
        if need > self.max_model_len:
            raise ValueError(f"{req!r}: prompt + output = {need} tokens exceeds max_model_len {self.max_model_len}")
        if -(-need // self.block_size) > self.num_gpu_blocks:
            raise ValueError(f"{req!r}: {need} tokens can never fit in {self.num_gpu_blocks} KV blocks")
        if math.isnan(req.dispatched):
            req.dispatched = now
        if self.frontend_delay_s > 0:  # it reaches the scheduler later (an event: next_event_time)
            self._arriving.append((now + self.frontend_delay_s, req))
        else:
            self._enter(req, now)

    def _enter(self, req: Request, now: float) -> None:
        """``req`` joins the waiting queue at ``now``; a step in progress ends the macro-step it belongs to."""
        self._waiting.append(req)
        if self._busy:
            self._advance_to(now)
            self._truncate()
        else:
            self._busy = True
            self._k = 0
            self._t0 = self._end = now

    def next_event_time(self) -> float:
        if self._arriving:
            t = self._arriving[0][0]
            return t if t < self._end else self._end
        return self._end

    def process_event(self, now: float) -> list[Request]:
        arriving = self._arriving
        if not arriving:
            return self._step_event(now)
        # a step that ends now ends first, then requests reach the queue: the order of a step end and a
        # submit at one time in the simulation's loop, so a delay d is the same as submitting d later
        finished = self._step_event(now) if self._end <= now else []
        while arriving and arriving[0][0] <= now:
            self._enter(arriving.popleft()[1], now)
        return finished

    def _step_event(self, now: float) -> list[Request]:
        if not self._busy:
            return []
        finished = self._end_step(now) if self._k > 0 else []
        if self._running or self._waiting:
            self._schedule(now)
        else:
            self._busy = False
            self._k = 0
            self._end = math.inf
        return finished

    def memory_utilisation(self) -> float:
        """KV-cache usage in [0, 1], as vLLM's ``vllm:kv_cache_usage_perc``."""
        return self.kv_blocks_used / self.num_gpu_blocks

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    # ------------------------------------------------------------------ front-end surface
    def sync(self, now: float) -> None:
        """Bring counters and gauges up to the whole steps completed by ``now`` (inside a macro-step)."""
        if self._busy:
            self._advance_to(now)

    def abort(self, req: Request, now: float) -> bool:
        """Remove ``req`` (client gone), freeing its blocks; False if the engine does not hold it."""
        if req in self._running:
            self._advance_to(now)
            self._truncate()
            s = self._running.pop(req)
            self._release(s)
            return True
        try:
            self._waiting.remove(req)
        except ValueError:
            for i, (_, r) in enumerate(self._arriving):
                if r is req:
                    del self._arriving[i]
                    return True
            return False
        return True

    @property
    def kv_blocks_used(self) -> int:
        in_flight = 1 if (self._busy and self._k > 0) else 0
        return self._explicit_blocks + self._lock_blocks(self._G - 1 + in_flight)

    @property
    def kv_bytes_used(self) -> int:
        return self.kv_blocks_used * self.preset.kv_block_bytes

    @property
    def gpu_memory_bytes_used(self) -> float:
        """Weights + activation reserve + KV blocks in use."""
        return self.preset.weights_bytes + self.preset.activation_bytes + self.kv_bytes_used

    def waiting(self) -> list[Request]:
        return list(self._waiting)

    def tenant_tokens(self, n_tenants: int) -> tuple[list[float], list[float]]:
        """Per tenant: prompt tokens of its requests with no first token yet, and prompt + generated so far of
        all its requests here (running, or waiting: a preempted one keeps what it generated)."""
        prefill = [0.0] * n_tenants
        held = [0.0] * n_tenants
        g = self._G
        for s in self._running.values():
            r = s.req
            if s.lock:  # in lockstep the request holds c + G tokens (prompt + generated)
                held[r.tenant] += s.c + g
            else:
                held[r.tenant] += r.prompt_tokens + r.generated
            if r.first_token != r.first_token:  # NaN: no first token yet
                prefill[r.tenant] += r.prompt_tokens
        for r in self._waiting:
            held[r.tenant] += r.prompt_tokens + r.generated
            if r.first_token != r.first_token:
                prefill[r.tenant] += r.prompt_tokens
        for _, r in self._arriving:  # in the front end: its whole prompt is still to be computed
            held[r.tenant] += r.prompt_tokens
            prefill[r.tenant] += r.prompt_tokens
        return prefill, held

    def running(self) -> list[Request]:
        """Running requests in admission order (``generated``/``computed`` brought up to date)."""
        for s in self._running.values():
            if s.lock:
                self._materialize(s, self._G)
        return list(self._running)

    # ------------------------------------------------------------------ lockstep bookkeeping
    def _lock_add(self, s: _Seq, tokens: int) -> None:
        """``s`` (holding blocks for tokens − 1 computed tokens) joins the lockstep decoders."""
        bs = self.block_size
        c = tokens - self._G
        s.c = c
        s.lock = True
        u = c + bs - 1
        self._sumq += u // bs
        self._cnt[u % bs] += 1
        self._n += 1
        self._A += c
        self._explicit_blocks -= s.blocks
        r = s.req
        heapq.heappush(self._heap, (r.output_tokens + r.prompt_tokens - c, s.order, s))

    def _lock_remove(self, s: _Seq) -> None:
        bs = self.block_size
        u = s.c + bs - 1
        self._sumq -= u // bs
        self._cnt[u % bs] -= 1
        self._n -= 1
        self._A -= s.c
        s.lock = False

    def _lock_blocks(self, x: int) -> int:
        """Σ over lockstep requests of ceil((c + x) / block_size): their blocks when holding c + x tokens."""
        if not self._n:
            return 0
        bs = self.block_size
        q, r = divmod(x, bs)
        return self._sumq + self._n * q + (sum(self._cnt[bs - r :]) if r else 0)

    def _materialize(self, s: _Seq, g: int) -> None:
        r = s.req
        tokens = s.c + g
        r.computed = tokens - 1
        r.generated = tokens - r.prompt_tokens

    def _release(self, s: _Seq) -> None:
        """Free a running request's blocks (finished, preempted or aborted)."""
        s.alive = False
        if s.lock:
            self._materialize(s, self._G)
            self._lock_remove(s)
        else:
            self._explicit_blocks -= s.blocks
            self._partials.remove(s)
        s.blocks = 0

    # ------------------------------------------------------------------ scheduling
    def _schedule(self, now: float) -> None:
        bs = self.block_size
        G = self._G
        n = self._n
        budget = self.max_num_batched_tokens - n
        held = self._lock_blocks(G - 1)
        free = self.num_gpu_blocks - self._explicit_blocks - held
        need = self._lock_blocks(G) - held
        plan = []
        for s in self._partials:
            r = s.req
            chunk = min(r.prompt_tokens + r.generated - r.computed, budget)
            if chunk <= 0:
                break
            nb = -(-(r.computed + chunk) // bs) - s.blocks
            plan.append((s, chunk, nb))
            need += nb
            budget -= chunk
        if need > free:
            self._schedule_exact(now)
            return
        free -= need
        tokens = n
        pairs = 0.0
        chunks: list[tuple[_Seq, int]] = []
        for s, chunk, nb in plan:
            s.blocks += nb
            self._explicit_blocks += nb
            chunks.append((s, chunk))
            tokens += chunk
            pairs += chunk * (s.req.computed + (chunk + 1) / 2.0)
        tokens, pairs = self._admit(now, budget, free, tokens, pairs, chunks)
        kv = self._A + n * G
        dt = self.step_model.step_time(tokens, n + len(chunks), kv, pairs)
        if tokens == 0:
            raise RuntimeError("token engine scheduled an empty step (bug)")
        k = 1
        if not chunks and self.macro_steps and self.on_tokens is None:
            k = self._macro_length()
        self._start(now, dt, k, chunks, tokens)

    def _admit(
        self, now: float, budget: int, free: int, tokens: int, pairs: float, chunks: list[tuple[_Seq, int]]
    ) -> tuple[int, float]:
        """Admit waiting requests FCFS while budget, max_num_seqs and KV blocks allow."""
        bs = self.block_size
        waiting = self._waiting
        running = self._running
        while waiting and budget > 0 and len(running) < self.max_num_seqs:
            r = waiting[0]
            chunk = min(r.prompt_tokens + r.generated, budget)
            nb = -(-chunk // bs)
            if nb > free:
                break
            waiting.popleft()
            self._order += 1
            s = _Seq(r, self._order)
            s.blocks = nb
            running[r] = s
            self._partials.append(s)
            self._explicit_blocks += nb
            free -= nb
            budget -= chunk
            chunks.append((s, chunk))
            tokens += chunk
            pairs += chunk * (chunk + 1) / 2.0
            if math.isnan(r.first_scheduled):
                r.first_scheduled = now
        return tokens, pairs

    def _macro_length(self) -> int:
        """Decode steps until the first finish, capped where a KV allocation could fail."""
        heap = self._heap
        while not heap[0][2].lock:
            heapq.heappop(heap)
        G = self._G
        k = heap[0][0] - G
        cap = self.num_gpu_blocks - self._explicit_blocks
        if self._lock_blocks(G) + self._n * ((k - 1) // self.block_size + 1) <= cap:
            return k
        lo, hi = 1, k  # step j (0-based) needs _lock_blocks(G + j) <= cap; step 0 fits already
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._lock_blocks(G + mid - 1) <= cap:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _schedule_exact(self, now: float) -> None:
        """One step request by request, with vLLM's preemption (when blocks may run out)."""
        bs = self.block_size
        G = self._G
        decoders = set()
        for s in self._running.values():
            if s.lock:
                decoders.add(s)
                self._materialize(s, G)
                s.blocks = -(-s.req.computed // bs)
                s.lock = False
                self._explicit_blocks += s.blocks
        self._n = self._A = self._sumq = 0
        self._cnt = [0] * bs
        self._heap = []
        run = list(self._running.values())
        free = self.num_gpu_blocks - self._explicit_blocks
        budget = self.max_num_batched_tokens
        preempted = False
        sched: list[tuple[_Seq, int]] = []
        i = 0
        while i < len(run) and budget > 0:
            s = run[i]
            r = s.req
            ntok = min(r.prompt_tokens + r.generated - r.computed, budget)
            nb = -(-(r.computed + ntok) // bs) - s.blocks
            while nb > free:
                victim = run.pop()
                free += victim.blocks
                self._preempt(victim)
                preempted = True
                if victim is s:
                    break
            if not s.alive:
                break
            s.blocks += nb
            self._explicit_blocks += nb
            free -= nb
            budget -= ntok
            sched.append((s, ntok))
            i += 1
        tokens = 0
        pairs = 0.0
        kv = 0
        chunks: list[tuple[_Seq, int]] = []
        for s, ntok in sched:
            r = s.req
            tokens += ntok
            if s in decoders:
                kv += r.computed + 1
                self._lock_add(s, r.computed + 1)  # in flight, lockstep counts the blocks just allocated
            else:
                pairs += ntok * (r.computed + (ntok + 1) / 2.0)
                chunks.append((s, ntok))
        self._partials = [s for s in self._running.values() if not s.lock]
        if not preempted:
            tokens, pairs = self._admit(now, budget, free, tokens, pairs, chunks)
        dt = self.step_model.step_time(tokens, self._n + len(chunks), kv, pairs)
        self._start(now, dt, 1, chunks, tokens)

    def _preempt(self, s: _Seq) -> None:
        r = s.req
        del self._running[r]
        self._explicit_blocks -= s.blocks
        s.blocks = 0
        s.alive = False
        if s in self._partials:
            self._partials.remove(s)
        r.computed = 0
        r.preemptions += 1
        self.num_preemptions += 1
        self._waiting.appendleft(r)

    def _start(self, now: float, dt: float, k: int, chunks: list[tuple[_Seq, int]], tokens: int) -> None:
        self._t0 = now
        self._base = dt
        self._slope = self.step_model.kv_read_s_per_token * self._n if k > 1 else 0.0
        self._k = k
        self._end = now + k * dt + self._slope * (k * (k - 1) / 2.0)
        self._chunks = chunks
        self._step_tokens = tokens

    # ------------------------------------------------------------------ step ends and macro-step splits
    def _cum(self, j: int) -> float:
        return j * self._base + self._slope * (j * (j - 1) / 2.0)

    def _advance_to(self, t: float) -> None:
        """Commit the whole steps of the macro-step in flight that ended by ``t`` (never the last one)."""
        k = self._k
        if k <= 1:
            return
        d = t - self._t0
        if d < self._base:
            return
        if self._slope > 0:
            b = self._base - self._slope / 2.0
            j = int((-b + math.sqrt(b * b + 2.0 * self._slope * d)) / self._slope)
        else:
            j = int(d / self._base)
        j = min(max(j, 0), k - 1)
        while j < k - 1 and self._cum(j + 1) <= d:
            j += 1
        while j > 0 and self._cum(j) > d:
            j -= 1
        if j == 0:
            return
        self._commit_decodes(j)
        self._t0 += self._cum(j)
        self._base += self._slope * j
        self._k = k - j

    def _truncate(self) -> None:
        """End the macro-step in flight with the step in progress (the batch is about to change)."""
        if self._k > 1:
            self._k = 1
            self._end = self._t0 + self._base
            self._slope = 0.0

    def _commit_decodes(self, j: int) -> None:
        n = self._n
        self._G += j
        self.generation_tokens_total += n * j
        self.num_steps += j
        self.iteration_tokens[self._step_tokens] = self.iteration_tokens.get(self._step_tokens, 0) + j

    def _end_step(self, now: float) -> list[Request]:
        listener = self.on_tokens
        if listener is not None and self._n:
            g = self._G + self._k
            for s in self._running.values():
                if s.lock:
                    self._materialize(s, g)
                    listener(s.req, self._k, now)
        self._commit_decodes(self._k)
        self._k = 0
        finished: list[Request] = []
        heap = self._heap
        G = self._G
        while heap and heap[0][0] <= G:
            s = heapq.heappop(heap)[2]
            if not s.lock:
                continue
            r = s.req
            del self._running[r]
            self._release(s)
            r.finished = now
            finished.append(r)
        for s, chunk in self._chunks:
            if not s.alive:
                continue
            r = s.req
            r.computed += chunk
            self.prefill_tokens_computed += chunk
            tokens = r.prompt_tokens + r.generated
            if r.computed < tokens:
                continue
            r.generated += 1
            self.generation_tokens_total += 1
            if math.isnan(r.first_token):
                r.first_token = now
                self.prompt_tokens_total += r.prompt_tokens
            if listener is not None:
                listener(r, 1, now)
            if r.generated >= r.output_tokens:
                del self._running[r]
                self._release(s)
                r.finished = now
                finished.append(r)
            else:
                self._partials.remove(s)
                self._lock_add(s, tokens + 1)
        self._chunks = []
        return finished


def make_token_engine(cfg: Any) -> TokenEngine:
    """Build a TokenEngine from a scenario's token-engine config (preset, optional limits)."""
    return TokenEngine(
        getattr(cfg, "preset", "h200-llama3-8b"),
        max_num_batched_tokens=getattr(cfg, "max_num_batched_tokens", None),
        max_num_seqs=getattr(cfg, "max_num_seqs", None),
    )
