"""Counters of the LLM policy: how often it decided, called, hit its cache, held and why, and how long
calls took. ``as_dict`` is what reports and tests read.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from admit.core.percentiles import linear_np


@dataclass
class LLMStats:
    acts: int = 0  # act() calls, one per control interval
    decisions: int = 0  # decision points (every K intervals)
    calls: int = 0  # requests sent to the model
    valid: int = 0  # calls whose reply passed validation
    cache_hits: int = 0  # decision points answered from the cache
    holds: Counter[str] = field(default_factory=Counter)  # decision points that held, by reason
    latencies_s: list[float] = field(default_factory=list)  # wall-clock seconds of every call

    def hold(self, reason: str) -> None:
        self.holds[reason] += 1

    def as_dict(self) -> dict[str, object]:
        lat = np.asarray(self.latencies_s, dtype=float)
        return {
            "acts": self.acts,
            "decisions": self.decisions,
            "calls": self.calls,
            "valid": self.valid,
            "valid_fraction": self.valid / self.calls if self.calls else None,
            "cache_hits": self.cache_hits,
            "holds": dict(sorted(self.holds.items())),
            "latency_s": {  # percentiles.LINEAR
                "mean": float(lat.mean()) if lat.size else None,
                "p50": linear_np(lat, 50) if lat.size else None,
                "p95": linear_np(lat, 95) if lat.size else None,
                "max": float(lat.max()) if lat.size else None,
            },
        }
