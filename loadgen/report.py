"""Reports of stages and sweeps: JSON per stage and a summary, a CSV row per stage, a console table
and a latency-vs-throughput PNG.

JSON keys follow inference-perf's shape (``load_summary``, ``latency.time_to_first_token`` …) so that
results line up with that tool; every latency block holds ``mean, p50, p90, p95, p99, p99.9, min, max``
in milliseconds and the sample ``count``. docs/loadgen.md maps each name to vLLM bench, inference-perf
and guidellm.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from admit.loadgen.histogram import Histogram
from admit.loadgen.metrics import TenantMetrics
from admit.loadgen.runner import StageResult

PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)
LATENCY_NAMES = {
    "ttft": "time_to_first_token",
    "itl": "inter_token_latency",
    "tpot": "time_per_output_token",
    "e2e": "request_latency",
    "ntpot": "normalized_time_per_output_token",
    "ttft_sched": "scheduled_time_to_first_token",
    "e2e_sched": "scheduled_request_latency",
    "ntpot_sched": "scheduled_normalized_time_per_output_token",
}


def _num(x: float) -> float | None:
    return None if isinstance(x, float) and math.isnan(x) else round(x, 4)


def hist_stats(h: Histogram) -> dict[str, Any]:
    """Mean, percentiles (nearest rank: core/percentiles.py's NEAREST_RANK), min and max of a nanosecond
    histogram, in milliseconds."""
    out: dict[str, Any] = {"count": h.count, "mean": _num(h.mean / 1e6)}
    for q in PERCENTILES:
        out[f"p{q:g}"] = _num(h.percentile(q) / 1e6)
    out["min"] = _num(h.min / 1e6) if h.count else None
    out["max"] = _num(h.max / 1e6) if h.count else None
    return out


def _block(m: TenantMetrics, span_s: float, scheduled: int, duration_s: float, send_span_s: float,
           warmup_s: float = 0.0) -> dict[str, Any]:
    """One tenant's (or the total's) figures. ``load_summary`` covers the whole stage; with a warm-up,
    ``requests``, ``latency``, ``throughput``, ``errors`` and ``status`` cover the requests scheduled after it
    (rates over ``span_s - warmup_s``), and ``warmup`` counts the others (metrics.py)."""
    sent = m.sent
    span_s = max(span_s - warmup_s, 1e-9)
    out = {
        "load_summary": {
            "scheduled": scheduled,
            "sent": sent,
            "requested_rate": round(scheduled / duration_s, 3),
            "achieved_rate": round(sent / send_span_s, 3),
            "send_lag": hist_stats(m.hist["send_lag"]),
        },
        "requests": {"completed": m.ok, "failed": m.failed, "retries": m.retries, "good": m.good},
        "latency": {name: hist_stats(m.hist[key]) for key, name in LATENCY_NAMES.items()},
        "throughput": {
            "requests_per_s": round(m.ok / span_s, 3),
            "goodput_requests_per_s": round(m.good / span_s, 3),
            "output_tokens_per_s": round(m.output_tokens / span_s, 3),
            "prompt_tokens_per_s": round(m.prompt_tokens / span_s, 3),
        },
        "errors": dict(sorted(m.errors.items())),
        "status": dict(sorted(m.status.items())),
    }
    if warmup_s > 0:
        out["warmup"] = {"seconds": warmup_s, "scheduled": m.warmup_scheduled, "completed": m.warmup_completed,
                         "failed": m.warmup_failed}
    return out


def stage_summary(r: StageResult) -> dict[str, Any]:
    """The JSON-ready summary of one stage (see module docstring)."""
    span_s = max((r.end - r.t0) / 1e9, r.duration_s)
    total = r.total
    out: dict[str, Any] = {
        "stage": r.stage,
        "valid": r.valid,
        "invalid_reasons": r.invalid_reasons(),
        "target_rate": round(r.target_rate, 3),
        "duration_s": r.duration_s,
        "wall_s": round((r.end - r.t0) / 1e9, 3),
        "started_unix": round(r.started_unix, 6),
    }
    out.update(_block(total, span_s, r.scheduled, r.duration_s, r.send_span_s, r.warmup_s))
    out["load_summary"]["achieved_ratio"] = round(r.achieved_ratio, 4)
    out["generator"] = {
        "workers": r.workers,
        "cpu_s": round(r.cpu_s, 3),
        "cpu_s_per_1k_requests": round(r.cpu_s / max(r.sent, 1) * 1000, 4),
        "connections_opened": r.connections_opened,
        "max_in_flight": r.max_in_flight,
        "lag_bound_ms": r.lag_bound_ms,
        "min_achieved": r.min_achieved,
    }
    out["tenants"] = {
        name: _block(m, span_s, r.per_tenant_scheduled.get(name, m.scheduled), r.duration_s, r.send_span_s,
                     r.warmup_s)
        for name, m in r.tenants.items()
    }
    for name, slo in r.per_tenant_slo.items():  # the tenant's objectives (seconds) beside its latencies (ms)
        out["tenants"][name]["slo"] = slo
    if r.hosts:  # several hosts (loadgen/coordinator.py): what each one sent, how late, its clock offset
        out["hosts"] = r.hosts
    out["histograms_ns"] = {k: h.to_dict() for k, h in total.hist.items()}
    return out


CSV_COLUMNS = (
    ("stage", ("stage",)),
    ("valid", ("valid",)),
    ("target_rate", ("target_rate",)),
    ("requested_rate", ("load_summary", "requested_rate")),
    ("achieved_rate", ("load_summary", "achieved_rate")),
    ("achieved_ratio", ("load_summary", "achieved_ratio")),
    ("send_lag_p50_ms", ("load_summary", "send_lag", "p50")),
    ("send_lag_p99_ms", ("load_summary", "send_lag", "p99")),
    ("completed", ("requests", "completed")),
    ("failed", ("requests", "failed")),
    ("requests_per_s", ("throughput", "requests_per_s")),
    ("output_tokens_per_s", ("throughput", "output_tokens_per_s")),
    ("goodput_requests_per_s", ("throughput", "goodput_requests_per_s")),
    *(
        (f"{short}_{stat}_ms", ("latency", long, stat))
        for short, long in (
            ("ttft", "time_to_first_token"),
            ("itl", "inter_token_latency"),
            ("tpot", "time_per_output_token"),
            ("e2e", "request_latency"),
            ("ntpot", "normalized_time_per_output_token"),
            ("ttft_sched", "scheduled_time_to_first_token"),
            ("e2e_sched", "scheduled_request_latency"),
        )
        for stat in ("mean", "p50", "p90", "p99")
    ),
    ("cpu_s_per_1k_requests", ("generator", "cpu_s_per_1k_requests")),
)


def _get(d: dict, path: tuple[str, ...]) -> Any:
    for key in path:
        d = d[key]
    return d


def write_reports(
    out_dir: str | Path, stages: list[dict[str, Any]], extra: dict[str, Any] | None = None, plot: bool = True
) -> dict[str, Path]:
    """Write ``stage_N.json``, ``summary.json``, ``stages.csv`` and maybe ``latency_vs_throughput.png``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for s in stages:
        p = out / f"stage_{s['stage']}.json"
        p.write_text(json.dumps(s, indent=2))
    summary = {"stages": [{k: v for k, v in s.items() if k != "histograms_ns"} for s in stages]}
    summary.update(extra or {})
    paths["summary"] = out / "summary.json"
    paths["summary"].write_text(json.dumps(summary, indent=2))
    paths["csv"] = out / "stages.csv"
    with paths["csv"].open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([c for c, _ in CSV_COLUMNS])
        for s in stages:
            w.writerow([_get(s, path) for _, path in CSV_COLUMNS])
    if plot:
        paths["plot"] = out / "latency_vs_throughput.png"
        plot_latency(stages, paths["plot"], (extra or {}).get("knee_rate"))
    return paths


