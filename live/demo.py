"""`admit demo`: the live stack on a workload whose tenants interfere, the strongest static caps against the
adaptive policies, per-tenant goodput.

On 127.0.0.1, for each policy on a fresh emulator (the scenario's preset, so no KV or prefix cache carries
over between runs): a gateway with the scenario's tenants, limits, queues and SLOs, `admit control` driving
it with the policy, and `admit loadgen` replaying the same requests — the scenario's draws for ``--seed``,
cut to ``--duration`` seconds (admit.live.sim2live's trace replay). The default scenario is
long-context-chat: a long-context tenant (prompts of thousands up to 100k tokens) beside an interactive chat
tenant, where the scenario's default caps thrash the KV cache.

The default policies: ``static:best`` (per-tenant caps tuned for goodput offline on seeds 900000–900004,
shipped in agents/pretrained/static-best/; never the demo's seed), the best hand-written controller on this scenario
in docs/RESULTS.md (``ledger:best``), and ``ppo:general`` (the one learned policy for every scenario, acting
around static:best's caps) when it is shipped. A request is good when it completes within every per-request
objective of its tenant (the load generator checks them as the simulator does); a tenant's attainment is its
good requests over all its arrivals. Every process is stopped on exit, error, Ctrl-C or SIGTERM.

Besides the totals, each run records its time series (``series``): every tenant's limit after each decision
of the loop, and every tenant's goodput per ``BIN_S`` seconds of completions, as the gateway judged them
(its request log: its own TTFT and e2e, from its arrival, against the tenant's objectives; the totals are the
load generator's, from its send). ``plot_demo`` draws them, one column per policy, next to the JSON
(``python -m admit.live.demo DEMO.json OUT.png`` draws a saved one).
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from admit.core.slo import is_good, tpot
from admit.envs.scenario import Scenario, TokenEngineConfig, load_scenario
from admit.live.run import read_request_log, run_live
from admit.live.sim2live import gateway_config, load_config, replay_requests, write_trace
from admit.live.stack import Stack, wait_idle
from rich.console import Console
from rich.table import Table

SCENARIO = "long-context-chat"
POLICIES = ("static:best", "ledger:best", "ppo:general")
BIN_S = 5.0  # the goodput series counts good completions per bin of this many seconds


def policy_loads(policy: str, scenario: str) -> str | None:
    """None if ``policy`` can be built and reset on ``scenario``'s control spec, else why not."""
    try:
        from admit.agents.registry import make_controller

        sc = load_scenario(scenario)
        make_controller(policy, scenario=sc).reset(sc.control_spec(), 0)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _fmt(v: float | None, digits: int = 2) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def print_table(result: dict[str, Any], console: Console) -> None:
    runs = result["runs"]
    table = Table(title=f"admit demo: {result['scenario']}, {result['requests']} requests over "
                        f"{result['duration_s']:g} s, the same for every policy (seed {result['seed']})")
    for col in ("policy", "tenant", "arrived", "good", "goodput req/s", "attainment", "TTFT p99 s", "e2e p99 s",
                "drops", "mean limit"):
        table.add_column(col, justify="left" if col in ("policy", "tenant") else "right", no_wrap=True)
    for pol, run in runs.items():
        first = True
        for name, t in run["tenants"].items():
            lim = t["limits"]
            table.add_row(pol if first else "", name, str(t["scheduled"]), str(t["good"]), _fmt(t["goodput_rps"], 3),
                          _fmt(t["attainment"], 3), _fmt(t["ttft_p99_s"]), _fmt(t["e2e_p99_s"]),
                          str(t["ttl_expired"] + t["queue_full"]), _fmt(sum(lim) / len(lim) if lim else None, 1))
            first = False
        tot = run["tenants"].values()
        sched = sum(t["scheduled"] for t in tot)
        good = sum(t["good"] for t in tot)
        table.add_row("", "all", str(sched), str(good), _fmt(good / run["duration_s"], 3),
                      _fmt(good / sched if sched else None, 3), _fmt(run["ttft_p99_s"]), _fmt(run["e2e_p99_s"]),
                      str(sum(t["ttl_expired"] + t["queue_full"] for t in tot)), "", end_section=True)
    console.print(table)
    base = next(iter(runs))
    g0 = runs[base]["goodput_rps"]
    for pol, run in list(runs.items())[1:]:
        ratio = f"{run['goodput_rps'] / g0:.3f}×" if g0 else "—"
        console.print(f"{pol}: goodput {run['goodput_rps']:.3f} req/s against {base}'s {g0:.3f} ({ratio}); "
                      "one seed, live: docs/RESULTS.md has the 20-seed verdicts")


