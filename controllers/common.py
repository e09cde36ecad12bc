"""Helpers shared by the classic controllers: which latency they read, and how a desired limit becomes a delta.

Latency input (reference: feed TTFT or per-token latency, not end-to-end latency, which scales with the
output length). ``latency_kind(spec)`` is ``"ttft"`` when the scenario declares any TTFT objective (the
token-engine scenarios, where ``ttft_*`` is time to the first token, admission wait included) and
``"e2e"`` otherwise: on the slot engine TTFT is only the admission-queue wait (zero whenever a slot is
free), so a gradient on it would read "no latency" and the study's objective there is end to end.

Every classic algorithm keeps its own real-valued limit L per tenant and emits
``clamp(round(L) − current limit, ±max_step)``; the caller clamps the limit to [min, max].
"""

from __future__ import annotations

import math

from admit.core.observation import NO_SLO, TenantObservation
from admit.core.spec import ControlSpec


def latency_kind(spec: ControlSpec) -> str:
    return "ttft" if any(math.isfinite(t.slo_ttft_p99_s) for t in spec.tenants) else "e2e"


def latency(t: TenantObservation, kind: str, pct: str = "p50") -> float:
    return float(getattr(t, f"{kind}_{pct}"))


def slo_missed(t: TenantObservation) -> bool:
    """The window's p99 is over one of the tenant's objectives (no samples: not missed)."""
    if t.samples <= 0:
        return False
    return (t.slo_ttft_p99 < NO_SLO and t.ttft_p99 > t.slo_ttft_p99) or (
        t.slo_e2e_p99 < NO_SLO and t.e2e_p99 > t.slo_e2e_p99
    )


def to_delta(target: float, limit: float, max_step: int) -> int:
    d = round(target) - round(limit)
    return max(-max_step, min(max_step, d))


# VTC's cost of service (Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024): an input token
# weighs 1, an output token 2
VTC_OUTPUT_WEIGHT = 2.0


def weighted_tokens_per_s(t: TenantObservation, window_s: float, tokens_per_request: float) -> float:
    """The tenant's service in VTC's weighted tokens per second over the window: its completions times
    ``tokens_per_request`` (the input tokens one completed request stands for; the Observation has no count of
    completed prompt tokens) plus ``VTC_OUTPUT_WEIGHT`` × its output tokens per second. The one home of that
    cost: ``ledger`` and ``vtc`` both read service through it."""
    return t.completions / max(window_s, 1e-9) * tokens_per_request + VTC_OUTPUT_WEIGHT * t.output_tokens_per_s


# p95 of a window from its p50 and p99 when only those two are observed (TPOT): the log-linear quantile
# curve through (0.5, p50) and (0.01, p99) in log survival reaches 0.05 at this fraction of the way
_P95_AT = math.log(0.5 / 0.05) / math.log(0.5 / 0.01)


def tpot_p95(t: TenantObservation) -> float:
    """A tenant's TPOT p95 from the window's p50 and p99 (the Observation carries only those two)."""
    if t.tpot_p50 <= 0 or t.tpot_p99 <= 0:
        return t.tpot_p99
    return t.tpot_p50 * (t.tpot_p99 / t.tpot_p50) ** _P95_AT
