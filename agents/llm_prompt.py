"""The prompt of the LLM policy: a compact per-tenant table, SLOs, trend, burst context and the rules.

The prompt is built from a template with ``string.Template`` fields, so a capable model can get a richer
prompt without code changes: write a YAML file with ``system:`` and ``user:`` texts and point
``prompt_file`` (or ``ADMIT_LLM_PROMPT``) at it. Fields available in both texts:

    $n_tenants   number of tenants             $names        tenant names in table order
    $max_step    largest |delta|               $limit_min / $limit_max   bounds of every limit
    $interval_s  seconds between decisions     $window_s     telemetry window of the table
    $queue_timeout_s  seconds a request may queue before it is dropped
    $engine      one line: engine running / waiting / memory use
    $table       per-tenant table (queue, in-flight, limit, arrivals, completions, drops, rejections,
                 TTFT and e2e p99 against each tenant's SLO)
    $trend       per-tenant trend over the recent history, with the arrival-rate change (burst context)

Numbers are rounded (counts to integers, seconds to 0.1 s) and the clock time is left out, so that
identical situations give identical prompts and the policy's cache can answer them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from string import Template

import yaml
from admit.core.observation import NO_SLO, Observation
from admit.core.spec import ControlSpec

DEFAULT_SYSTEM = """\
You set per-tenant concurrency limits for tenants that share one LLM inference server.
A tenant's requests beyond its limit wait in its queue; after $queue_timeout_s s of waiting they are dropped.
Every $interval_s s you may change each limit by an integer delta in [-$max_step, $max_step]; limits stay in \
[$limit_min, $limit_max].
Rules: a drop is worse than a slower reply. Raise (+) a tenant that queues or drops while latency is within \
its SLO. Lower (-) a tenant only when latency exceeds an SLO and it holds capacity others need. Otherwise 0.
Answer in JSON: {"rationale": "<one short sentence>", "deltas": [one integer per tenant, in table order]}."""

DEFAULT_USER = """\
$engine
$table
Trend (oldest -> now):
$trend
Give $n_tenants deltas for: $names."""


@dataclass(frozen=True)
class PromptTemplate:
    system: str = DEFAULT_SYSTEM
    user: str = DEFAULT_USER

    @classmethod
    def from_file(cls, path: str | Path) -> PromptTemplate:
        data = yaml.safe_load(Path(path).read_text())
        if not isinstance(data, dict) or set(data) - {"system", "user"} or not data:
            raise ValueError(f"prompt file {path}: expected a mapping with keys 'system' and/or 'user'")
        return cls(system=str(data.get("system", DEFAULT_SYSTEM)), user=str(data.get("user", DEFAULT_USER)))


@dataclass(frozen=True)
class TenantSnapshot:
    """What the trend line remembers of one tenant at one decision point."""

    e2e_p99: float
    queue: float
    drops: float
    arrival_rate: float  # arrivals per second over the telemetry window


def snapshot(obs: Observation) -> tuple[TenantSnapshot, ...]:
    w = obs.window_s if obs.window_s > 0 else 1.0
    return tuple(TenantSnapshot(t.e2e_p99, t.queue_depth, t.drops, t.arrivals / w) for t in obs.tenants)


def _s(x: float) -> str:
    return f"{x:.1f}"


def _slo(x: float) -> str:
    return "none" if not math.isfinite(x) or x >= NO_SLO else _s(x)


def _table(spec: ControlSpec, obs: Observation) -> str:
    head = "tenant | queue | in_flight | limit | arrivals | done | drops | rejected | ttft_p99/SLO s | e2e_p99/SLO s"
    rows = [head]
    for ts, t in zip(spec.tenants, obs.tenants, strict=True):
        rows.append(
            f"{ts.name} | {t.queue_depth:.0f} | {t.in_flight:.0f} | {t.limit:.0f} | {t.arrivals:.0f} | "
            f"{t.completions:.0f} | {t.drops:.0f} | {t.rejections:.0f} | "
            f"{_s(t.ttft_p99)}/{_slo(ts.slo_ttft_p99_s)} | {_s(t.e2e_p99)}/{_slo(ts.slo_e2e_p99_s)}"
        )
    return "\n".join(rows)


def _burst(old: float, now: float) -> str:
    if now >= 2.0 * old and now - old >= 0.1:
        return "BURST starting"
    if old >= 2.0 * now and old - now >= 0.1:
        return "burst ending"
    return "steady load"


def _trend(spec: ControlSpec, history: Sequence[tuple[TenantSnapshot, ...]]) -> str:
    if len(history) < 2:
        return "no history yet"
    first, last = history[0], history[-1]
    lines = []
    for i, ts in enumerate(spec.tenants):
        a, b = first[i], last[i]
        lines.append(
            f"{ts.name}: e2e_p99 {_s(a.e2e_p99)}->{_s(b.e2e_p99)} s, queue {a.queue:.0f}->{b.queue:.0f}, "
            f"drops {a.drops:.0f}->{b.drops:.0f}, arrivals {a.arrival_rate:.1f}->{b.arrival_rate:.1f}/s "
            f"({_burst(a.arrival_rate, b.arrival_rate)})"
        )
    return "\n".join(lines)


def build_messages(
    template: PromptTemplate,
    spec: ControlSpec,
    obs: Observation,
    history: Sequence[tuple[TenantSnapshot, ...]],
) -> list[dict[str, str]]:
    """Chat messages for one decision; ``history`` ends with the current observation's snapshot."""
    fields = {
        "n_tenants": str(spec.n_tenants),
        "names": ", ".join(t.name for t in spec.tenants),
        "max_step": str(spec.limits.max_step),
        "limit_min": str(spec.limits.min),
        "limit_max": str(spec.limits.max),
        "interval_s": f"{spec.interval_s:g}",
        "window_s": f"{spec.window_s:g}",
        "queue_timeout_s": "none" if not math.isfinite(spec.queue_timeout_s) else f"{spec.queue_timeout_s:g}",
        "engine": f"Engine: running {obs.engine_running:.0f}, waiting {obs.engine_waiting:.0f}, "
        f"memory {obs.gpu_mem_util:.2f}.",
        "table": _table(spec, obs),
        "trend": _trend(spec, history),
    }
    return [
        {"role": "system", "content": Template(template.system).safe_substitute(fields)},
        {"role": "user", "content": Template(template.user).safe_substitute(fields)},
    ]
