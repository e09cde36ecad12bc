"""The engine's clock: wall time run through a piecewise-linear map that faults can slow down or stop.

The token engine runs in *engine time*. Normally engine time advances with the wall clock (rate 1).
A latency multiplier ``m`` makes it advance at rate ``1/m`` (every step takes ``m`` times as long on the
wall), and a pause stops it (rate 0). Each change starts a new segment at the current instant, so the
map stays continuous and engine time never goes backwards. Old segments are kept so that engine
timestamps from before a change still convert to the wall time they happened at.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable


class VirtualClock:
    def __init__(self, wall: Callable[[], float]) -> None:
        self._wall = wall
        w = wall()
        self._walls: list[float] = [w]  # segment starts, wall time
        self._engs: list[float] = [0.0]  # segment starts, engine time
        self._rates: list[float] = [1.0]

    @property
    def rate(self) -> float:
        return self._rates[-1]

    def now(self) -> float:
        """Engine time now."""
        return self._engs[-1] + (self._wall() - self._walls[-1]) * self._rates[-1]

    def set_rate(self, rate: float) -> None:
        """From now on engine time advances ``rate`` engine seconds per wall second (0 = paused)."""
        if not math.isfinite(rate) or rate < 0:
            raise ValueError(f"clock rate must be a finite number >= 0, got {rate!r}")
        if rate == self._rates[-1]:
            return
        w = self._wall()
        e = self.now()
        self._walls.append(w)
        self._engs.append(e)
        self._rates.append(rate)

    def to_wall(self, t: float) -> float:
        """Wall time at which engine time reaches ``t`` (``inf`` if the clock is stopped before it)."""
        if math.isinf(t):
            return math.inf
        i = bisect.bisect_right(self._engs, t) - 1
        if i < 0:
            i = 0
        # the last segment that starts at or before t and runs; a stopped one is left at once by the next
        while True:
            r = self._rates[i]
            if r > 0:
                return self._walls[i] + (t - self._engs[i]) / r
            if i + 1 >= len(self._rates):
                return math.inf
            i += 1

    def wall_interval(self, t0: float, t1: float) -> float:
        """Wall seconds between engine times ``t0`` and ``t1``."""
        return self.to_wall(t1) - self.to_wall(t0)
