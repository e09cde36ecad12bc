"""A token bucket that bounds how often the LLM policy may call its model.

The bucket holds at most ``burst`` tokens and refills at ``calls_per_min / 60`` tokens per second of the
injected clock (wall-clock monotonic time by default, because the budget protects a real endpoint and its
bill). A call spends one token; with less than one token left the caller must hold instead of calling.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    def __init__(self, calls_per_min: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if calls_per_min <= 0 or burst < 1:
            raise ValueError(f"token bucket needs calls_per_min > 0 and burst >= 1, got {calls_per_min}, {burst}")
        self.rate_per_s = calls_per_min / 60.0
        self.capacity = float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate_per_s)
        self._last = now

    @property
    def tokens(self) -> float:
        self._refill()
        return self._tokens

    def try_take(self) -> bool:
        """Spend one token if there is one; False means the budget is empty right now."""
        self._refill()
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False
