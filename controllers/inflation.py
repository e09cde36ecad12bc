"""Is the server slow for everyone? Service-time inflation against each tenant's own unloaded baseline.

Interference on a shared engine shows as *service time* (time from the first token to the last) growing
for everybody at once: long prefill chunks fill the step's token budget and every decoding request waits
for them. That needs no objective and no engine-internal metric, only the per-tenant percentiles the
Observation already carries:

1. Per tenant and window with at least ``min_samples`` completions, the window's service time is read as
   ``e2e_p50 − ttft_p50`` (median end to end minus median time to first token: the decode part).
2. The tenant's *baseline* is the ``q``-quantile (5%) of its own past window values, over the last
   ``history_n`` windows, once it has ``min_windows`` of them: the tenant's service time when the server
   was nearly idle. A tenant's request sizes do not change with load, so the ratio value / baseline is
   the slowdown the server imposes on it.
3. The server's inflation is the completion-weighted mean of the tenants' ratios (each capped at
   ``cap``); 1.0 when no tenant has data.

A tenant queued at its cap on a slow-for-everyone server (high inflation) waits on the engine, where more
admissions only add interference; one queued on a server that is not slowed (inflation near 1) waits on its
cap, where growing it helps. docs/controllers.md, "Interference gate", has the figures under static caps.
"""

from __future__ import annotations

import bisect
from collections import deque

from admit.core.observation import Observation


class ServiceInflation:
    def __init__(self, n_tenants: int, q: float = 0.05, min_samples: float = 10.0, min_windows: int = 20,
                 history_n: int = 1800, cap: float = 100.0) -> None:
        self.q, self.min_samples, self.min_windows, self.cap = q, min_samples, min_windows, cap
        self.history_n = history_n
        self.sorted: list[list[float]] = [[] for _ in range(n_tenants)]
        self.order: list[deque[float]] = [deque() for _ in range(n_tenants)]

    def baseline(self, i: int) -> float | None:
        s = self.sorted[i]
        return s[int(self.q * len(s))] if len(s) >= self.min_windows else None

    def update(self, obs: Observation) -> float:
        """Record this window's service times; returns the server's inflation (≥ 0, 1.0 = as unloaded)."""
        num = den = 0.0
        for i, t in enumerate(obs.tenants):
            if t.samples < self.min_samples:
                continue
            svc = max(t.e2e_p50 - t.ttft_p50, 1e-6)
            s, o = self.sorted[i], self.order[i]
            bisect.insort(s, svc)
            o.append(svc)
            if len(o) > self.history_n:
                s.pop(bisect.bisect_left(s, o.popleft()))
            base = self.baseline(i)
            if base is None:
                continue
            num += t.samples * min(svc / base, self.cap)
            den += t.samples
        return num / den if den > 0 else 1.0
