"""Human-readable output of an evaluation: the terminal tables, the verdicts and the Pareto plots.

`print_table` prints what `admit evaluate` shows in 120 columns: the overall figures led by goodput, one row
per policy; the per-tenant figures, one row per tenant and policy (it grows downwards, not sideways, with the
number of tenants); and each policy's verdict against the first (evaluate/verdict.py). `pareto_plot` draws
goodput against the worst tenant's attainment, what the verdict trades off; `latency_pareto_plot` is the seed
study's throughput against e2e p99, kept for seed-paper's reproduction.

Where the tenants have contracts the overall table leads with what the verdict then judges first: the
contracts met on the table (k/n, evaluate/verdict.py's rule), the contract shortfall (in-contract requests
short of the promise per episode), then goodput and Jain's index over share-normalised service
(envs/contracts.py's ``jain_share``); the per-tenant table adds each tenant's in-contract attainment, its
promise and whether it is met, its excess goodput and the concurrency it borrowed and lent (envs/contracts.py's
``episode_lending``); the plot puts goodput against the contract shortfall. Without contracts every output is
as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from admit.evaluate.verdict import contracts_met, has_contracts, meets, too_few_seeds, verdicts
from rich import box
from rich.console import Console
from rich.table import Table

WIDTH = 120


def _pm(entry: dict, digits: int) -> str:
    """``mean ±h``: h the half-width of the 95% CI (Student t, symmetric); ``mean +h`` where the interval was
    clipped at a bound below (evaluate/offline.py ``LOWER_BOUNDS``: the shortfall, at 0), h then its upper end's
    distance from the mean."""
    lo, hi = entry["ci95"]
    mean = entry["mean"]
    if lo == 0.0 and hi - mean > mean:  # clipped at 0: the t-interval's lower end, mean - (hi - mean), was below
        return f"{mean:.{digits}f} +{hi - mean:.{digits}f}"
    return f"{mean:.{digits}f} ±{(hi - lo) / 2:.{digits}f}"


def _p(p: float, first: bool = False) -> str:
    """A p-value in five characters at most; "—" on the first policy's row (it is not tested against itself)."""
    return "—" if first else (f"{p:.0e}" if p < 1e-3 else f"{p:.3f}")


def _table(title: str, columns: list[str], wrap: tuple[str, ...] = ()) -> Table:
    """A borderless table; a header's "\n" splits it over two lines so the column stays as narrow as its
    figures, and only the policy names and the columns named in ``wrap`` may wrap their cells."""
    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, title_justify="left")
    for col in columns:
        left = col in ("policy", "tenant", "verdict", "why")
        t.add_column(col, justify="left" if left else "right", no_wrap=col not in (*wrap, "policy"))
    return t


def _horizon(data: dict) -> str:
    h = data.get("horizon_s")
    return f" ({h:g} s episodes)" if h else ""


def _met(entry: dict) -> str:
    """Contracts met on the table, ``k/n``."""
    k, n = contracts_met(entry)
    return f"{k}/{n}"


def contract_overall_table(data: dict) -> Table:
    """The overall table where the tenants have contracts: contracts met, shortfall, goodput, Jain over
    share-normalised service first, then attainment and latency as without contracts."""
    t = _table(
        "all tenants",
        [
            "policy",
            "met",
            "shortfall\nrequests",
            "goodput\nreq/s",
            "p",
            "Jain\nshare",
            "attainment",
            "worst\ntenant",
            "TTFT\np99 s",
            "TPOT\np99 ms",
            "drops",
            "rejects",
            "mean\nlimit",
        ],
    )
    for i, (name, e) in enumerate(data["policies"].items()):
        pv = e["p_value_vs_first"]
        t.add_row(
            name,
            _met(e),
            _pm(e["contract_shortfall"], 1) if "contract_shortfall" in e else "—",  # a live run may lack it
            _pm(e["goodput_rps"], 3),
            _p(pv["goodput_rps"], i == 0),
            f"{e['jain_share']['mean']:.3f}" if "jain_share" in e else "—",
            f"{e['attainment']['mean']:.3f}",
            f"{e['worst_attainment']['mean']:.3f}",
            f"{e['ttft_p99_s']['mean']:.2f}",
            f"{1000 * e['tpot_p99_s']['mean']:.1f}",
            f"{e['timeouts']['mean']:.1f}",
            f"{e['rejected']['mean']:.1f}",
            f"{e['mean_limit']['mean']:.1f}",
        )
    return t


