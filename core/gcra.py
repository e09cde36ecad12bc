"""GCRA (generic cell rate algorithm): a token bucket kept as one number, the theoretical arrival time.

Pure Python with the time passed in, so that a Redis Lua script (shared state, server clock) can mirror it
line by line. With ``T = 1/rate`` (seconds per unit) and ``tau = T * burst`` (how far TAT may run ahead of
now), spending ``qty`` units at ``now`` computes ``new_tat = max(tat, now) + qty * T`` and is allowed iff
``new_tat - tau <= now``; otherwise the caller must wait ``new_tat - tau - now`` seconds. This is the form
redis-cell uses (its ``max_burst`` is our ``burst - 1``). The test is computed on the bucket's debt,
``max(tat - now, 0) + qty * T - tau <= 0``, which is the same inequality with ``now`` taken out: on clock
values of 10^5..10^9 s, ``(now + qty * T) - qty * T`` can round above ``now`` and would defer a full bucket
whose burst is one spend.

A single spend larger than the burst could never pass; it is allowed when the bucket is full and leaves the
bucket in debt, so the long-run rate still holds (``tau`` is taken as ``max(tau, qty * T)``). ``force``
charges regardless of the bucket (the real usage of a request that was charged an estimate up front, found
when it ends); ``refund`` gives units back.

**Reconfiguring keeps the debt in units.** The debt of a bucket is the work admitted and not yet paid for by
the refill: ``(tat - now) * rate`` units. New parameters keep that many units (capped at the new burst) and
re-express them on the new rate, so ``remaining = new_burst - debt``: a raise frees its extra budget at once,
a cut never leaves more than the new burst (nor more than was left, when the cut is of the burst), and the
same parameters change nothing. The alternatives both fail an operator who raises an envelope to let a
drained tenant through: kept *in time* (``tat`` unchanged, redis-cell's way), the same seconds of debt are
more units at a higher rate, so a drained bucket stays empty after the raise; kept as the *used fraction*,
a drained bucket is still 100 % used of the bigger burst. Both also rescale work already admitted into
units it never cost. The cap bounds how long a cut stalls the tenant: at most one new burst's refill.
"""

from __future__ import annotations

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
        self.rate, self.burst = self._checked(rate, burst)
        self.tat = now  # a full bucket

    @staticmethod
    def _checked(rate: float, burst: int) -> tuple[float, int]:
        if not float(rate) > 0:
            raise ValueError(f"GCRA rate must be > 0, got {rate}")
        if int(burst) < 1:
            raise ValueError(f"GCRA burst must be >= 1, got {burst}")
        return float(rate), int(burst)

    def reconfigure(self, rate: float, burst: int, now: float) -> None:
        """New parameters; the debt already incurred is kept in units, capped to the new burst.

        ``debt = max(0, tat - now) * old_rate`` units become ``tat = now + min(debt, burst) / rate``: the
        bucket then has ``burst - min(debt, burst)`` left, so a raise applies at once and a cut never hands
        out more than its burst (see the module docstring for why units, not time or the used fraction).
        Unchanged parameters leave the bucket exactly as it is (a debt beyond the burst included).
        """
        rate, burst = self._checked(rate, burst)
        if rate == self.rate and burst == self.burst:
            return
        debt = max(0.0, self.tat - now) * self.rate
        self.rate, self.burst = rate, burst
        self.tat = now + min(debt, burst) / rate

    def _decide(self, qty: float, now: float) -> tuple[float, float]:
        """(seconds until ``qty`` may be spent, <= 0 when now; the TAT after spending it)."""
        t = 1.0 / self.rate
        tau = max(t * self.burst, qty * t)
        wait = max(self.tat - now, 0.0) + qty * t - tau  # on the debt, not the clock (module docstring)
        return wait, max(self.tat, now) + qty * t

    def peek(self, qty: float, now: float) -> GcraResult:
        """What ``spend`` would answer, without spending."""
        wait, new_tat = self._decide(qty, now)
        if wait <= 0:
            return GcraResult(True, 0.0, self._remaining(new_tat, now), max(0.0, new_tat - now))
        return GcraResult(False, wait, self.remaining(now), max(0.0, self.tat - now))

    def spend(self, qty: float, now: float) -> GcraResult:
        res = self.peek(qty, now)
        if res.allowed:
            self.tat = max(self.tat, now) + qty / self.rate
        return res

    def force(self, qty: float, now: float) -> None:
        """Charge ``qty`` units whatever the bucket holds: it may go into debt beyond the burst, and then the
        next spends wait until the refill has paid it, so the long-run rate holds. For work that already ran
        (a request's real usage beyond what it was charged up front), which cannot be deferred any more."""
        self.tat = max(self.tat, now) + qty / self.rate

    def refund(self, qty: float, now: float) -> None:
        """Give back units that were spent for work that never ran (e.g. the request was deferred later)."""
        self.tat = max(now, self.tat - qty / self.rate)

    def _remaining(self, tat: float, now: float) -> float:
        return max(0.0, self.burst - max(0.0, tat - now) * self.rate)

    def remaining(self, now: float) -> float:
        """Units that may be spent at ``now`` (fractional: the bucket refills continuously)."""
        return self._remaining(self.tat, now)
