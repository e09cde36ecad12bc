"""Workload: arrival processes and request-size distributions, all drawn from a seeded generator.

The processes and distributions the load generator shares live in core/workload.py (``poisson``,
``constant``, ``gamma``, ``ramp``, ``mmpp``, ``diurnal``; sizes ``constant``, ``uniform``, ``normal``,
``lognormal``, ``exponential``: their parameters and draws are documented there). This module adds what
needs the simulator's data files and builds the scenario's unions:

* ``trace``     – replay of a CSV (timestamps, prompt and output tokens), e.g. the bundled Azure 2023 trace.
* ``servegen``  – one client of the ServeGen production table: per-10-minute rate and fitted IAT law
                  (envs/servegen.py).
* size ``empirical`` – resample one column of a trace.

Every model is a pydantic model (so scenario YAML is validated with clear errors) with a method that draws
from a ``numpy.random.Generator``. A whole episode's arrivals are drawn at reset, before any policy acts:
the workload is exogenous, so two policies run on one seed see exactly the same requests.
"""

from __future__ import annotations

import math
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from admit.core import traces
from admit.core.workload import (
    MMPP,
    Constant,
    ConstantSize,
    Diurnal,
    ExponentialSize,
    Gamma,
    LognormalSize,
    NormalSize,
    Poisson,
    Ramp,
    Spec,
    UniformSize,
)
from admit.envs.servegen import ServeGenArrivals
from pydantic import Field

__all__ = [
    "BUILTIN_TRACES",
    "MMPP",
    "ArrivalSpec",
    "Constant",
    "ConstantSize",
    "Diurnal",
    "EmpiricalSize",
    "ExponentialSize",
    "Gamma",
    "LognormalSize",
    "NormalSize",
    "Poisson",
    "Ramp",
    "SizeSpec",
    "TenantDraw",
    "Trace",
    "UniformSize",
    "draw_tenant",
    "load_trace",
]

BUILTIN_TRACES = {
    "azure-2023-code": "azure_llm_2023/AzureLLMInferenceTrace_code.csv",
    "azure-2023-conv": "azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
}


# --------------------------------------------------------------------------- sizes from a trace
class EmpiricalSize(Spec):
    """Resample (with replacement) one column of a trace: ``prompt`` or ``output`` tokens."""

    kind: Literal["empirical"] = "empirical"
    source: str
    column: Literal["prompt", "output"]

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        _, prompt, output = load_trace(self.source)
        col = prompt if self.column == "prompt" else output
        return col[rng.integers(0, len(col), size=n)]


SizeSpec = Annotated[
    ConstantSize | UniformSize | NormalSize | LognormalSize | ExponentialSize | EmpiricalSize,
    Field(discriminator="kind"),
]


# --------------------------------------------------------------------------- trace replay
class Trace(Spec):
    """Replay a trace: a builtin name (``azure-2023-code``, ``azure-2023-conv``) or a CSV path.

    A CSV needs a header with a time column (seconds, or ``YYYY-MM-DD HH:MM:SS.fff`` timestamps) and
    token columns (core/traces.py reads it, as the load generator does). Times are shifted so the first request
    arrives at ``offset_s`` and divided by ``speedup``; with ``loop`` the trace repeats until the horizon.
    Request sizes come from the trace.

    A replayed trace is the same on every seed. ``random_shift_max_s`` > 0 makes seeds differ while
    keeping the real arrivals: the trace is rotated circularly by a shift drawn uniformly from
    [0, random_shift_max_s) with the episode seed alone, so all tenants of a scenario rotate by the same
    amount and bursts that happened together in the recording still happen together.
    """

    kind: Literal["trace"] = "trace"
    source: str
    speedup: float = Field(default=1.0, gt=0)
    offset_s: float = Field(default=0.0, ge=0)
    loop: bool = False
    random_shift_max_s: float = Field(default=0.0, ge=0)

    def rows(self, horizon_s: float, episode_seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        t, prompt, output = load_trace(self.source)
        if self.random_shift_max_s > 0 and len(t) > 1:
            span = t[-1] + (t[-1] - t[0]) / (len(t) - 1)  # one mean gap after the last request
            shift = np.random.default_rng([episode_seed, 0x7A11]).uniform(0.0, self.random_shift_max_s) % span
            t = (t - shift) % span
            order = np.argsort(t, kind="stable")
            t, prompt, output = t[order], prompt[order], output[order]
        t = t / self.speedup + self.offset_s
        if self.loop and len(t):
            span = t[-1] - self.offset_s + (t[1] - t[0] if len(t) > 1 else 1.0)
            reps = max(1, math.ceil((horizon_s - self.offset_s) / span))
            t = np.concatenate([t + k * span for k in range(reps)])
            prompt = np.tile(prompt, reps)
            output = np.tile(output, reps)
        keep = t < horizon_s
        return t[keep], prompt[keep], output[keep]

    def times(self, rng: np.random.Generator, horizon_s: float) -> np.ndarray:
        return self.rows(horizon_s)[0]  # without an episode seed: no shift


ArrivalSpec = Annotated[
    Poisson | Constant | Gamma | Ramp | MMPP | Diurnal | Trace | ServeGenArrivals, Field(discriminator="kind")
]


# --------------------------------------------------------------------------- traces
@lru_cache(maxsize=16)
def load_trace(source: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read a trace (a builtin name or a CSV path) into (seconds from first arrival, prompt tokens, output
    tokens), sorted by time: core/traces.py's reader, the one the load generator replays with."""
    if source in BUILTIN_TRACES:
        ref = resources.files("admit.envs").joinpath("data", *BUILTIN_TRACES[source].split("/"))
        return traces.read_csv(ref.read_text(), source)
    path = Path(source)
    if not path.is_file():
        raise ValueError(
            f"trace {source!r} is neither a builtin trace ({', '.join(BUILTIN_TRACES)}) nor a readable file"
        )
    return traces.read_csv(path.read_text(), str(path))


# --------------------------------------------------------------------------- one tenant's draw
class TenantDraw:
    """Arrivals of one tenant for one episode: times, prompt/output tokens, uniform service draws."""

    __slots__ = ("output", "prompt", "times", "u_service")

    def __init__(self, times: np.ndarray, prompt: np.ndarray, output: np.ndarray, u_service: np.ndarray) -> None:
        self.times, self.prompt, self.output, self.u_service = times, prompt, output, u_service


def draw_tenant(
    arrival: ArrivalSpec,
    prompt: SizeSpec | None,
    output: SizeSpec | None,
    rng: np.random.Generator,
    horizon_s: float,
    episode_seed: int = 0,
) -> TenantDraw:
    """Draw one tenant's requests. Trace sizes are used unless prompt/output specs override them.

    ``rng`` is the tenant's own stream; ``episode_seed`` drives what all tenants share (a trace rotation).
    """
    if isinstance(arrival, Trace):
        times, p, o = arrival.rows(horizon_s, episode_seed)
    else:
        times = arrival.times(rng, horizon_s)
        p = o = None  # type: ignore[assignment]  # filled from the size specs below
    n = len(times)
    if prompt is not None:
        p = prompt.sample(rng, n)
    if output is not None:
        o = output.sample(rng, n)
    if p is None or o is None:
        raise ValueError("a non-trace tenant needs prompt_tokens and output_tokens distributions")
    u = rng.random(n)
    return TenantDraw(np.asarray(times, dtype=np.float64), np.asarray(p), np.asarray(o), u)