def overall_table(data: dict) -> Table:
    if has_contracts(data):
        return contract_overall_table(data)
    t = _table(
        "all tenants",
        [
            "policy",
            "goodput\nreq/s",
            "p",
            "attainment",
            "p",
            "worst\ntenant",
            "Jain",
            "TTFT\np99 s",
            "TPOT\np99 ms",
            "drops",
            "rejects",
            "mean\nlimit",
        ],
    )
    for i, (name, e) in enumerate(data["policies"].items()):
        pv = e["p_value_vs_first"]
        t.add_row(
            name,
            _pm(e["goodput_rps"], 3),
            _p(pv["goodput_rps"], i == 0),
            _pm(e["attainment"], 3),
            _p(pv["attainment"], i == 0),
            f"{e['worst_attainment']['mean']:.3f}",
            f"{e['jain_attainment']['mean']:.3f}",
            f"{e['ttft_p99_s']['mean']:.2f}",
            f"{1000 * e['tpot_p99_s']['mean']:.1f}",
            f"{e['timeouts']['mean']:.1f}",
            f"{e['rejected']['mean']:.1f}",
            f"{e['mean_limit']['mean']:.1f}",
        )
    return t


def contract_tenant_table(data: dict) -> Table:
    """The per-tenant table where the tenants have contracts: goodput and attainment, then the in-contract
    attainment against the promise ("—" for a tenant without a contract), the excess goodput and the mean
    concurrency borrowed and lent, then latency."""
    t = _table(
        "per tenant",
        ["tenant", "policy", "goodput\nreq/s", "attainment", "in contract\nattainment", "p", "promise", "met",
         "excess\nreq/s", "borrowed\n/ lent", "TTFT\np99 s", "TPOT\np99 ms"],
    )
    pols = data["policies"]
    tenants = list(next(iter(pols.values()))["tenants"])
    for ti, tenant in enumerate(tenants):
        for pi, (name, e) in enumerate(pols.items()):
            te = e["tenants"][tenant]
            promised = "contract" in te and "contract_attainment" in te
            t.add_row(
                tenant if pi == 0 else "",
                name,
                _pm(te["goodput_rps"], 3),
                f"{te['attainment']['mean']:.3f}",
                _pm(te["contract_attainment"], 3) if promised else "—",
                _p(te["p_value_vs_first"]["contract_attainment"], pi == 0) if promised else "—",
                f"{te['contract']['attainment']:g}" if promised else "—",
                ("yes" if meets(te) else "no") if promised else "—",
                f"{te['excess_goodput']['mean']:.3f}" if "excess_goodput" in te else "—",  # old protocol files lack it
                f"{te['borrowed']['mean']:.1f} / {te['lent']['mean']:.1f}" if "borrowed" in te else "—",
                f"{te['ttft_p99_s']['mean']:.2f}",
                f"{1000 * te['tpot_p99_s']['mean']:.1f}",
                end_section=pi == len(pols) - 1 and ti < len(tenants) - 1,
            )
    return t


def tenant_table(data: dict) -> Table:
    if has_contracts(data):
        return contract_tenant_table(data)
    t = _table(
        "per tenant",
        ["tenant", "policy", "goodput\nreq/s", "p", "attainment", "p", "TTFT\np99 s", "TPOT\np99 ms"],
    )
    pols = data["policies"]
    tenants = list(next(iter(pols.values()))["tenants"])
    for ti, tenant in enumerate(tenants):
        for pi, (name, e) in enumerate(pols.items()):
            te = e["tenants"][tenant]
            pv = te["p_value_vs_first"]
            t.add_row(
                tenant if pi == 0 else "",
                name,
                _pm(te["goodput_rps"], 3),
                _p(pv["goodput_rps"], pi == 0),
                _pm(te["attainment"], 3),
                _p(pv["attainment"], pi == 0),
                f"{te['ttft_p99_s']['mean']:.2f}",
                f"{1000 * te['tpot_p99_s']['mean']:.1f}",
                end_section=pi == len(pols) - 1 and ti < len(tenants) - 1,
            )
    return t


def verdict_table(data: dict) -> Table:
    """Each policy's verdict against the first policy and why (evaluate/verdict.py)."""
    base = next(iter(data["policies"]))
    if has_contracts(data):
        title = (f"verdict vs {base}: wins = goodput higher at p < 0.05 and every contract {base} meets met;\n"
                 f"loses = goodput lower at p < 0.05 or a contract {base} meets broken (its in-contract "
                 "attainment\nlower at p < 0.05); otherwise ties")
        t = _table(title, ["policy", "verdict", "why"], wrap=("why",))
        for name, v in verdicts(data).items():
            if v is not None:
                t.add_row(name, v.outcome, "; ".join(v.reasons))
        return t
    t = _table(
        f"verdict vs {base}: wins = goodput higher at p < 0.05 and no tenant's attainment lower by > 0.01 at\n"
        "p < 0.05; loses = goodput lower at p < 0.05 or a tenant's attainment lower so; otherwise ties",
        ["policy", "verdict", "why"],
        wrap=("why",),
    )
    for name, v in verdicts(data).items():
        if v is not None:
            t.add_row(name, v.outcome, "; ".join(v.reasons))
    return t


