"""The one engine loop: the token engine driven by the wall clock, tokens handed to the waiting answers.

A single asyncio task sleeps until the wall time of the engine's next event (a step's end, or the
immediate start of a step after a request reached an idle engine), processes it with the engine time at
which it was due, and passes each request's new tokens to its *sink* (the HTTP answer) through the
engine's ``on_tokens`` hook. A submit, abort or fault change that moves the next event earlier wakes the
task at once. Nothing sleeps per request, so all requests share the engine's steps, KV blocks and
preemptions exactly as in the simulator.

Timing is the model's, not the loop's: a step processed late (a busy CPU) still ends at its due engine
time, so lateness delays delivery but never accumulates into the engine's clock. Before a request is
submitted every event already due is processed, so a request never joins a step that began before it
arrived. Decode tokens are written once per wake-up, so a loop that fell behind and processes several
steps at once sends each stream one write for all of them (fewer system calls exactly when CPU is short);
a request's first token is written at once. Metrics use the model's times mapped to the wall
(``VirtualClock.to_wall``), i.e. what a real engine would have stamped; the delivery lag is what
``benchmarks/emulator_bench.py`` measures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from admit.emulator.clock import VirtualClock
from admit.emulator.metrics import FinishedTimes, VllmMetrics
from admit.engine.request import Request
from admit.engine.token_engine import TokenEngine

log = logging.getLogger(__name__)
DEBUG_RECORDS = 100_000


class Sink(Protocol):
    """Where a request's output goes (a streamed or a whole HTTP answer)."""

    def on_tokens(self, first: int, n: int) -> None: ...

    def on_finish(self, reason: str, completion_tokens: int) -> None: ...


@dataclass(eq=False)
class _Live:
    req: Request
    sink: Sink
    reason: str  # finish reason when the engine ends it: "length" (max_tokens) or "stop" (drawn EOS)
    max_tokens: int
    last_wall: float = math.nan
    emitted: int = 0


@dataclass(frozen=True)
class Record:
    """A finished request as the engine model timed it (wall seconds), for ``/debug/requests``."""

    id: int
    prompt_tokens: int
    output_tokens: int
    preemptions: int
    arrival: float
    first_scheduled: float
    first_token: float
    finished: float


