"""Client-side good behaviour: adaptive throttling and a retry budget, both over a sliding window.

Adaptive throttling (Google SRE book, "Handling Overload"): over the last ``window_s`` seconds count
``requests`` (attempts the client wanted to make, including ones it rejected itself) and ``accepts``
(attempts the server did not refuse with 429 or 503). A new attempt is rejected locally with
probability ``p = max(0, (requests - K·accepts) / (requests + 1))``; with ``K = 2`` the client sends at
most about twice what the server has been accepting.

Retry budget (as in Finagle/Envoy): a retry is allowed while ``retries ≤ ratio · first_attempts`` over
the window, so retries add at most ``ratio`` extra load however bad the server gets.

Both keep one-second buckets in a ring, so updates and reads cost O(1) amortised.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class WindowCounter:
    """Sums of named counts over the last ``window_s`` whole seconds (a ring of per-second buckets)."""

    window_s: int = 60
    names: tuple[str, ...] = ("a",)
    _slots: list[list[int]] = field(default_factory=list)
    _stamp: list[int] = field(default_factory=list)
    _sums: list[int] = field(default_factory=list)
    _last_expiry: int = -1

    def __post_init__(self) -> None:
        self._slots = [[0] * len(self.names) for _ in range(self.window_s)]
        self._stamp = [-1] * self.window_s
        self._sums = [0] * len(self.names)

    def _slot(self, second: int) -> list[int]:
        i = second % self.window_s
        if self._stamp[i] != second:
            old = self._slots[i]
            for k, v in enumerate(old):
                self._sums[k] -= v
                old[k] = 0
            self._stamp[i] = second
        return self._slots[i]

    def _expire(self, second: int) -> None:
        if second == self._last_expiry:
            return
        self._last_expiry = second
        for i in range(self.window_s):
            if self._stamp[i] >= 0 and self._stamp[i] <= second - self.window_s:
                for k, v in enumerate(self._slots[i]):
                    self._sums[k] -= v
                    self._slots[i][k] = 0
                self._stamp[i] = -1

    def add(self, now_s: float, name_index: int, n: int = 1) -> None:
        self._slot(int(now_s))[name_index] += n
        self._sums[name_index] += n

    def sums(self, now_s: float) -> list[int]:
        self._expire(int(now_s))
        return list(self._sums)


@dataclass
class AdaptiveThrottle:
    """Google SRE client-side throttling with multiplier ``k`` (see module docstring)."""

    k: float = 2.0
    window_s: int = 60
    _w: WindowCounter = field(init=False)

    def __post_init__(self) -> None:
        self._w = WindowCounter(self.window_s, ("requests", "accepts"))

    def reject_probability(self, now_s: float) -> float:
        requests, accepts = self._w.sums(now_s)
        return max(0.0, (requests - self.k * accepts) / (requests + 1))

    def should_reject(self, now_s: float, u: float) -> bool:
        """Record a wanted attempt; ``u`` is a uniform draw in [0, 1)."""
        p = self.reject_probability(now_s)
        self._w.add(now_s, 0)
        return u < p

    def on_response(self, now_s: float, accepted: bool) -> None:
        if accepted:
            self._w.add(now_s, 1)


@dataclass
class RetryBudget:
    """Allows retries while they stay within ``ratio`` of first attempts over the window."""

    ratio: float = 0.1
    window_s: int = 10
    _w: WindowCounter = field(init=False)

    def __post_init__(self) -> None:
        self._w = WindowCounter(self.window_s, ("first", "retries"))

    def on_first_attempt(self, now_s: float) -> None:
        self._w.add(now_s, 0)

    def try_spend(self, now_s: float) -> bool:
        first, retries = self._w.sums(now_s)
        if retries + 1 > self.ratio * first:
            return False
        self._w.add(now_s, 1)
        return True
