"""One worker process: its share of the schedule, one event loop, no traffic with the parent until the end.

Life of a worker:

1. receive a :class:`WorkerJob` (its schedule share and the tenant templates) and encode every request;
2. open ``warm_connections`` keep-alive connections, collect garbage and ``gc.freeze()`` what is left,
   then report ready;
3. receive the common start ``t0`` (a ``CLOCK_MONOTONIC`` reading in ns, the same clock in every process
   on Linux) and run: a timer callback sends every request whose time ``t0 + offset`` has come, then
   re-arms itself for the next one; sends never wait for responses (open loop). The loop's timers count
   whole milliseconds, so the wait is rounded up (never early) and a send due within ``spin_ns`` is
   waited for by re-queueing the callback instead (less lag, a little CPU);
4. when every request has ended, send back per-tenant :class:`TenantMetrics` and worker counters.

A request that finds no idle connection opens a new one (up to ``max_connections`` open and
``MAX_OPENING`` being opened, then it waits in a FIFO queue); its send lag then includes the wait, so the
lag histogram shows any such backlog.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import resource
import ssl
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection as Pipe
from time import monotonic_ns

from admit.loadgen.client import Attempt, Connection
from admit.loadgen.encode import Encoder, Target, TenantTemplate
from admit.loadgen.metrics import TenantMetrics
from admit.loadgen.schedule import Schedule
from admit.loadgen.throttle import AdaptiveThrottle, RetryBudget

NS = 1_000_000_000
SWEEP_INTERVAL_S = 0.05
# connects in flight per worker: beyond this, requests wait for an idle or a newly opened connection, so
# a stalled server (or a generator past its core's capacity) cannot start a storm of thousands of connects
MAX_OPENING = 64


@dataclass
class WorkerJob:
    worker: int
    workers: int
    target: Target
    templates: list[TenantTemplate]
    schedule: Schedule
    timeout_s: float = 60.0
    max_connections: int = 20000
    warm_connections: int = 4
    max_retries: int = 0
    retry_budget: float = 0.1
    throttle: bool = False
    throttle_k: float = 2.0
    slo_ns: dict[str, int] = field(default_factory=dict)
    # per tenant, its own per-request objectives (metrics.request_limits_ns); where given they decide "good"
    tenant_slo_ns: list[dict[str, int]] = field(default_factory=list)
    seed: int = 0
    warmup_ns: int = 0
    spin_ns: int = 200_000


@dataclass
class WorkerResult:
    worker: int
    tenants: list[dict]
    first_send: int
    last_send: int
    end: int
    connections_opened: int
    warm_failures: int
    max_in_flight: int
    cpu_s: float


class Worker:
    """The dispatch loop and response bookkeeping of one process (see module docstring)."""

    def __init__(self, job: WorkerJob, loop: asyncio.AbstractEventLoop) -> None:
        self.job = job
        self.loop = loop
        sch = job.schedule
        self.offsets: list[int] = sch.offset_ns.tolist()
        self.tenant_of: list[int] = sch.tenant.tolist()
        self.n = len(self.offsets)
        self.payloads: list[bytes] = []
        self.metrics = [TenantMetrics() for _ in job.templates]
        for t, off in zip(self.tenant_of, self.offsets, strict=True):
            self.metrics[t].scheduled += 1
            if off < job.warmup_ns:
                self.metrics[t].warmup_scheduled += 1
        self.idle: list[Connection] = []
        self.busy: set[Connection] = set()
        self.opening = 0
        self.waiting: deque[Attempt] = deque()
        self.pending_retries = 0
        self.next = 0
        self.t0 = 0
        self.first_send = 0
        self.last_send = 0
        self.opened = 0
        self.warm_failures = 0
        self.max_in_flight = 0
        self.finished: asyncio.Future[None] | None = None
        self.timeout_ns = int(job.timeout_s * NS)
        self.rng = random.Random(job.seed * 1_000_003 + job.worker)
        n_t = len(job.templates)
        self.throttles = [AdaptiveThrottle(job.throttle_k) for _ in range(n_t)] if job.throttle else None
        self.budgets = [RetryBudget(job.retry_budget) for _ in range(n_t)] if job.max_retries > 0 else None
        self.ssl_ctx = ssl.create_default_context() if job.target.tls else None

    # -- preparation ------------------------------------------------------------------------------
    def encode(self) -> None:
        enc = Encoder(self.job.target, self.job.templates)
        sch = self.job.schedule
        prompt = sch.prompt_tokens.tolist()
        out = sch.output_tokens.tolist()
        w, stride = self.job.worker, self.job.workers
        self.payloads = [
            enc.request(t, w + stride * i, p, o)
            for i, (t, p, o) in enumerate(zip(self.tenant_of, prompt, out, strict=True))
        ]

    async def _open(self) -> Connection:
        tgt = self.job.target
        self.opening += 1
        try:
            _, proto = await self.loop.create_connection(lambda: Connection(self), tgt.host, tgt.port, ssl=self.ssl_ctx)
        finally:
            self.opening -= 1
        self.opened += 1
        return proto

    async def warm(self) -> None:
        results = await asyncio.gather(
            *(self._open() for _ in range(self.job.warm_connections)), return_exceptions=True
        )
        for r in results:
            if isinstance(r, Connection):
                self.idle.append(r)
            else:
                self.warm_failures += 1

    # -- running ----------------------------------------------------------------------------------
    async def run(self, t0: int) -> None:
        self.t0 = t0
        self.finished = self.loop.create_future()
        self.loop.call_later(max(0.0, (t0 - monotonic_ns()) / NS), self._tick)
        sweeper = self.loop.create_task(self._sweep())
        try:
            if self.n == 0:
                self.finished.set_result(None)
            await self.finished
        finally:
            sweeper.cancel()
            for c in list(self.idle) + list(self.busy):
                c.abort()

    def _tick(self) -> None:
        offsets, t0, n = self.offsets, self.t0, self.n
        i = self.next
        now = monotonic_ns()
        while i < n and t0 + offsets[i] <= now:
            a = Attempt(i, self.tenant_of[i], t0 + offsets[i])
            self._dispatch(a, first=True)
            i += 1
            if (i & 15) == 0:
                now = monotonic_ns()
        self.next = i
        if i < n:
            wait = t0 + offsets[i] - monotonic_ns()
            if wait <= self.job.spin_ns:
                self.loop.call_soon(self._tick)
            else:  # the loop's timers count whole milliseconds: round up, never wake before the send is due
                self.loop.call_later(-(-wait // 1_000_000) / 1000, self._tick)
        else:
            self._check_done()

    def _dispatch(self, a: Attempt, first: bool) -> None:
        m = self.metrics[a.tenant]
        if self.throttles is not None:
            now_s = monotonic_ns() / NS
            if self.throttles[a.tenant].should_reject(now_s, self.rng.random()):
                if self._warm(a):
                    m.warmup_failed += 1
                else:
                    m.count_error("throttled_client")
                return
        if first and self.budgets is not None:
            self.budgets[a.tenant].on_first_attempt(monotonic_ns() / NS)
        if self.idle:
            self._send(self.idle.pop(), a)
        elif self.opening < MAX_OPENING and len(self.busy) + self.opening < self.job.max_connections:
            self.loop.create_task(self._open_and_send(a))
        else:
            self.waiting.append(a)

    async def _open_and_send(self, a: Attempt) -> None:
        try:
            conn = await self._open()
        except (TimeoutError, OSError, ssl.SSLError):
            self._record(a, monotonic_ns(), "connect_error")
            self._pump()
            self._check_done()
            return
        self._send(conn, a)
        self._pump()  # an opening slot is free again

    def _send(self, conn: Connection, a: Attempt) -> None:
        self.busy.add(conn)
        conn.send(a, self.payloads[a.index], self.job.templates[a.tenant].stream)
        if a.attempt == 0:
            self.metrics[a.tenant].sent += 1
            self.metrics[a.tenant].hist["send_lag"].record(a.send - a.sched)
            if self.first_send == 0:
                self.first_send = a.send
            self.last_send = a.send
        if len(self.busy) > self.max_in_flight:
            self.max_in_flight = len(self.busy)

    # -- completion -------------------------------------------------------------------------------
    def on_connection_lost(self, conn: Connection) -> None:
        self.busy.discard(conn)
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)
        self._pump()

    def on_attempt_done(self, conn: Connection, a: Attempt, now: int, reason: str | None) -> None:
        self.busy.discard(conn)
        if conn.keep_alive and not conn.closed:
            self.idle.append(conn)
        else:
            conn.abort()
        if self.throttles is not None:
            self.throttles[a.tenant].on_response(now / NS, a.status not in (429, 503) and reason != "connect_error")
        if reason in ("http_429", "http_503") and self._retry(a, now):
            pass
        else:
            self._record(a, now, reason)
        self._pump()
        self._check_done()

    def _retry(self, a: Attempt, now: int) -> bool:
        if self.budgets is None or a.attempt >= self.job.max_retries:
            return False
        if not self.budgets[a.tenant].try_spend(now / NS):
            return False
        delay = a.retry_after if a.retry_after is not None else 0.05 * (2**a.attempt)
        delay = min(max(delay, 0.0), self.job.timeout_s)
        if now + int(delay * NS) - a.sched > self.timeout_ns:
            return False
        if not self._warm(a):
            self.metrics[a.tenant].retries += 1
            self.metrics[a.tenant].count_status(a.status)
        nxt = Attempt(a.index, a.tenant, a.sched, a.attempt + 1)
        self.pending_retries += 1
        self.loop.call_later(delay, self._fire_retry, nxt)
        return True

    def _fire_retry(self, a: Attempt) -> None:
        self.pending_retries -= 1
        self._dispatch(a, first=False)
        self._check_done()

    def _pump(self) -> None:
        while self.waiting:
            if self.idle:
                self._send(self.idle.pop(), self.waiting.popleft())
            elif self.opening < MAX_OPENING and len(self.busy) + self.opening < self.job.max_connections:
                self.loop.create_task(self._open_and_send(self.waiting.popleft()))
            else:
                return

    def _warm(self, a: Attempt) -> bool:
        """Whether ``a`` was scheduled in the warm-up (metrics.py: counted apart)."""
        return a.sched - self.t0 < self.job.warmup_ns

    def _record(self, a: Attempt, now: int, reason: str | None) -> None:
        m = self.metrics[a.tenant]
        if self._warm(a):
            if reason is None:
                m.warmup_completed += 1
            else:
                m.warmup_failed += 1
            return
        if a.status:
            m.count_status(a.status)
        if reason is not None:
            m.count_error(reason)
            return
        h = m.hist
        times = a.times
        counts = a.counts
        first = times[0]
        tokens = a.output_tokens or sum(counts)
        send, sched = a.send, a.sched
        ttft = first - send
        e2e = now - send
        h["ttft"].record(ttft)
        h["e2e"].record(e2e)
        h["ntpot"].record(e2e // tokens)
        h["ttft_sched"].record(first - sched)
        h["e2e_sched"].record(now - sched)
        h["ntpot_sched"].record((now - sched) // tokens)
        streamed = self.job.templates[a.tenant].stream
        # one gap per read that carried tokens; tokens that arrived in the same read are 0 ns apart
        # (a non-streamed answer has no token times: no ITL, no TPOT)
        itl = h["itl"]
        zeros = counts[0] - 1 if streamed else 0
        max_gap = 0
        if streamed and len(times) > 1:
            rec = itl.record
            prev = first
            for t, c in zip(times[1:], counts[1:], strict=True):
                gap = t - prev
                rec(gap)
                if gap > max_gap:
                    max_gap = gap
                prev = t
                zeros += c - 1
        if zeros:
            itl.record_n(0, zeros)
        tpot = (e2e - ttft) // (tokens - 1) if tokens > 1 and streamed else 0
        if tokens > 1 and streamed:
            h["tpot"].record(tpot)
        m.ok += 1
        m.output_tokens += tokens
        m.prompt_tokens += a.prompt_tokens
        own = self.job.tenant_slo_ns
        slo = (own[a.tenant] if a.tenant < len(own) else None) or self.job.slo_ns
        if not slo or all(
            v <= slo.get(k, v)
            for k, v in (
                ("ttft", ttft),
                ("e2e", e2e),
                ("tpot", tpot),
                ("ntpot", e2e // tokens),
                ("itl", max_gap),
            )
        ):
            m.good += 1

    def _sweep_once(self, now: int) -> None:
        limit = self.timeout_ns
        for conn in list(self.busy):
            a = conn.cur
            if a is not None and now - a.send > limit:
                conn.fail_current(now, "timeout")
        while self.waiting and now - self.waiting[0].sched > limit:
            a = self.waiting.popleft()
            self._record(a, now, "timeout")
        self._check_done()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            self._sweep_once(monotonic_ns())

    def _check_done(self) -> None:
        if (
            self.finished is not None
            and not self.finished.done()
            and self.next >= self.n
            and not self.busy
            and not self.waiting
            and self.opening == 0
            and self.pending_retries == 0
        ):
            self.finished.set_result(None)

    def result(self) -> WorkerResult:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return WorkerResult(
            worker=self.job.worker,
            tenants=[m.to_dict() for m in self.metrics],
            first_send=self.first_send,
            last_send=self.last_send,
            end=monotonic_ns(),
            connections_opened=self.opened,
            warm_failures=self.warm_failures,
            max_in_flight=self.max_in_flight,
            cpu_s=ru.ru_utime + ru.ru_stime,
        )


def new_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop when uvloop is installed, else the default asyncio loop."""
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency, the fallback keeps tests portable
        return asyncio.new_event_loop()


def worker_main(pipe: Pipe) -> None:
    """Process entry point; speaks a three-message protocol with the parent (job, start, result)."""
    job: WorkerJob = pipe.recv()
    loop = new_loop()
    asyncio.set_event_loop(loop)
    worker = Worker(job, loop)
    try:
        worker.encode()
        loop.run_until_complete(worker.warm())
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 50, 100)
        pipe.send(("ready", worker.warm_failures))
        msg = pipe.recv()
        if msg[0] != "start":
            return
        loop.run_until_complete(worker.run(int(msg[1])))
        pipe.send(("result", worker.result()))
    except Exception as exc:  # report instead of dying silently; the parent turns it into an error
        pipe.send(("error", f"worker {job.worker}: {type(exc).__name__}: {exc}"))
    finally:
        loop.close()
        pipe.close()


if __name__ == "__main__":
    import sys

    # import under the package name so that pickled results name admit.loadgen.worker, not __main__
    from admit.loadgen.worker import worker_main as entry

    entry(Pipe(int(sys.argv[1])))
