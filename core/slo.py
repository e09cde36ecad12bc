"""A tenant's service-level objectives: the one ``slo:`` shape of the scenario, gateway and load-generator
configs.

Today's objectives are bounds on latency percentiles over the control window, in seconds:

* ``e2e_p99_s`` — p99 of arrival → last token;
* ``ttft_p99_s`` — p99 of arrival → first token.

A missing objective is ``None`` in the file and ``math.inf`` in a :class:`~admit.core.spec.TenantSpec`
(:meth:`SLO.e2e_p99_bound`, :meth:`SLO.ttft_p99_bound`). Per-request bounds — a request meets its SLO when
its TTFT is at most ``ttft_s``, its time per output token at most ``tpot_s``, its latency at most ``e2e_s``,
what the load generator's goodput counts — are the next fields to come here, one field per bound in seconds
with ``None`` for none, so a tenant's objectives stay one mapping whichever kind it has.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field


class SLO(BaseModel):
    """One tenant's objectives (see the module docstring); every field is optional, seconds, > 0, finite."""

    # no infinity: "no objective" is written by leaving the key out, so a file has one way to say it
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    e2e_p99_s: float | None = Field(default=None, gt=0)
    ttft_p99_s: float | None = Field(default=None, gt=0)

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