def plot_latency(stages: list[dict[str, Any]], path: Path, knee_rate: float | None = None) -> None:
    """TTFT and request latency (p50 and p99, from actual and scheduled send) against achieved rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [s["load_summary"]["achieved_rate"] for s in stages]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (title, keys) in zip(
        axes,
        (
            ("time to first token", ("time_to_first_token", "scheduled_time_to_first_token")),
            ("request latency", ("request_latency", "scheduled_request_latency")),
        ),
        strict=True,
    ):
        for key, style in zip(keys, ("-", "--"), strict=True):
            for q, marker in (("p50", "o"), ("p99", "s")):
                y = [s["latency"][key][q] for s in stages]
                label = f"{q} from {'scheduled' if 'scheduled' in key else 'actual'} send"
                ax.plot(x, y, style, marker=marker, label=label)
        for s, xi in zip(stages, x, strict=True):
            if not s["valid"]:
                ax.axvspan(xi * 0.99, xi * 1.01, color="red", alpha=0.15)
        if knee_rate:
            ax.axvline(knee_rate, color="grey", linestyle=":", label=f"knee {knee_rate:g} req/s")
        ax.set_title(title)
        ax.set_xlabel("achieved rate (req/s)")
        ax.set_ylabel("ms")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("latency vs throughput (red bands: stage failed the generator self-check)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def console_table(stages: list[dict[str, Any]], title: str = "admit loadgen"):
    """A rich table, one row per stage."""
    from rich.table import Table

    t = Table(title=title)
    for col in (
        "stage",
        "asked/s",
        "achieved/s",
        "lag p50/p99 ms",
        "TTFT p50/p99 ms",
        "ITL p50/p99 ms",
        "TPOT p50 ms",
        "E2E p50/p99 ms",
        "ok",
        "errors",
        "valid",
    ):
        t.add_column(col, justify="right")

    def pair(s: dict, key: str) -> str:
        blk = s["latency"][key] if key in s["latency"] else s["load_summary"][key]
        return f"{_fmt(blk['p50'])} / {_fmt(blk['p99'])}"

    for s in stages:
        errs = ", ".join(f"{k}:{v}" for k, v in s["errors"].items()) or "0"
        t.add_row(
            str(s["stage"]),
            f"{s['load_summary']['requested_rate']:.1f}",
            f"{s['load_summary']['achieved_rate']:.1f}",
            pair(s, "send_lag"),
            pair(s, "time_to_first_token"),
            pair(s, "inter_token_latency"),
            _fmt(s["latency"]["time_per_output_token"]["p50"]),
            pair(s, "request_latency"),
            str(s["requests"]["completed"]),
            errs,
            "yes" if s["valid"] else "NO: " + "; ".join(s["invalid_reasons"]),
        )
    return t


def hosts_table(stage: dict[str, Any]):
    """A rich table of a multi-host stage's per-host section (``stage["hosts"]``)."""
    from rich.table import Table

    t = Table(title=f"stage {stage['stage']}: hosts")
    for col in ("host", "scheduled", "sent", "lag p50/p99 ms", "clock offset ms", "rtt ms", "late"):
        t.add_column(col, justify="right")
    for h in stage.get("hosts", []):
        t.add_row(
            h["host"], str(h["scheduled"]), str(h["sent"]),
            f"{_fmt(h['send_lag_p50_ms'])} / {_fmt(h['send_lag_p99_ms'])}",
            f"{h['clock_offset_ms']:+.2f}", f"{h['clock_rtt_ms']:.2f}", "LATE" if h["late"] else "no",
        )
    return t


def _fmt(v: float | None) -> str:
    return "-" if v is None else (f"{v:.2f}" if v < 100 else f"{v:.0f}")
