"""`admit demo`: the live stack on a workload whose tenants interfere, per policy on the same requests: which
tenant contracts it kept and broke, its goodput, and each tenant's limit and in-contract attainment over time.

On 127.0.0.1, for each policy on a fresh emulator (the scenario's preset, so no KV or prefix cache carries
over between runs): a gateway with the scenario's tenants, limits, queues, SLOs and contracts, `admit control`
driving it with the policy, and `admit loadgen` replaying the same requests — the scenario's draws for
``--seed``, cut to ``--warmup`` + ``--duration`` seconds (admit.live.sim2live's trace replay). The default
scenario is h200-mix@11000, the first test instance of the h200-mix family: four tenants with contracts, two of
which the caps tuned for goodput alone give up (over RESULTS' 20 seeds, in-contract attainment 0.275 and 0.485
where static:contract keeps all four), so one short run already shows contracts kept and broken.

**Warm-up.** Every run starts at the scenario's initial limits (the operator's) and the policy moves them at
most ``max_step`` a decision, as in the simulator; a static policy's caps take a few decisions to reach. The
first ``--warmup`` seconds of requests are played (they load the engine and charge the contracts' envelopes, as
the simulator's ``warmup_s`` does) but not judged: every figure is over the ``--duration`` seconds after them
(the load generator's warm-up, admit.live.run). In a 45 s run without it, that start decides the verdict.

**Contracts** (core/contract.py). Where the scenario's tenants have a ``contract:``, the gateway classifies each
request at its arrival as in contract (within the tenant's contracted rate and burst) or excess; the promise is
that at least the contract's ``attainment`` of the in-contract requests are good. Per policy and tenant the demo
reports the in-contract arrivals, their attainment, whether the contract was kept (envs/contracts.py's
``contract_figures``, the rule `admit evaluate` and `admit protocol` judge by) and the excess goodput (good
requests beyond the contract, per second; all of a tenant's goodput where it has no contract); per policy, the
contracts kept (k of n) and the goodput. These are read from the gateway's request log, its classes at arrival
and each request good by the simulator's test (admit.live.protocol's ``contract_lines``); the per-tenant
``good``, ``goodput_rps`` and ``attainment`` are the load generator's, from its send. A scenario without contracts
says so, and the demo shows service only.

The default policies: ``static:contract`` (per-tenant caps tuned offline on seeds 900000–900004, never the
demo's seed, for the most goodput among those that keep every contract: the strongest static baseline that
honours contracts), ``static:best`` (caps tuned for goodput alone: a tenant-blind reference), ``contract`` (the
hand-written controller that keeps the contracts first and lends what they leave idle, controllers/contract.py)
and ``ppo:general-untuned`` (the learned policy for every scenario that needs no caps tuned for it, as a
deployment has none; ``ppo:general`` acts around static:best's) when it is shipped; a policy that does not load
on the scenario (``static:contract`` on one without contracts, say) is left out with a note. A request is good
when it completes within every per-request objective of its tenant (the load generator checks them as the
simulator does); a tenant's attainment is its good requests over all its arrivals. Every process is stopped on
exit, error, Ctrl-C or SIGTERM.

Besides the totals, each run records its time series (``series``), in seconds from its first request's
arrival at the gateway: every tenant's limit after each decision of the loop; every tenant's goodput per
``BIN_S`` seconds of completions; and, with contracts, each contracted tenant's in-contract attainment per
``BIN_S`` of arrivals and cumulated from the start (the last value is the table's), as the gateway judged
them (its request log: its own TTFT and e2e, from its arrival, against the tenant's objectives). ``plot_demo``
draws them, one column per policy, next to the JSON (``python -m admit.live.demo DEMO.json OUT.png`` draws a
saved one).
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from admit.envs.contracts import contract_json
from admit.envs.scenario import Scenario, TokenEngineConfig, load_scenario
from admit.live.protocol import contract_lines, line_good, live_contracts
from admit.live.run import read_request_log, run_live
from admit.live.sim2live import gateway_config, load_config, replay_requests, write_trace
from admit.live.stack import Stack, wait_idle
from rich.console import Console
from rich.table import Table

SCENARIO = "h200-mix@11000"
WARMUP_S = 20.0  # seconds played before the judged window: the limits walk from the operator's to the policy's
POLICIES = ("static:contract", "static:best", "contract", "ppo:general-untuned")
LABELS = {"static:best": "tenant-blind"}  # said beside the policy's name wherever it is shown
BIN_S = 5.0  # the goodput series counts good completions per bin of this many seconds, the attainment arrivals


def policy_loads(policy: str, scenario: str) -> str | None:
    """None if ``policy`` can be built and reset on ``scenario``'s control spec, else why not."""
    try:
        from admit.agents.registry import make_controller

        sc = load_scenario(scenario)
        make_controller(policy, scenario=sc).reset(sc.control_spec(), 0)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def no_contracts_note(scenario: str) -> str:
    return (f"{scenario} has no contracts: no tenant is promised anything, so there is nothing to keep or break; "
            "the demo shows service only (give a tenant a contract: block, docs/scenarios.md)")