def header_lines(data: dict) -> list[str]:
    """What the tables' figures are, above them."""
    base = next(iter(data["policies"]))
    lines = [
        f"{data['scenario']}{_horizon(data)}, {data['seeds']} seeds: mean ±95% CI; p = paired Wilcoxon (two-sided, "
        f"by seed) vs {base}",
        "attainment = good / arrived; worst tenant = lowest attainment; Jain over attainments; drops = queue timeouts",
    ]
    if has_contracts(data):
        lines[1] = "attainment = good / arrived; worst tenant = lowest attainment; drops = queue timeouts"
        lines += [
            "met = contracts met, k/n: a contract is met when its mean in-contract attainment over the seeds reaches",
            "its promise; shortfall = in-contract requests short of the promise per episode; in contract attainment =",
            "good / arrived in contract; Jain share = Jain over the contracted tenants' good service / contract rate",
            "excess = good out-of-contract requests/s; borrowed / lent = mean concurrency in flight beyond the",
            "tenant's nominal share (its contract's share of the total; none without a contract) / of its idle share",
            "that borrowers use; the shortfall is a count: its CI is clipped at 0, shown mean +h (the upper end) where",
            "the t-interval would reach below 0",
        ]
    return lines


def print_table(data: dict, console: Console | None = None) -> None:
    console = console or Console(width=WIDTH)
    for line in header_lines(data):
        console.print(line, highlight=False, markup=False)
    console.print(overall_table(data))
    console.print(tenant_table(data))
    if len(data["policies"]) > 1:
        console.print(verdict_table(data))
        note = too_few_seeds(data["seeds"])
        if note:
            console.print(note, highlight=False, markup=False)


