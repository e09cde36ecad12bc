"""Human-readable output of an evaluation: a terminal table and a Pareto plot."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table


def _fmt(entry: dict, digits: int) -> str:
    lo, hi = entry["ci95"]
    return f"{entry['mean']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _p(p: float) -> str:
    return "—" if p >= 1.0 else (f"{p:.1e}" if p < 1e-3 else f"{p:.3f}")


def print_table(data: dict, console: Console | None = None) -> None:
    console = console or Console(width=150)
    t = Table(title=f"scenario {data['scenario']}: mean [95% CI] over {data['seeds']} seeds; p vs first (Wilcoxon)")
    for col in ("policy", "throughput req/s", "p", "p99 s", "p", "dropped", "p", "SLO attain.", "Jain"):
        t.add_column(col, justify="right" if col != "policy" else "left")
    for name, e in data["policies"].items():
        pv = e["p_value_vs_first"]
        t.add_row(
            name,
            _fmt(e["throughput_rps"], 3),
            _p(pv["throughput_rps"]),
            _fmt(e["p99_s"], 2),
            _p(pv["p99_s"]),
            _fmt(e["dropped"], 1),
            _p(pv["dropped"]),
            f"{e['slo_attainment']['mean']:.3f}",
            f"{e['jain_fairness']['mean']:.3f}",
        )
    console.print(t)


def pareto_plot(data: dict, path: str | Path) -> None:
    """Throughput vs p99 per policy, 95% CI error bars, marker area proportional to mean drops."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.8), dpi=120)
    drops = [e["dropped"]["mean"] for e in data["policies"].values()]
    scale = 600.0 / max(max(drops), 1.0)
    for name, e in data["policies"].items():
        x, y = e["p99_s"]["mean"], e["throughput_rps"]["mean"]
        xerr = [[x - e["p99_s"]["ci95"][0]], [e["p99_s"]["ci95"][1] - x]]
        yerr = [[y - e["throughput_rps"]["ci95"][0]], [e["throughput_rps"]["ci95"][1] - y]]
        ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt="none", ecolor="gray", alpha=0.6, capsize=3)
        ax.scatter(
            [x], [y], s=20 + scale * e["dropped"]["mean"], alpha=0.6, label=f"{name} (drops {e['dropped']['mean']:.0f})"
        )
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(6, 6), fontsize=8)
    ax.set_xlabel("p99 latency (s)  — lower is better")
    ax.set_ylabel("throughput (req/s)  — higher is better")
    ax.set_title(f"{data['scenario']}: {data['seeds']} seeds, marker area ∝ dropped requests")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