def _fmt(v: float | None, digits: int = 2) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def _label(policy: str, labels: dict[str, str], sep: str = " ") -> str:
    return f"{policy}{sep}({labels[policy]})" if policy in labels else policy


def contract_text(contract: dict[str, Any]) -> str:
    """A contract as given, in a few words: ``3.85 req/s (burst 23), at least 0.95 good``."""
    if "requests_per_s" in contract:
        rate = f"{contract['requests_per_s']:.3g} req/s (burst {contract['burst']:.3g})"
    else:
        rate = f"{contract['tokens_per_s']:.4g} prompt+output tokens/s (burst {contract['burst']:.4g})"
    return f"{rate}, at least {contract['attainment']:g} of them good"


def print_contracts(result: dict[str, Any], console: Console) -> None:
    """The contracts, then per policy and tenant: in-contract arrivals and their attainment against the target,
    kept or broken, and the excess goodput; per policy the contracts kept (k of n)."""
    contracts = result.get("contracts") or {}
    if not contracts:
        console.print(no_contracts_note(result["scenario"]))
        return
    console.print("contracts: " + "; ".join(f"{n} {contract_text(c)}" for n, c in contracts.items()) + ". A request "
                  "is in contract when it fits its tenant's rate and burst at arrival (the same requests under every "
                  "policy); the contract is kept when at least the target share of those were good.")
    labels = result.get("labels", {})
    table = Table(title=f"admit demo: contracts kept and broken on {result['scenario']} (seed {result['seed']})")
    for col in ("policy", "tenant", "in contract", "attainment in contract", "target", "contract",
                "excess goodput req/s"):
        table.add_column(col, justify="left" if col in ("policy", "tenant", "contract") else "right", no_wrap=True)
    for pol, run in result["runs"].items():
        first = True
        for name, t in run["tenants"].items():
            c = contracts.get(name)
            if c is None:
                cells = ["", "", "", "none"]
            else:
                verdict = "[green]kept[/green]" if t["contract_met"] else (
                    f"[red]BROKEN[/red], {t['contract_shortfall']} short")
                cells = [str(t["contract_arrived"]), _fmt(t["contract_attainment"], 3), f"{c['attainment']:g}",
                         verdict]
            table.add_row(_label(pol, labels, "\n") if first else "", name, *cells, _fmt(t["excess_goodput_rps"], 3))
            first = False
        table.add_row("", "all", str(sum(t.get("contract_arrived", 0) for t in run["tenants"].values())), "", "",
                      f"{run['contracts_met']} of {run['contracts']} kept",
                      _fmt(sum(t["excess_goodput_rps"] for t in run["tenants"].values()), 3), end_section=True)
    console.print(table)