def pareto_plot(data: dict, path: str | Path) -> None:
    """Goodput vs the worst tenant's attainment, one point per policy with 95% CI whiskers on both; up and to
    the right is better. The first policy (the baseline) is drawn as a square, the policies no other one beats
    on both means are joined by a dashed line (the frontier of the means; the whiskers say how sure it is).
    The attainment whiskers are clipped to [0, 1], where a Student t interval of few seeds can overshoot.
    Where the tenants have contracts, `contract_plot` draws goodput against the contract shortfall instead."""
    if has_contracts(data) and all("contract_shortfall" in e for e in data["policies"].values()):
        contract_plot(data, path)
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pols = data["policies"]
    pts = {n: (e["worst_attainment"]["mean"], e["goodput_rps"]["mean"]) for n, e in pols.items()}
    fig, ax = plt.subplots(figsize=(6.4, 4.8), dpi=120)
    for i, (name, e) in enumerate(pols.items()):
        x, y = pts[name]
        wa, gp = [min(max(v, 0.0), 1.0) for v in e["worst_attainment"]["ci95"]], e["goodput_rps"]["ci95"]
        ax.errorbar(
            x,
            y,
            xerr=_whisker(x, wa),
            yerr=_whisker(y, gp),
            fmt="none",
            ecolor="gray",
            alpha=0.6,
            capsize=3,
        )
        ax.scatter([x], [y], marker="s" if i == 0 else "o", s=50 if i == 0 else 30, alpha=0.8, label=name)
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(6, 6), fontsize=8)
    front = sorted(
        (p for n, p in pts.items() if not any(q[0] >= p[0] and q[1] >= p[1] and q != p for q in pts.values())),
    )
    if len(front) > 1:
        ax.plot([p[0] for p in front], [p[1] for p in front], "--", color="gray", alpha=0.5, linewidth=1)
    ax.set_xlabel("worst tenant's attainment (good / arrived)  — higher is better")
    ax.set_ylabel("goodput (good req/s)  — higher is better")
    ax.set_title(f"{data['scenario']}: {data['seeds']} seeds, mean and 95% CI; square: {next(iter(pols))}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def lending_plot(series: dict, path: str | Path, scenario: str = "", smooth_s: float = 60.0) -> None:
    """Each tenant's concurrency borrowed (above 0) and lent (below 0) over the episode, one panel per policy
    (admit.evaluate.offline ``lending_series``: the mean over the seeds at each decision), each drawn as its
    moving average over ``smooth_s`` seconds; the panels share both axes, so the policies compare at a glance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    t = np.asarray(series["time_s"], dtype=float)
    step = float(np.median(np.diff(t))) if len(t) > 1 else 1.0
    k = max(1, round(smooth_s / step))

    def smoothed(v: list[float]) -> np.ndarray:
        x = np.asarray(v, dtype=float)
        return np.convolve(x, np.ones(k) / k, mode="same") if k > 1 and len(x) >= k else x

    pols = series["policies"]
    cols = min(3, len(pols))
    rows = -(-len(pols) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 2.8 * rows + 0.6), dpi=100, sharex=True,
                             sharey=True, squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (pol, figs) in zip(axes.flat, pols.items(), strict=False):
        for i, name in enumerate(figs["borrowed"]):
            c = colours[i % len(colours)]
            ax.plot(t, smoothed(figs["borrowed"][name]), color=c, label=f"{name} (nominal {series['nominal'][name]})")
            ax.plot(t, -smoothed(figs["lent"][name]), color=c, linestyle="--")
        ax.axhline(0.0, color="gray", linewidth=0.8)
        ax.set_title(pol, fontsize=10)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(pols):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("seconds")
    for row in axes:
        row[0].set_ylabel("borrowed (+) / lent (−)\nrequests in flight")
    axes[0][0].legend(fontsize=7, loc="best")
    fig.suptitle(f"{scenario}: concurrency borrowed beyond each tenant's nominal share (solid) and lent of it "
                 f"(dashed), mean over the seeds, {smooth_s:g} s moving average", fontsize=10)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _whisker(mean: float, ci: Sequence[float]) -> list[list[float]]:
    """Error-bar lengths below and above ``mean`` for the interval ``ci``: never negative (a clipped interval,
    or a mean read from elsewhere, may lie outside it)."""
    return [[max(mean - ci[0], 0.0)], [max(ci[1] - mean, 0.0)]]


def contract_plot(data: dict, path: str | Path) -> None:
    """Goodput vs the contract shortfall (in-contract requests short of the promise per episode, its axis
    reversed so that up and to the right is better, as in `pareto_plot`), one point per policy with 95% CI
    whiskers, each named with its contracts met (k/n); the baseline a square, the frontier of the means
    dashed. The shortfall whiskers are clipped at 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pols = data["policies"]
    pts = {n: (e["contract_shortfall"]["mean"], e["goodput_rps"]["mean"]) for n, e in pols.items()}
    fig, ax = plt.subplots(figsize=(6.4, 4.8), dpi=120)
    for i, (name, e) in enumerate(pols.items()):
        x, y = pts[name]
        sf, gp = [max(v, 0.0) for v in e["contract_shortfall"]["ci95"]], e["goodput_rps"]["ci95"]
        ax.errorbar(x, y, xerr=_whisker(x, sf), yerr=_whisker(y, gp), fmt="none",
                    ecolor="gray", alpha=0.6, capsize=3)
        ax.scatter([x], [y], marker="s" if i == 0 else "o", s=50 if i == 0 else 30, alpha=0.8, label=name)
        ax.annotate(f"{name} ({_met(e)} met)", (x, y), textcoords="offset points", xytext=(6, 6), fontsize=8)
    front = sorted(
        (p for n, p in pts.items() if not any(q[0] <= p[0] and q[1] >= p[1] and q != p for q in pts.values())),
    )
    if len(front) > 1:
        ax.plot([p[0] for p in front], [p[1] for p in front], "--", color="gray", alpha=0.5, linewidth=1)
    ax.invert_xaxis()
    ax.set_xlabel("contract shortfall (in-contract requests short of the promise)  — lower is better")
    ax.set_ylabel("goodput (good req/s)  — higher is better")
    ax.set_title(f"{data['scenario']}: {data['seeds']} seeds, mean and 95% CI; square: {next(iter(pols))}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def latency_pareto_plot(data: dict, path: str | Path) -> None:
    """The seed study's plot: throughput vs e2e p99 per policy, 95% CI error bars, marker area proportional to
    mean drops (seed-paper's reproduction, docs/reproduction.md)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.8), dpi=120)
    drops = [e["dropped"]["mean"] for e in data["policies"].values()]
    scale = 600.0 / max(max(drops), 1.0)
    for name, e in data["policies"].items():
        x, y = e["p99_s"]["mean"], e["throughput_rps"]["mean"]
        ax.errorbar(x, y, xerr=_whisker(x, e["p99_s"]["ci95"]), yerr=_whisker(y, e["throughput_rps"]["ci95"]),
                    fmt="none", ecolor="gray", alpha=0.6, capsize=3)
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
