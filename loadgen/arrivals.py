"""Open-loop arrival processes: the send times of one tenant, drawn up front from a seeded generator.

A tenant writes its process flat — ``arrival=gamma,rate=20,burstiness=0.5`` on the command line or the
same keys in YAML — and :class:`ArrivalSpec` turns that into the process of core/workload.py, which defines
what each name means, checks its parameters and draws it (``constant`` here is the exact grid from 0:
``t_i = i / rate``; ``ramp`` grows from ``rate_start`` to ``rate`` over the stage). Every process returns a
sorted ``int64`` array of offsets in nanoseconds from the stage start, all within ``[0, duration)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from admit.core.config import error_lines
from admit.core.workload import Constant, Gamma, Poisson, Ramp
from pydantic import ValidationError

NS = 1_000_000_000
PROCESSES = ("constant", "poisson", "gamma", "ramp")  # the processes whose parameters have a flat key here


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
        try:
            # every flat key is checked, whether or not this process reads it: burstiness=0 on a poisson
            # tenant is a mistake to report, not to ignore
            Gamma(rate=self.rate, burstiness=self.burstiness)
            Ramp(rate=self.rate, rate_start=self.rate_start)
        except ValidationError as exc:
            raise ValueError("; ".join(error_lines(exc))) from None

    def to_process(self) -> Constant | Poisson | Gamma | Ramp:
        """The process this spec names, as core/workload.py defines it."""
        if self.process == "constant":
            return Constant(rate=self.rate, phase="zero")
        if self.process == "poisson":
            return Poisson(rate=self.rate)
        if self.process == "gamma":
            return Gamma(rate=self.rate, burstiness=self.burstiness)
        return Ramp(rate=self.rate, rate_start=self.rate_start)


def arrival_times(spec: ArrivalSpec, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Offsets (ns, sorted, ``int64``) of every arrival within ``[0, duration_s)``."""
    if not duration_s > 0:
        raise ValueError(f"duration must be > 0 seconds, got {duration_s}")
    return np.floor(spec.to_process().times(rng, duration_s) * NS).astype(np.int64)
