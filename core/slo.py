"""A tenant's service-level objectives: the one ``slo:`` shape of the scenario, gateway and load-generator
configs.

Two kinds of objective, every one optional, in seconds:

* **per request** — ``ttft_s`` (arrival → first token), ``tpot_s`` (time per output token after the first:
  ``(e2e − ttft) / (output tokens − 1)``, 0 for a one-token answer) and ``e2e_s`` (arrival → last token).
  A request is *good* when it completes and meets every per-request objective its tenant has (DistServe's
  and ``vllm bench serve --goodput``'s definition); dropped and rejected requests are never good. Goodput
  = good requests per second; attainment = good / arrived. This is what evaluations judge by.
* **over the control window** — ``e2e_p99_s`` and ``ttft_p99_s``, bounds on latency percentiles: what the
  Observation carries for controllers that steer by percentiles, and the seed study's objective.

A missing objective is ``None`` in the file and ``math.inf`` in a :class:`~admit.core.spec.TenantSpec`
(the ``*_bound`` properties).
"""

from __future__ import annotations

import math

from admit.core.schema import StrictModel
from pydantic import Field


class SLO(StrictModel):
    """One tenant's objectives (see the module docstring); every field is optional, seconds, > 0, finite.

    No infinity (core/schema.py): "no objective" is written by leaving the key out, so a file has one way to
    say it."""

    ttft_s: float | None = Field(default=None, gt=0)
    tpot_s: float | None = Field(default=None, gt=0)
    e2e_s: float | None = Field(default=None, gt=0)
    e2e_p99_s: float | None = Field(default=None, gt=0)
    ttft_p99_s: float | None = Field(default=None, gt=0)

    @property
    def ttft_bound(self) -> float:
        return _bound(self.ttft_s)

    @property
    def tpot_bound(self) -> float:
        return _bound(self.tpot_s)

    @property
    def e2e_bound(self) -> float:
        return _bound(self.e2e_s)

    @property
    def e2e_p99_bound(self) -> float:
        """``e2e_p99_s``, or ``math.inf`` without an objective (what a TenantSpec carries)."""
        return math.inf if self.e2e_p99_s is None else self.e2e_p99_s

    @property
    def ttft_p99_bound(self) -> float:
        """``ttft_p99_s``, or ``math.inf`` without an objective (what a TenantSpec carries)."""
        return math.inf if self.ttft_p99_s is None else self.ttft_p99_s

    def given(self) -> dict[str, float]:
        """The objectives that are set, by key (what a generated config writes)."""
        return self.model_dump(exclude_none=True)


def _bound(x: float | None) -> float:
    return math.inf if x is None else x


def tpot(e2e_s: float, ttft_s: float, output_tokens: int) -> float:
    """Time per output token after the first (vLLM's TPOT): ``(e2e − ttft) / (tokens − 1)``; 0 for one token."""
    return (e2e_s - ttft_s) / (output_tokens - 1) if output_tokens > 1 else 0.0


def is_good(ttft_s: float, tpot_s: float, e2e_s: float, bounds: tuple[float, float, float]) -> bool:
    """Whether a completed request meets every per-request objective ``bounds`` = (ttft, tpot, e2e) (inf: none)."""
    return ttft_s <= bounds[0] and tpot_s <= bounds[1] and e2e_s <= bounds[2]
