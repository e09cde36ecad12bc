"""The Controller interface: every policy (static, heuristic, classic, SB3, LLM) fits it.

A controller is any object with ``reset(spec)`` and ``act(obs) -> deltas``: one integer per tenant in
``[-spec.limits.max_step, +spec.limits.max_step]``. The caller (the Gymnasium env, the evaluator, the
live control loop) adds the deltas to the current limits and clamps them to ``[limits.min, limits.max]``.

Optional: a controller that can fail *inside* act() and still return deltas (the LLM policy holds when its
model does not answer) MAY expose ``last_failure: str | None``: the reason its most recent act() could not
decide, or None when it decided or held on purpose (not a decision point, its own rate budget). The live
loop reads it with `policy_failure` and counts such a hold as a failure, so its fallback still triggers. A
controller without the attribute never fails this way; the Protocol does not require it.
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


RULES = ("static", "naive", "differentiated")


def decision_rule(controller: object) -> tuple[str, tuple[float, ...]] | None:
    """The built-in rule the controller decides by, as ``(name, parameters)`` (its optional ``decision_rule()``),
    else None. A world may then run the rule's decisions itself (envs/compiled.py runs a whole episode of one in
    a compiled loop); the rule must give exactly the controller's decisions. ``name`` is one of ``RULES``:
    ``static`` with the per-tenant target caps (none: hold), ``naive`` with (p99 threshold s, memory high,
    memory low), ``differentiated`` with (p99 threshold s, backlog high)."""
    fn = getattr(controller, "decision_rule", None)
    rule = fn() if fn is not None else None
    if rule is not None and rule[0] not in RULES:
        raise ValueError(f"decision_rule {rule[0]!r} is unknown; allowed: {', '.join(RULES)}")
    return rule


def policy_failure(controller: object) -> str | None:
    """The reason the controller's last act() could not decide (its optional ``last_failure``), else None.

    Raises TypeError when the attribute is set to something other than a string or None.
    """
    reason = getattr(controller, "last_failure", None)
    if reason is None or reason == "":
        return None
    if not isinstance(reason, str):
        raise TypeError(f"last_failure must be a string or None, got {reason!r}"[:200])
    return reason


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
