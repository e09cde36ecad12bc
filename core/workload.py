"""Arrival processes and request-size distributions: what ``poisson``, ``gamma``, ``lognormal`` ... mean, once.

The simulator and the load generator both build these models and draw from them, so a process or a
distribution has one definition: one set of parameters, one set of checks (pydantic, so a bad value is an
error naming the key and what is allowed) and one draw. The simulator adds what needs its data files
(trace replay, ServeGen clients, sizes resampled from a trace column: envs/workload.py); the load generator
adds its short spellings (``arrival=gamma,rate=20,burstiness=0.5``: loadgen/arrivals.py;
``lognormal:256:0.8:max=2048``: loadgen/lengths.py), which it turns into these models.

Every draw takes a ``numpy.random.Generator``. Arrival times are seconds from the start (of an episode, or
of a load stage), sorted, in ``[0, horizon_s)``; sizes are ``int64`` token counts.

Arrival processes (``kind``):

* ``poisson``  – rate λ req/s, exponential gaps.
* ``constant`` – one request every 1/λ s; the first at a uniform random phase in [0, 1/λ) (``phase:
  random``, the default: constant tenants of one scenario do not arrive in lockstep) or at 0 (``phase:
  zero``, the exact grid ``t_i = i/λ`` the load generator sends).
* ``gamma``    – renewal process with gamma gaps: mean 1/λ, shape ``k = burstiness`` and scale 1/(λ·k), so the
  squared coefficient of variation of the gaps is 1/k: 1 is Poisson, < 1 burstier, → ∞ the constant grid
  (vLLM bench uses the same parametrisation).
* ``ramp``     – Poisson whose rate grows (or falls) linearly from ``rate_start`` at 0 to ``rate`` at the
  horizon; drawn by time-rescaling: unit-rate Poisson points ``s`` are mapped through the inverse of the
  cumulative intensity ``Λ(t) = r0·t + (r1 - r0)·t²/(2T)``.
* ``mmpp``     – two-state Markov-modulated Poisson process ("on/off bursts"): Poisson at ``rate_on`` for an
  exponential sojourn of mean ``mean_on_s``, then at ``rate_off`` for mean ``mean_off_s``.
* ``diurnal``  – Poisson with rate λ(t) = rate·(1 + amplitude·sin(2πt/period_s + phase)), drawn by thinning
  (Lewis & Shedler, 1979).

Request sizes (``kind``), rounded to integers; ``max`` (optional, ``lognormal``: 32768) caps every draw:

* ``constant``    – always ``value``;
* ``uniform``     – integers uniform on [``low``, ``high``];
* ``normal``      – a normal draw (``mean``, ``std``), at least 1;
* ``lognormal``   – ``median · exp(sigma · Z)``, Z standard normal (so the mean is ``median · exp(sigma²/2)``),
  clipped to [``min``, ``max``];
* ``exponential`` – an exponential draw with that ``mean``, at least 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Literal

import numpy as np
from admit.core.schema import StrictModel
from pydantic import Field, model_validator

# one definition of each shared parameter, so every process that has it checks it the same way
Rate = Annotated[float, Field(gt=0, description="requests per second")]
Burstiness = Annotated[float, Field(gt=0, description="gamma shape; 1 = Poisson, < 1 burstier, > 1 smoother")]
RateStart = Annotated[float, Field(ge=0, description="ramp: requests per second at the start")]
Cap = Annotated[int | None, Field(ge=1, description="the largest size drawn (none: no cap)")]


class Spec(StrictModel):
    """A workload model: strict keys, immutable, finite numbers only (core/schema.py; an infinite rate or size is a
    typo)."""


# --------------------------------------------------------------------------- request sizes
def _cap(x: np.ndarray, cap: int | None) -> np.ndarray:
    return x if cap is None else np.minimum(x, cap)


class ConstantSize(Spec):
    kind: Literal["constant"] = "constant"
    value: int = Field(ge=1)
    max: Cap = None

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return _cap(np.full(n, self.value, dtype=np.int64), self.max)


class UniformSize(Spec):
    kind: Literal["uniform"] = "uniform"
    low: int = Field(ge=1)
    high: int = Field(ge=1)
    max: Cap = None

    @model_validator(mode="after")
    def _order(self) -> UniformSize:
        if self.high < self.low:
            raise ValueError(f"uniform size needs low <= high, got low={self.low} high={self.high}")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return _cap(rng.integers(self.low, self.high + 1, size=n), self.max)


class NormalSize(Spec):
    kind: Literal["normal"] = "normal"
    mean: float = Field(gt=0)
    std: float = Field(ge=0)
    max: Cap = None

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.clip(np.rint(rng.normal(self.mean, self.std, n)), 1, self.max).astype(np.int64)


class LognormalSize(Spec):
    """Lognormal with the given median and sigma (of the underlying normal), clipped to [min, max]."""

    kind: Literal["lognormal"] = "lognormal"
    median: float = Field(gt=0)
    sigma: float = Field(ge=0)
    min: int = Field(default=1, ge=1)
    max: int = Field(default=32768, ge=1)

    @model_validator(mode="after")
    def _order(self) -> LognormalSize:
        if self.max < self.min:
            raise ValueError(f"lognormal size needs min <= max, got min={self.min} max={self.max}")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = rng.lognormal(math.log(self.median), self.sigma, size=n)
        return np.clip(np.rint(x), self.min, self.max).astype(np.int64)


class ExponentialSize(Spec):
    kind: Literal["exponential"] = "exponential"
    mean: float = Field(gt=0)
    max: Cap = None

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.clip(np.rint(rng.exponential(self.mean, n)), 1, self.max).astype(np.int64)


SIZES: tuple[type[Spec], ...] = (ConstantSize, UniformSize, NormalSize, LognormalSize, ExponentialSize)


# --------------------------------------------------------------------------- arrival processes
class Poisson(Spec):
    kind: Literal["poisson"] = "poisson"
    rate: Rate

    def times(self, rng: np.random.Generator, horizon_s: float) -> np.ndarray:
        n_guess = int(self.rate * horizon_s + 6 * math.sqrt(self.rate * horizon_s + 1) + 16)
        t = np.cumsum(rng.exponential(1.0 / self.rate, size=n_guess))
        while t[-1] < horizon_s:  # rare: extend
            more = t[-1] + np.cumsum(rng.exponential(1.0 / self.rate, size=n_guess))
            t = np.concatenate([t, more])
        return t[t < horizon_s]


class Constant(Spec):
    kind: Literal["constant"] = "constant"
    rate: Rate
    phase: Literal["random", "zero"] = "random"

    def times(self, rng: np.random.Generator, horizon_s: float) -> np.ndarray:
        if self.phase == "zero":  # i / rate, each exact to one rounding; the tolerance keeps t = horizon out
            n = int(np.ceil(horizon_s * self.rate - 1e-9))
            return np.arange(n, dtype=np.float64) / self.rate
        gap = 1.0 / self.rate
        return np.arange(rng.uniform(0, gap), horizon_s, gap)


class Gamma(Spec):
    kind: Literal["gamma"] = "gamma"
    rate: Rate
    burstiness: Burstiness

    def times(self, rng: np.random.Generator, horizon_s: float) -> np.ndarray:
        scale = 1.0 / (self.rate * self.burstiness)
        n_guess = int(self.rate * horizon_s * 1.5 + 64)
        t = np.cumsum(rng.gamma(self.burstiness, scale, size=n_guess))
        while t[-1] < horizon_s:
            t = np.concatenate([t, t[-1] + np.cumsum(rng.gamma(self.burstiness, scale, size=n_guess))])
        return t[t < horizon_s]


def _draw_until(draw: Callable[[int], np.ndarray], mean_gap: float, total: float) -> np.ndarray:
    """Running sums of gaps drawn in blocks until they pass ``total``; the sums below it."""
    expected = int(total / mean_gap)
    block = max(16, int(expected * 1.1 + 6 * np.sqrt(expected + 1)))
    gaps = draw(block)
    while gaps.sum() < total:
        gaps = np.concatenate([gaps, draw(block)])
    times = np.cumsum(gaps)
    return times[times < total]


class Ramp(Spec):
    kind: Literal["ramp"] = "ramp"
    rate: Rate = Field(description="requests per second at the horizon")
    rate_start: RateStart = 0.0

    def times(self, rng: np.random.Generator, horizon_s: float) -> np.ndarray:
        r0, r1 = self.rate_start, self.rate
        s = _draw_until(lambda n: rng.exponential(1.0, n), 1.0, (r0 + r1) / 2.0 * horizon_s)
        a = (r1 - r0) / (2.0 * horizon_s)
        # Λ(t) = s solved for t >= 0: linear when the rate is flat, else the root of a t² + r0 t - s = 0
        times = s / r0 if abs(a) < 1e-12 else (-r0 + np.sqrt(r0 * r0 + 4.0 * a * s)) / (2.0 * a)
        return times[times < horizon_s]


class MMPP(Spec):
    """On/off bursts: a two-state Markov-modulated Poisson process."""

    kind: Literal["mmpp"] = "mmpp"
    rate_on: float = Field(gt=0)
    rate_off: float = Field(ge=0)
    mean_on_s: float = Field(gt=0)
    mean_off_s: float = Field(gt=0)
    start: Literal["on", "off", "stationary"] = "stationary"

    @property
    def mean_rate(self) -> float:
        p_on = self.mean_on_s / (self.mean_on_s + self.mean_off_s)
        return p_on * self.rate_on + (1 - p_on) * self.rate_off

    def times(self, rng: np.random.Generator, horizon_s: float) -> np.ndarray:
        if self.start == "stationary":
            on = bool(rng.random() < self.mean_on_s / (self.mean_on_s + self.mean_off_s))
        else:
            on = self.start == "on"
        out: list[np.ndarray] = []
        t = 0.0
        while t < horizon_s:
            dur = rng.exponential(self.mean_on_s if on else self.mean_off_s)
            end = min(t + dur, horizon_s)
            rate = self.rate_on if on else self.rate_off
            if rate > 0:
                n = rng.poisson(rate * (end - t))
                out.append(np.sort(rng.uniform(t, end, size=n)))
            t = end
            on = not on
        return np.concatenate(out) if out else np.empty(0)


class Diurnal(Spec):
    kind: Literal["diurnal"] = "diurnal"
    rate: Rate = Field(description="mean rate, requests per second")
    amplitude: float = Field(ge=0, le=1)
    period_s: float = Field(gt=0)
    phase: float = 0.0

    def rate_at(self, t: np.ndarray | float) -> np.ndarray | float:
        return self.rate * (1 + self.amplitude * np.sin(2 * np.pi * np.asarray(t) / self.period_s + self.phase))

    def times(self, rng: np.random.Generator, horizon_s: float) -> np.ndarray:
        peak = self.rate * (1 + self.amplitude)
        cand = Poisson(rate=peak).times(rng, horizon_s)
        keep = rng.random(len(cand)) * peak < self.rate_at(cand)
        return cand[keep]


PROCESSES: tuple[type[Spec], ...] = (Poisson, Constant, Gamma, Ramp, MMPP, Diurnal)