def print_table(result: dict[str, Any], console: Console) -> None:
    runs = result["runs"]
    labels = result.get("labels", {})
    print_contracts(result, console)
    warm = f" after a {result['warmup_s']:g} s warm-up" if result.get("warmup_s") else ""
    table = Table(title=f"admit demo: {result['scenario']}, the requests of {result['duration_s']:g} s{warm}, the "
                        f"same for every policy (seed {result['seed']})")
    for col in ("policy", "tenant", "arrived", "good", "goodput req/s", "attainment", "TTFT p99 s", "e2e p99 s",
                "drops", "mean limit"):
        table.add_column(col, justify="left" if col in ("policy", "tenant") else "right", no_wrap=True)
    for pol, run in runs.items():
        first = True
        for name, t in run["tenants"].items():
            lim = t["limits"]
            table.add_row(_label(pol, labels, "\n") if first else "", name, str(t["scheduled"]), str(t["good"]),
                          _fmt(t["goodput_rps"], 3), _fmt(t["attainment"], 3), _fmt(t["ttft_p99_s"]),
                          _fmt(t["e2e_p99_s"]), str(t["ttl_expired"] + t["queue_full"]),
                          _fmt(sum(lim) / len(lim) if lim else None, 1))
            first = False
        tot = run["tenants"].values()
        sched = sum(t["scheduled"] for t in tot)
        good = sum(t["good"] for t in tot)
        span = run["duration_s"] - run.get("warmup_s", 0.0)  # the load generator's figures are after the warm-up
        table.add_row("", "all", str(sched), str(good), _fmt(good / span, 3),
                      _fmt(good / sched if sched else None, 3), _fmt(run["ttft_p99_s"]), _fmt(run["e2e_p99_s"]),
                      str(sum(t["ttl_expired"] + t["queue_full"] for t in tot)), "", end_section=True)
    console.print(table)
    base = next(iter(runs))
    g0 = runs[base]["goodput_rps"]
    for pol, run in list(runs.items())[1:]:
        ratio = f"{run['goodput_rps'] / g0:.3f}×" if g0 else "—"
        kept = f"kept {run['contracts_met']} of {run['contracts']} contracts, " if result.get("contracts") else ""
        console.print(f"{_label(pol, labels)}: {kept}goodput {run['goodput_rps']:.3f} req/s against {base}'s {g0:.3f} "
                      f"({ratio}); one seed, live: docs/RESULTS.md has the 20-seed verdicts")


def run_demo(scenario: str, duration: float, policies: list[str], out: Path, seed: int, workdir: Path | None,
             console: Console, backend: str | None = None, warmup: float = WARMUP_S) -> dict[str, Any]:
    """``backend``: a running real vLLM server in place of a fresh emulator per policy (the requests are then
    written as live/fidelity_real.py writes them: numbered, so its prefix cache serves none, and the policies
    run one after another on one server, each once it is idle). ``warmup``: seconds of the scenario's requests
    played before the ``duration`` that is judged (see the module doc)."""
    if not (math.isfinite(warmup) and warmup >= 0):
        raise ValueError(f"warmup must be a number of seconds >= 0, got {warmup}")
    sc = load_scenario(scenario, horizon_s=warmup + duration)
    if not isinstance(sc.engine, TokenEngineConfig):
        raise ValueError(f"the demo needs a token-engine scenario (the emulator runs the token engine); "
                         f"{scenario} has a {sc.engine.kind} engine")
    notes, chosen = [], []
    if not sc.has_contracts:
        notes.append(no_contracts_note(scenario))
        console.print(f"[yellow]{notes[-1]}[/yellow]")
    for pol in policies:
        why = policy_loads(pol, scenario)
        if why is None:
            chosen.append(pol)
        else:
            notes.append(f"{pol} is left out: it did not load ({why})")
            console.print(f"[yellow]{notes[-1]}[/yellow]")
    if not chosen:
        raise ValueError("no policy of " + ", ".join(policies) + " loads")
    requests = replay_requests(sc, seed)
    span = f"{warmup:g} s of warm-up and {duration:g} s judged " if warmup > 0 else f"{duration:g} s "
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="admit-demo-") as tmp:
        root = workdir or Path(tmp)
        for i, pol in enumerate(chosen):
            with Stack(root / f"run{i}") as stack:
                trace = stack.workdir / "requests.jsonl"
                load = load_config(sc, trace)
                if backend is None:
                    write_trace(sc, requests, trace)
                    console.print(f"{pol}: emulator ({sc.engine.preset}) + gateway + control loop + admit loadgen, "
                                  f"{len(requests)} requests over {span}...")
                    target = stack.emulator("--preset", sc.engine.preset, "--seed", str(seed))
                else:
                    from admit.live import fidelity_real

                    fidelity_real.write_trace(sc, requests, trace)
                    load = fidelity_real.real_load_config(sc, trace)
                    wait_idle(backend)
                    console.print(f"{pol}: real vLLM at {backend} + gateway + control loop + admit loadgen, "
                                  f"{len(requests)} requests over {span}...")
                    target = backend
                if warmup > 0:
                    load["warmup"] = warmup
                runs[pol] = run_live(stack, target, "live", gateway_config(sc), load, pol,
                                     sc.interval_s, scenario=scenario, start_on_traffic=True)
                log = Path(runs[pol]["workdir"]) / "requests.jsonl"
                judged_from = runs[pol]["started_unix"] + warmup
                add_contracts(runs[pol], sc, read_request_log(log, judged_from), duration)
                runs[pol]["series"] = run_series(runs[pol].pop("decision_log", []), read_request_log(log, 0.0), sc,
                                                 warmup + duration, judged_from_unix=judged_from)
    result = {"scenario": scenario, "duration_s": duration, "warmup_s": warmup, "seed": seed,
              "requests": len(requests),
              "policies": chosen, "labels": {p: LABELS[p] for p in chosen if p in LABELS}, "notes": notes,
              "contracts": contract_json(sc), "runs": runs,
              "backend": "admit emulate" if backend is None else f"vLLM at {backend}"}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result, console)
    png = out.with_suffix(".png")
    plot_demo(result, png)
    console.print(f"wrote {out} and {png}")
    return result


