"""The Controller interface: every policy (static, heuristic, classic, SB3, LLM) fits it.

A controller is any object with ``reset(spec)`` and ``act(obs) -> deltas``: one integer per tenant in
``[-spec.limits.max_step, +spec.limits.max_step]``. The caller (the Gymnasium env, the evaluator, the
live control loop) adds the deltas to the current limits and clamps them to ``[limits.min, limits.max]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from admit.core.observation import Observation
from admit.core.spec import ControlSpec


@runtime_checkable
class Controller(Protocol):
    name: str

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None: ...

    def act(self, obs: Observation) -> Sequence[int]: ...


def validate_deltas(deltas: Sequence[int], spec: ControlSpec) -> list[int]:
    """Check a controller's output: right length, integers within ±max_step. Raises ValueError."""
    k = spec.limits.max_step
    if type(deltas) is list and len(deltas) == spec.n_tenants and all(type(d) is int and -k <= d <= k for d in deltas):
        return deltas  # the common case, checked cheaply: it runs on every decision
    try:
        out = [int(d) for d in deltas]
    except (TypeError, ValueError) as e:
        raise ValueError(f"deltas must be integers, got {deltas!r}") from e
    if len(out) != spec.n_tenants:
        raise ValueError(f"expected {spec.n_tenants} deltas (one per tenant), got {len(out)}: {out}")
    for d, raw in zip(out, deltas, strict=True):
        if d != raw or not -k <= d <= k:
            raise ValueError(f"every delta must be an integer in [-{k}, {k}], got {list(deltas)}")
    return out
