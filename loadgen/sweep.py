"""Sweeps: run stages over a rate ladder until the system (or the generator) saturates, find the knee.

A sweep stops after the first stage that breaks any of:

* ``achieved_rate < min_achieved · requested_rate`` (default 95 %): the target no longer keeps up, or
  we cannot send that fast;
* ``failed / sent > max_error_rate`` (default 1 %);
* an SLO: the configured percentile (default p99) of a metric above its ``slo`` limit;
* the generator's own send-lag p99 above ``lag_bound_ms``.

``max_sustainable_rate`` is the highest achieved rate among stages that broke nothing. The **knee** is
found on the curve ``(achieved_rate, p99 of latency from the scheduled send)`` with the Kneedle idea:
normalise both axes to [0, 1] and take the stage that lies furthest below the chord from the first to
the last point, i.e. argmax of ``x_norm - y_norm``; with fewer than three stages there is no knee.
Every percentile here is the stage histogram's nearest rank (core/percentiles.py's ``NEAREST_RANK``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

from admit.loadgen.config import RunConfig
from admit.loadgen.metrics import SLO_METRIC
from admit.loadgen.runner import StageResult, run_stage


@dataclass
class SweepResult:
    stages: list[StageResult]
    stop_reason: str | None
    max_sustainable_rate: float | None
    knee_rate: float | None


def stop_reasons(r: StageResult, cfg: RunConfig, slo_percentile: float = 99.0) -> list[str]:
    sweep = cfg.sweep
    min_achieved = sweep.min_achieved if sweep else 0.95
    max_err = sweep.max_error_rate if sweep else 0.01
    out = []
    if r.achieved_ratio < min_achieved:
        out.append(f"achieved {r.achieved_ratio:.1%} of the requested rate (< {min_achieved:.0%})")
    total = r.total
    if total.sent and total.failed / total.sent > max_err:
        out.append(f"error rate {total.failed / total.sent:.1%} > {max_err:.1%}")
    for key, limit_ms in cfg.slo.items():
        h = total.hist[SLO_METRIC[key]]
        value = h.percentile(slo_percentile) / 1e6
        if not math.isnan(value) and value > limit_ms:
            out.append(f"SLO {key}: p{slo_percentile:g} {value:.1f} ms > {limit_ms:g} ms")
    lag = r.lag_p99_ms
    if not math.isnan(lag) and lag > cfg.lag_bound_ms:
        out.append(f"generator send-lag p99 {lag:.2f} ms > {cfg.lag_bound_ms:g} ms")
    return out


def knee(points: list[tuple[float, float]]) -> int | None:
    """Index of the knee of an increasing latency curve (see module docstring)."""
    pts = [(x, y) for x, y in points if not (math.isnan(x) or math.isnan(y))]
    if len(pts) < 3 or len(pts) != len(points):
        return None
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if x1 == x0 or y1 == y0:
        return None
    scores = [(x - x0) / (x1 - x0) - (y - y0) / (y1 - y0) for x, y in pts]
    return max(range(len(pts)), key=scores.__getitem__)


def run_sweep(
    cfg: RunConfig,
    model: str,
    on_stage: Callable[[StageResult, list[str]], None] | None = None,
    on_tick: Callable[[int, float], None] | None = None,
) -> SweepResult:
    assert cfg.sweep is not None
    base = cfg.total_rate
    results: list[StageResult] = []
    stop = None
    sustainable = None
    for i, rate in enumerate(cfg.sweep.rates()):
        r = run_stage(cfg, model, rate / base, stage=i, on_tick=functools.partial(on_tick, i) if on_tick else None)
        results.append(r)
        reasons = stop_reasons(r, cfg)
        if on_stage is not None:
            on_stage(r, reasons)
        if reasons:
            stop = f"stage {i} at {rate:.1f} req/s: " + "; ".join(reasons)
            break
        sustainable = r.achieved_rate
    points = [(r.achieved_rate, r.total.hist["e2e_sched"].percentile(99)) for r in results]
    k = knee(points)
    return SweepResult(results, stop, sustainable, results[k].achieved_rate if k is not None else None)