def run_demo(scenario: str, duration: float, policies: list[str], out: Path, seed: int, workdir: Path | None,
             console: Console, backend: str | None = None) -> dict[str, Any]:
    """``backend``: a running real vLLM server in place of a fresh emulator per policy (the requests are then
    written as live/fidelity_real.py writes them: numbered, so its prefix cache serves none, and the policies
    run one after another on one server, each once it is idle)."""
    sc = load_scenario(scenario, horizon_s=duration)
    if not isinstance(sc.engine, TokenEngineConfig):
        raise ValueError(f"the demo needs a token-engine scenario (the emulator runs the token engine); "
                         f"{scenario} has a {sc.engine.kind} engine")
    notes, chosen = [], []
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
                                  f"{len(requests)} requests over {duration:g} s ...")
                    target = stack.emulator("--preset", sc.engine.preset, "--seed", str(seed))
                else:
                    from admit.live import fidelity_real

                    fidelity_real.write_trace(sc, requests, trace)
                    load = fidelity_real.real_load_config(sc, trace)
                    wait_idle(backend)
                    console.print(f"{pol}: real vLLM at {backend} + gateway + control loop + admit loadgen, "
                                  f"{len(requests)} requests over {duration:g} s ...")
                    target = backend
                runs[pol] = run_live(stack, target, "live", gateway_config(sc), load, pol,
                                     sc.interval_s, scenario=scenario, start_on_traffic=True)
                lines = read_request_log(Path(runs[pol]["workdir"]) / "requests.jsonl", 0.0)
                runs[pol]["series"] = run_series(runs[pol].pop("decision_log", []), lines, sc, duration)
    result = {"scenario": scenario, "duration_s": duration, "seed": seed, "requests": len(requests),
              "policies": chosen, "notes": notes, "runs": runs,
              "backend": "admit emulate" if backend is None else f"vLLM at {backend}"}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result, console)
    png = out.with_suffix(".png")
    plot_demo(result, png)
    console.print(f"wrote {out} and {png}")
    return result


def run_series(decisions: list[dict[str, Any]], lines: list[dict[str, Any]], sc: Scenario,
               duration: float, bin_s: float = BIN_S) -> dict[str, Any]:
    """One run's time series, in seconds from its first request's arrival at the gateway: each tenant's limit
    after every decision (the decision before the traffic at 0 s) and each tenant's good completions per
    ``bin_s`` (req/s), judged on the gateway's request-log ``lines`` against the scenario's objectives."""
    bounds = {t.name: t.request_bounds for t in sc.control_spec().tenants}
    decided = [d for d in decisions if isinstance(d.get("limits_after"), dict)]
    arrivals = [r["arrival"] for r in lines if r["tenant"] in bounds]
    t0 = min(arrivals) if arrivals else (decided[0]["time"] if decided else 0.0)
    done = [(r["tenant"], r["arrival"] - t0 + r["e2e_s"]) for r in lines
            if r["tenant"] in bounds and r["outcome"] == "ok" and r.get("ttft_s") is not None
            and r.get("e2e_s") is not None
            and is_good(r["ttft_s"], tpot(r["e2e_s"], r["ttft_s"], r.get("output_tokens") or 0), r["e2e_s"],
                        bounds[r["tenant"]])]
    n_bins = max(1, math.ceil(max([duration, *(t for _, t in done)]) / bin_s))
    good = {name: [0] * n_bins for name in bounds}
    for name, t in done:
        good[name][min(n_bins - 1, max(0, int(t // bin_s)))] += 1
    return {
        "t0_unix": round(t0, 3),
        "limits": {"t_s": [round(max(0.0, d["time"] - t0), 3) for d in decided],
                   "tenants": {name: [int(d["limits_after"][name]) for d in decided] for name in bounds}},
        "goodput": {"bin_s": bin_s, "t_s": [round(i * bin_s, 3) for i in range(n_bins)],
                    "tenants": {name: [round(c / bin_s, 4) for c in counts] for name, counts in good.items()}},
    }


def plot_demo(result: dict[str, Any], path: Path) -> None:
    """One column per policy: each tenant's limit over time (top) and its goodput per bin (bottom), the
    tenants in the same colours throughout and the axes shared, so the columns compare at a glance; a dotted
    line marks the end of the arrivals (``duration_s``), after which the requests in flight finish."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {p: r for p, r in result["runs"].items() if "series" in r}
    if not runs:
        raise ValueError("no run in the result has a time series to draw (written by an older admit demo?)")
    fig, axes = plt.subplots(2, len(runs), figsize=(4.2 * len(runs), 5.6), dpi=100, sharex=True, sharey="row",
                             squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for col, (pol, run) in enumerate(runs.items()):
        lim, gp = run["series"]["limits"], run["series"]["goodput"]
        top, bottom = axes[0][col], axes[1][col]
        for i, name in enumerate(gp["tenants"]):
            c = colours[i % len(colours)]
            if lim["t_s"]:
                end = max(lim["t_s"][-1], gp["t_s"][-1] + gp["bin_s"])
                top.step([*lim["t_s"], end], [*lim["tenants"][name], lim["tenants"][name][-1]], where="post",
                         color=c, label=name)
            bottom.step([*gp["t_s"], gp["t_s"][-1] + gp["bin_s"]], [*gp["tenants"][name], gp["tenants"][name][-1]],
                        where="post", color=c, label=name)
        top.set_title(f"{pol}: {run['goodput_rps']:.3f} good req/s", fontsize=10)
        bottom.set_xlabel("seconds from the first request")
        for ax in (top, bottom):
            ax.axvline(result["duration_s"], color="gray", linestyle=":", linewidth=1)  # the last arrival
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("concurrency limit")
    axes[1][0].set_ylabel(f"goodput, req/s per {runs[next(iter(runs))]['series']['goodput']['bin_s']:g} s")
    axes[0][0].legend(fontsize=8, loc="best")
    fig.suptitle(f"admit demo: {result['scenario']}, the same {result['requests']} requests for every policy "
                 f"(seed {result['seed']}, {result['backend']})", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m admit.live.demo DEMO.json OUT.png  (draws a saved `admit demo` result)")
    plot_demo(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
