"""GCRA (generic cell rate algorithm): a token bucket kept as one number, the theoretical arrival time.

Pure Python with the time passed in, so that a Redis Lua script (shared state, server clock) can mirror it
line by line. With ``T = 1/rate`` (seconds per unit) and ``tau = T * burst`` (how far TAT may run ahead of
now), spending ``qty`` units at ``now`` computes ``new_tat = max(tat, now) + qty * T`` and is allowed iff
``new_tat - tau <= now``; otherwise the caller must wait ``new_tat - tau - now`` seconds. This is the form
redis-cell uses (its ``max_burst`` is our ``burst - 1``).

A single spend larger than the burst could never pass; it is allowed when the bucket is full and leaves the
bucket in debt, so the long-run rate still holds (``tau`` is taken as ``max(tau, qty * T)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class GcraResult:
    allowed: bool
    retry_after_s: float  # 0 when allowed
    remaining: float  # units that could be spent right after this decision
    reset_after_s: float  # seconds until the bucket is full again


class Gcra:
    """One bucket. ``rate`` units per second, ``burst`` units at once. Parameters may change at any time."""

    __slots__ = ("burst", "rate", "tat")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate = float(rate)
        self.burst = int(burst)
        self.tat = now  # a full bucket
        self._check()

    def _check(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"GCRA rate must be > 0, got {self.rate}")
        if self.burst < 1:
            raise ValueError(f"GCRA burst must be >= 1, got {self.burst}")

    def reconfigure(self, rate: float, burst: int, now: float) -> None:
        """New parameters; the debt already incurred is kept in time, capped to the new burst."""
        self.rate, self.burst = float(rate), int(burst)
        self._check()
        self.tat = min(max(self.tat, now), now + self.burst / self.rate)

    def _decide(self, qty: float, now: float) -> tuple[bool, float, float]:
        t = 1.0 / self.rate
        tau = max(t * self.burst, qty * t)
        new_tat = max(self.tat, now) + qty * t
        allow_at = new_tat - tau
        return allow_at <= now, new_tat, allow_at

    def peek(self, qty: float, now: float) -> GcraResult:
        """What ``spend`` would answer, without spending."""
        ok, new_tat, allow_at = self._decide(qty, now)
        if ok:
            return GcraResult(True, 0.0, self._remaining(new_tat, now), max(0.0, new_tat - now))
        return GcraResult(False, allow_at - now, self.remaining(now), max(0.0, self.tat - now))

    def spend(self, qty: float, now: float) -> GcraResult:
        res = self.peek(qty, now)
        if res.allowed:
            self.tat = max(self.tat, now) + qty / self.rate
        return res

    def refund(self, qty: float, now: float) -> None:
        """Give back units that were spent for work that never ran (e.g. the request was deferred later)."""
        self.tat = max(now, self.tat - qty / self.rate)

    def _remaining(self, tat: float, now: float) -> float:
        return max(0.0, self.burst - max(0.0, tat - now) * self.rate)

    def remaining(self, now: float) -> float:
        """Units that may be spent at ``now`` (fractional: the bucket refills continuously)."""
        return self._remaining(self.tat, now)

    def remaining_int(self, now: float) -> int:
        return math.floor(self.remaining(now) + 1e-9)