def add_contracts(run: dict[str, Any], sc: Scenario, lines: list[dict[str, Any]], duration: float) -> None:
    """Add a run's contract figures from the gateway's request log ``lines`` (nothing without contracts): per
    tenant with a contract, ``contract`` (as given), ``contract_arrived`` and ``contract_good`` (in-contract
    requests, and the good ones), ``contract_attainment``, ``contract_met`` and ``contract_shortfall``
    (envs/contracts.py's ``contract_figures`` via admit.live.protocol's ``live_contracts``); per tenant
    ``excess_goodput_rps``, its good out-of-contract requests per second of ``duration`` (every good request of
    a tenant without a contract, which is promised nothing); for the run ``contracts``, ``contracts_met``,
    ``contract_shortfall`` and ``jain_share``."""
    if not sc.has_contracts:
        return
    per, overall = live_contracts(sc, lines)
    c = contract_lines(sc, lines)
    given = contract_json(sc)
    bounds = {t.name: t.request_bounds for t in sc.control_spec().tenants}
    for k, t in enumerate(sc.tenants):
        row = run["tenants"].setdefault(t.name, {})
        if t.name in per:
            f = per[t.name]
            row.update({"contract": given[t.name], "contract_arrived": int(f["contract_arrived"]),
                        "contract_good": int(f["contract_good"]),
                        "contract_attainment": round(f["contract_attainment"], 4),
                        "contract_met": bool(f["contract_met"]), "contract_shortfall": int(f["contract_shortfall"])})
            excess = int(np.count_nonzero(c.good & ~c.inside & (c.tenant == k)))
        else:
            excess = sum(1 for r in lines if r["tenant"] == t.name and line_good(r, bounds[t.name]))
        row["excess_goodput_rps"] = round(excess / duration, 4)
    run.update({"contracts": int(overall["contracts"]), "contracts_met": int(overall["contracts_met"]),
                "contract_shortfall": int(overall["contract_shortfall"]),
                "jain_share": round(overall["jain_share"], 4)})


