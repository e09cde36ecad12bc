"""Open-loop arrival processes: the send times of one tenant, drawn up front from a seeded generator.

Every process returns a sorted ``int64`` array of offsets in nanoseconds from the stage start, all
within ``[0, duration)``.

* ``constant``: a fixed grid, ``t_i = i / rate``.
* ``poisson``: exponential gaps with mean ``1 / rate`` (a homogeneous Poisson process).
* ``gamma``: gamma gaps with shape ``k = burstiness`` and scale ``1 / (rate * k)``; the mean gap stays
  ``1 / rate`` and the squared coefficient of variation is ``1 / k``: ``k = 1`` is Poisson, ``k < 1`` is
  burstier, ``k → ∞`` approaches the constant grid (vLLM bench uses the same parametrisation).
* ``ramp``: a non-homogeneous Poisson process whose rate grows linearly from ``rate_start`` to ``rate``
  over the stage; drawn by time-rescaling: unit-rate Poisson points ``s`` are mapped through the inverse
  of the cumulative intensity ``Λ(t) = r0·t + (r1 - r0)·t²/(2T)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NS = 1_000_000_000
PROCESSES = ("constant", "poisson", "gamma", "ramp")


@dataclass(frozen=True)
class ArrivalSpec:
    """How one tenant's requests arrive. ``burstiness`` is used by ``gamma``, ``rate_start`` by ``ramp``."""

    process: str = "poisson"
    rate: float = 1.0
    burstiness: float = 1.0
    rate_start: float = 0.0

    def __post_init__(self) -> None:
        if self.process not in PROCESSES:
            raise ValueError(f"arrival process {self.process!r} is unknown; allowed: {', '.join(PROCESSES)}")
        if not (self.rate > 0 and np.isfinite(self.rate)):
            raise ValueError(f"rate must be a positive number of requests per second, got {self.rate}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")
        if not self.rate_start >= 0:
            raise ValueError(f"rate_start must be >= 0, got {self.rate_start}")


def _cumulative_gaps(gaps: np.ndarray, duration_s: float) -> np.ndarray:
    times = np.cumsum(gaps)
    return times[times < duration_s]


def _draw_until(rng: np.random.Generator, draw, mean_gap: float, duration_s: float) -> np.ndarray:
    """Draw gaps in blocks until their running sum passes ``duration_s``."""
    expected = int(duration_s / mean_gap)
    block = max(16, int(expected * 1.1 + 6 * np.sqrt(expected + 1)))
    gaps = draw(block)
    while gaps.sum() < duration_s:
        gaps = np.concatenate([gaps, draw(block)])
    return _cumulative_gaps(gaps, duration_s)


def arrival_times(spec: ArrivalSpec, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Offsets (ns, sorted, ``int64``) of every arrival within ``[0, duration_s)``."""
    if not duration_s > 0:
        raise ValueError(f"duration must be > 0 seconds, got {duration_s}")
    rate = spec.rate
    if spec.process == "constant":
        n = int(np.ceil(duration_s * rate - 1e-9))
        times = np.arange(n, dtype=np.float64) / rate
    elif spec.process == "poisson":
        times = _draw_until(rng, lambda n: rng.exponential(1.0 / rate, n), 1.0 / rate, duration_s)
        # the first arrival of a stationary process is itself one gap after the start
    elif spec.process == "gamma":
        k = spec.burstiness
        times = _draw_until(rng, lambda n: rng.gamma(k, 1.0 / (rate * k), n), 1.0 / rate, duration_s)
    else:  # ramp
        r0, r1, horizon = spec.rate_start, rate, duration_s
        total = (r0 + r1) / 2.0 * horizon
        s = _draw_until(rng, lambda n: rng.exponential(1.0, n), 1.0, total)
        a = (r1 - r0) / (2.0 * horizon)
        # Λ(t) = s solved for t >= 0: linear when the rate is flat, else the root of a t² + r0 t - s = 0
        times = s / r0 if abs(a) < 1e-12 else (-r0 + np.sqrt(r0 * r0 + 4.0 * a * s)) / (2.0 * a)
        times = times[times < duration_s]
    return np.floor(times * NS).astype(np.int64)
