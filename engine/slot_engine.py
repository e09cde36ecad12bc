"""The published study's engine: a pool of identical slots, each serving one request at a time.

A dispatched request takes a free slot and holds it for a random service time (exponential with mean
``mean_service_s`` by default, as the study states); when all slots are busy it waits inside the engine
in FIFO order (vLLM's own waiting queue plays this role in the real server). There is no notion of tokens:
the first token is taken to appear when service starts, so TTFT equals the time spent waiting.

The GPU-memory signal is slot occupancy, the study's proxy: busy slots / pool size.

Service times derive from the request's ``u_service`` draw (inverse transform), never from an engine-owned
random stream, so two policies evaluated on one seed see identical service times.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from admit.engine.request import Request

SERVICE_DISTRIBUTIONS = ("exponential", "deterministic")


class SlotEngine:
    def __init__(self, slots: int, mean_service_s: float, distribution: str = "exponential") -> None:
        if slots < 1:
            raise ValueError(f"slot engine needs slots >= 1, got {slots}")
        if not mean_service_s > 0:
            raise ValueError(f"mean_service_s must be > 0, got {mean_service_s}")
        if distribution not in SERVICE_DISTRIBUTIONS:
            raise ValueError(f"unknown service distribution {distribution!r}; allowed: {SERVICE_DISTRIBUTIONS}")
        self.slots = slots
        self.mean_service_s = mean_service_s
        self.distribution = distribution
        self._busy: list[tuple[float, int, Request]] = []  # heap of (finish time, rid, request)
        self._waiting: deque[Request] = deque()
        self.num_preemptions = 0  # a slot is never taken back

    def service_time(self, req: Request) -> float:
        if self.distribution == "deterministic":
            return self.mean_service_s
        # inverse transform of the exponential; 1 - u lies in (0, 1]
        return -self.mean_service_s * math.log(1.0 - req.u_service)

    def _start(self, req: Request, now: float) -> None:
        req.first_token = now
        req.service_s = self.service_time(req)
        heapq.heappush(self._busy, (now + req.service_s, req.rid, req))

    def submit(self, req: Request, now: float) -> None:
        req.dispatched = now
        if len(self._busy) < self.slots:
            self._start(req, now)
        else:
            self._waiting.append(req)

    def next_event_time(self) -> float:
        return self._busy[0][0] if self._busy else math.inf

    def process_event(self, now: float) -> list[Request]:
        _, _, req = heapq.heappop(self._busy)
        req.finished = now
        req.generated = req.output_tokens
        if self._waiting:
            self._start(self._waiting.popleft(), now)
        return [req]

    def sync(self, now: float) -> None:
        pass  # always up to date: every change is an event

    def memory_utilisation(self) -> float:
        return len(self._busy) / self.slots

    @property
    def num_running(self) -> int:
        return len(self._busy)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def tenant_tokens(self, n_tenants: int) -> tuple[list[float], list[float]]:
        """No tokens are produced along the way here: a request in service holds its prompt, one that waits
        for a slot has no first token yet (the first token comes when service starts)."""
        prefill = [0.0] * n_tenants
        held = [0.0] * n_tenants
        for r in self._waiting:
            prefill[r.tenant] += r.prompt_tokens
            held[r.tenant] += r.prompt_tokens
        for _, _, r in self._busy:
            held[r.tenant] += r.prompt_tokens
        return prefill, held