def run_series(decisions: list[dict[str, Any]], lines: list[dict[str, Any]], sc: Scenario,
               duration: float, bin_s: float = BIN_S, judged_from_unix: float | None = None) -> dict[str, Any]:
    """One run's time series, in seconds from its first request's arrival at the gateway: each tenant's limit
    after every decision (the decision before the traffic at 0 s); each tenant's good completions per ``bin_s``
    (req/s), judged on the gateway's request-log ``lines`` against the scenario's objectives
    (admit.live.protocol's ``line_good``); and where the scenario has contracts, ``contract_attainment``: per
    tenant with one, its target and its in-contract attainment per ``bin_s`` of arrivals (None where none
    arrived in contract) and cumulated from ``judged_from_unix`` (the end of the warm-up; the first arrival
    when None), None before it (its last value is the run's). ``judged_from_s`` is that moment on the series'
    clock (0 without a warm-up)."""
    bounds = {t.name: t.request_bounds for t in sc.control_spec().tenants}
    decided = [d for d in decisions if isinstance(d.get("limits_after"), dict)]
    arrivals = [r["arrival"] for r in lines if r["tenant"] in bounds]
    t0 = min(arrivals) if arrivals else (decided[0]["time"] if decided else 0.0)
    judged_from = t0 if judged_from_unix is None else max(t0, judged_from_unix)
    done = [(r["tenant"], r["arrival"] - t0 + r["e2e_s"]) for r in lines
            if r["tenant"] in bounds and r.get("ttft_s") is not None and line_good(r, bounds[r["tenant"]])]
    n_bins = max(1, math.ceil(max([duration, *(t for _, t in done)]) / bin_s))
    good = {name: [0] * n_bins for name in bounds}
    for name, t in done:
        good[name][min(n_bins - 1, max(0, int(t // bin_s)))] += 1
    out: dict[str, Any] = {
        "t0_unix": round(t0, 3),
        "judged_from_s": round(judged_from - t0, 3),
        "limits": {"t_s": [round(max(0.0, d["time"] - t0), 3) for d in decided],
                   "tenants": {name: [int(d["limits_after"][name]) for d in decided] for name in bounds}},
        "goodput": {"bin_s": bin_s, "t_s": [round(i * bin_s, 3) for i in range(n_bins)],
                    "tenants": {name: [round(c / bin_s, 4) for c in counts] for name, counts in good.items()}},
    }
    if sc.has_contracts:
        c = contract_lines(sc, lines)
        n_arr = max(1, math.ceil(duration / bin_s))
        b = np.clip(((c.arrival - t0) // bin_s).astype(np.int64), 0, n_arr - 1)
        per_bin: dict[str, list[float | None]] = {}
        cumulative: dict[str, list[float | None]] = {}
        for k, t in enumerate(sc.tenants):
            if t.contract is None:
                continue
            mine = c.inside & (c.tenant == k)
            n = np.bincount(b[mine], minlength=n_arr)
            g = np.bincount(b[mine & c.good], minlength=n_arr)
            per_bin[t.name] = [round(float(gi / ni), 4) if ni else None for gi, ni in zip(g, n, strict=True)]
            judged = mine & (c.arrival >= judged_from)  # the warm-up's requests are shown per bin, never counted
            cn = np.cumsum(np.bincount(b[judged], minlength=n_arr))
            cg = np.cumsum(np.bincount(b[judged & c.good], minlength=n_arr))
            cumulative[t.name] = [round(float(gi / ni), 4) if ni else None for gi, ni in zip(cg, cn, strict=True)]
        out["contract_attainment"] = {
            "bin_s": bin_s, "t_s": [round(i * bin_s, 3) for i in range(n_arr)],
            "target": {t.name: t.contract.attainment for t in sc.tenants if t.contract is not None},
            "per_bin": per_bin, "cumulative": cumulative}
    return out


def plot_demo(result: dict[str, Any], path: Path) -> None:
    """One column per policy, the tenants in the same colours throughout and the axes shared, so the columns
    compare at a glance: each tenant's limit over time (top); where the scenario has contracts, each contracted
    tenant's in-contract attainment (middle: cumulated from the end of the warm-up as a line, whose end is the
    table's figure, per bin of arrivals as dots) under its target (dashed: a line that ends below its target is a
    broken contract); and each tenant's goodput per bin (bottom). A grey band is the warm-up (``warmup_s``), a
    dotted line the end of the arrivals, after which the requests in flight finish."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {p: r for p, r in result["runs"].items() if "series" in r}
    warmup = float(result.get("warmup_s", 0.0))
    if not runs:
        raise ValueError("no run in the result has a time series to draw (written by an older admit demo?)")
    with_contracts = bool(result.get("contracts")) and all("contract_attainment" in r["series"] for r in runs.values())
    rows = 3 if with_contracts else 2
    fig, axes = plt.subplots(rows, len(runs), figsize=(4.2 * len(runs), 2.8 * rows + 0.4), dpi=100, sharex=True,
                             sharey="row", squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    labels = result.get("labels", {})
    for col, (pol, run) in enumerate(runs.items()):
        lim, gp = run["series"]["limits"], run["series"]["goodput"]
        top, bottom = axes[0][col], axes[rows - 1][col]
        for i, name in enumerate(gp["tenants"]):
            c = colours[i % len(colours)]
            if lim["t_s"]:
                end = max(lim["t_s"][-1], gp["t_s"][-1] + gp["bin_s"])
                top.step([*lim["t_s"], end], [*lim["tenants"][name], lim["tenants"][name][-1]], where="post",
                         color=c, label=name)
            bottom.step([*gp["t_s"], gp["t_s"][-1] + gp["bin_s"]], [*gp["tenants"][name], gp["tenants"][name][-1]],
                        where="post", color=c, label=name)
        name = _label(pol, labels)
        if with_contracts:
            ca = run["series"]["contract_attainment"]
            mid = axes[1][col]
            for i, tenant in enumerate(gp["tenants"]):
                if tenant not in ca["target"]:
                    continue
                c = colours[i % len(colours)]
                centres = [t + ca["bin_s"] / 2 for t in ca["t_s"]]
                ends = [t + ca["bin_s"] for t in ca["t_s"]]
                cum = [np.nan if v is None else v for v in ca["cumulative"][tenant]]
                mid.plot(ends, cum, color=c, marker="", linewidth=1.8, label=f"{tenant}, so far")
                dots = [np.nan if v is None else v for v in ca["per_bin"][tenant]]
                mid.plot(centres, dots, color=c, linestyle="", marker="o", markersize=3, alpha=0.5)
                mid.axhline(ca["target"][tenant], color=c, linestyle="--", linewidth=1)
            top.set_title(f"{name}\ncontracts kept {run['contracts_met']} of {run['contracts']}, "
                          f"{run['goodput_rps']:.3f} good req/s", fontsize=10)
        else:
            top.set_title(f"{name}: {run['goodput_rps']:.3f} good req/s", fontsize=10)
        bottom.set_xlabel("seconds from the first request")
        for r in range(rows):
            axes[r][col].axvline(warmup + result["duration_s"], color="gray", linestyle=":", linewidth=1)  # the last
            if run["series"].get("judged_from_s", 0.0) > 0:  # the warm-up: played, never judged
                axes[r][col].axvspan(0.0, run["series"]["judged_from_s"], color="gray", alpha=0.12, linewidth=0,
                                     label="warm-up (not judged)" if r == 0 else None)
            axes[r][col].grid(alpha=0.3)
    for r in range(rows):  # once every column is drawn: the rows share their y axis, which autoscales to all
        if with_contracts and r == 1:
            axes[r][0].set_ylim(-0.03, 1.03)
        else:
            axes[r][0].set_ylim(bottom=0)
    axes[0][0].set_ylabel("concurrency limit")
    if with_contracts:
        axes[1][0].set_ylabel("in-contract attainment\n(line: so far; dots: per bin;\ndashed: target)")
    axes[rows - 1][0].set_ylabel(f"goodput, req/s per {runs[next(iter(runs))]['series']['goodput']['bin_s']:g} s")
    axes[0][0].legend(fontsize=8, loc="best")
    what = "" if with_contracts else "; the scenario has no contracts"
    fig.suptitle(f"admit demo: {result['scenario']}, the same {result['requests']} requests for every policy "
                 f"(seed {result['seed']}, {result['backend']}{what})", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m admit.live.demo DEMO.json OUT.png  (draws a saved `admit demo` result)")
    plot_demo(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