class EngineLoop:
    def __init__(self, engine: TokenEngine, clock: VirtualClock, metrics: VllmMetrics,
                 wall: Callable[[], float]) -> None:  # fmt: skip
        self.engine = engine
        self.clock = clock
        self.metrics = metrics
        self.wall = wall
        self.records: deque[Record] = deque(maxlen=DEBUG_RECORDS)
        self.lateness: deque[float] = deque(maxlen=DEBUG_RECORDS)  # wall seconds each event was processed late
        self._live: dict[Request, _Live] = {}
        self._pending: dict[_Live, list[int]] = {}  # decode tokens not yet written: [first index, count]
        self._rid = 0
        self._step_wall = 0.0
        self._wake: asyncio.Future[None] | None = None
        self._wake_at = math.inf
        self._task: asyncio.Task[None] | None = None
        self._itl = metrics.hists["itl"]  # observed once per streamed token: no wrapper call
        engine.on_tokens = self._on_tokens

    # ---------------------------------------------------------------- life cycle
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-loop")

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                self._catch_up()
                w = self.clock.to_wall(self.engine.next_event_time())
                fut: asyncio.Future[None] = loop.create_future()
                self._wake, self._wake_at = fut, w
                timer = loop.call_later(max(0.0, w - self.wall()), _resolve, fut) if math.isfinite(w) else None
                await fut
                if timer is not None:
                    timer.cancel()
        except asyncio.CancelledError:
            raise
        except BaseException:
            log.exception("engine loop failed; the server reports unhealthy from now on")
            raise

    def poke(self, force: bool = False) -> None:
        """Wake the loop if the engine's next event moved earlier than the planned wake-up (or ``force``)."""
        fut = self._wake
        if fut is None or fut.done():
            return
        if force or self.clock.to_wall(self.engine.next_event_time()) < self._wake_at:
            fut.set_result(None)

    # ---------------------------------------------------------------- requests
    def next_id(self) -> int:
        self._rid += 1
        return self._rid

    def submit(self, rid: int, prompt_tokens: int, output_tokens: int, reason: str, max_tokens: int,
               sink: Sink) -> Request:  # fmt: skip
        """Hand a request to the engine (ValueError if it can never run); its tokens go to ``sink``."""
        now = self._catch_up()
        req = Request(rid, 0, now, prompt_tokens, output_tokens, 0.0)
        self.engine.submit(req, now)
        self._live[req] = _Live(req, sink, reason, max_tokens)
        self.poke()
        return req

    def abort(self, req: Request) -> bool:
        """The client went away: drop the request and free its KV blocks; False if already finished."""
        if self._live.pop(req, None) is None:
            return False
        now = self._catch_up()
        self.engine.abort(req, now)
        self.metrics.observe_abort()
        self.poke()
        return True

    def refresh_metrics(self) -> None:
        """Bring the engine up to now and copy its gauges and counters into the metrics."""
        now = self._catch_up()
        e = self.engine
        e.sync(now)
        m = self.metrics.engine
        m.num_running = e.num_running
        m.num_waiting = e.num_waiting
        m.kv_usage = e.memory_utilisation()
        m.num_preemptions = e.num_preemptions
        m.prompt_tokens_total = e.prompt_tokens_total
        m.generation_tokens_total = e.generation_tokens_total
        m.iteration_tokens = dict(e.iteration_tokens)

    @property
    def in_engine(self) -> int:
        return len(self._live)

    # ---------------------------------------------------------------- engine events
    def _catch_up(self) -> float:
        """Process every engine event due by now; return engine time now."""
        now = self.clock.now()
        e = self.engine
        t = e.next_event_time()
        pending = self._pending
        while t <= now:
            w = self._step_wall = self.clock.to_wall(t)
            late = self.wall() - w
            self.lateness.append(late)
            self.metrics.observe_lateness(late)
            for r in e.process_event(t):
                live = self._live.get(r)
                if live is not None and live in pending:
                    first, n = pending.pop(live)
                    live.sink.on_tokens(first, n)
                self._finish(r, w)
            t = e.next_event_time()
        if pending:
            items = list(pending.items())
            pending.clear()
            for live, (first, n) in items:
                live.sink.on_tokens(first, n)
        return now

    def _on_tokens(self, req: Request, n: int, now: float) -> None:
        live = self._live.get(req)
        if live is None:
            return
        w = self._step_wall
        emitted = live.emitted
        live.emitted = emitted + n
        if emitted:
            self._itl.observe(w - live.last_wall)
            live.last_wall = w
            p = self._pending.get(live)
            if p is None:
                self._pending[live] = [emitted, n]
            else:
                p[1] += n  # the loop is behind: several steps' tokens go out in one write
        else:
            live.last_wall = w
            live.sink.on_tokens(0, n)  # first tokens go out before the step's other writes: TTFT is the SLO

    def _finish(self, r: Request, done: float) -> None:
        live = self._live.pop(r, None)
        if live is None:
            return
        to_wall = self.clock.to_wall
        arrival = to_wall(r.dispatched)
        sched = to_wall(r.first_scheduled)
        first = to_wall(r.first_token)
        self.metrics.observe_finished(
            live.reason,
            FinishedTimes(ttft=first - arrival, e2e=done - arrival, queue=sched - arrival, prefill=first - sched,
                          decode=done - first, inference=done - sched, prompt_tokens=r.prompt_tokens,
                          generation_tokens=r.generated, max_tokens=live.max_tokens,
                          preemptions=r.preemptions),
        )  # fmt: skip
        self.records.append(Record(r.rid, r.prompt_tokens, r.generated, r.preemptions, arrival, sched, first, done))
        live.sink.on_finish(live.reason, r.generated)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
