"""What not knowing the traffic at the start costs: static:contract's own caps, reached late.

static:contract's caps are searched on episodes of the very scenario a table judges (on other seeds), and it
sets them from the first decision. A policy that is told nothing about the scenario has to learn the traffic
from what it sees, and until then runs on something else. This measures the least that costs: a policy that
holds the scenario's initial limits (the operator's, where every run starts) for its first ``T`` seconds and
then walks to static:contract's caps, exactly as static:contract does from t = 0, at most ``max_step`` a
decision. It is an oracle that knows the tuned caps after ``T`` seconds; a policy that must find them from
what it sees does no better, unless it runs on something better than the operator's limits meanwhile.
``--meanwhile POLICY`` runs that policy (one that uses no tuned caps, e.g. ``contract``) before ``T`` instead.

Per table and ``T``: this late oracle against static:contract with RESULTS' verdict rule
(evaluate/results.py ``verdict_against``: it must keep every contract static:contract keeps and its goodput
must not be lower at p < 0.05, paired by seed), on RESULTS' seeds, so static:contract's row is RESULTS' own.
Where the late oracle loses at ``T``, no policy that spends its first ``T`` seconds on the operator's limits
can meet RESULTS' bar there, however well it learns afterwards.

    python benchmarks/learning_cost.py [--scenario NAME ...] [--delay 30 --delay 60 ...] [--seeds 20]
        [--workers 2] [--meanwhile hold|POLICY] [--json OUT]

Without ``--scenario``, every table of docs/RESULTS.md whose tenants have contracts.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from admit.agents.registry import make_controller
from admit.core.observation import Observation
from admit.core.spec import ControlSpec
from admit.envs.contracts import contract_json
from admit.envs.rollout import Episode, rollout
from admit.envs.scenario import load_scenario
from admit.evaluate.offline import Evaluation
from admit.evaluate.results import contracted, uses_tuned_caps, verdict_against

BASE = "static:contract"
RESULTS_DIR = Path(__file__).resolve().parent.parent / "docs" / "results"
DELAYS = (30.0, 60.0, 120.0, 300.0)


HOLD = "hold"  # the meanwhile policy that leaves the limits where they are: the operator's, the scenario's initial


class Late:
    """Acts as ``meanwhile`` (None: holds the limits as they are) until ``delay_s``, then as ``inner``."""

    def __init__(self, inner: Any, delay_s: float, meanwhile: Any | None = None) -> None:
        self.inner, self.delay_s, self.meanwhile = inner, delay_s, meanwhile
        self.name = f"{BASE} after {delay_s:g} s"

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self.inner.reset(spec, seed)
        if self.meanwhile is not None:
            self.meanwhile.reset(spec, seed)

    def act(self, obs: Observation) -> list[int]:
        if obs.time_s < self.delay_s:
            return [0] * obs.n_tenants if self.meanwhile is None else list(self.meanwhile.act(obs))
        return list(self.inner.act(obs))


def label(delay_s: float | None) -> str:
    return BASE if delay_s is None else f"{BASE} after {delay_s:g} s"


def episode(job: tuple[str, float | None, int, str]) -> Episode:
    scenario, delay_s, seed, meanwhile = job
    sc = load_scenario(scenario)
    ctrl = make_controller(BASE, sc)
    if delay_s is not None:
        ctrl = Late(ctrl, delay_s, None if meanwhile == HOLD else make_controller(meanwhile, sc))
    return rollout(sc, ctrl, seed, name=label(delay_s))


def table(scenario: str, delays: list[float], seeds: int, workers: int, meanwhile: str = HOLD) -> dict[str, Any]:
    """RESULTS' JSON shape for static:contract and its late versions on ``scenario``, seeds 0..seeds-1."""
    sc = load_scenario(scenario)
    cases: list[float | None] = [None, *delays]
    jobs = [(scenario, d, s, meanwhile) for d in cases for s in range(seeds)]
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as ex:
            eps = list(ex.map(episode, jobs, chunksize=max(1, len(jobs) // (4 * workers))))
    else:
        eps = [episode(j) for j in jobs]
    names = [label(d) for d in cases]
    per_seed = {n: eps[k * seeds:(k + 1) * seeds] for k, n in enumerate(names)}
    return Evaluation(sc.name, list(range(seeds)), names, per_seed, sc.horizon_s,
                      contracts=contract_json(sc)).to_json()


def row(scenario: str, data: dict[str, Any], delays: list[float]) -> tuple[str, dict[str, Any]]:
    b = data["policies"][BASE]
    cells, figures = [], {}
    for d in delays:
        e = data["policies"][label(d)]
        v = verdict_against(data, label(d), BASE)
        ratio = e["goodput_rps"]["mean"] / b["goodput_rps"]["mean"] if b["goodput_rps"]["mean"] else float("nan")
        met = f"{_met(e)}/{int(e['contracts']['mean'])}"
        cells.append(f"{v.outcome} ({ratio:.3f}×, {met}, p = {e['p_value_vs_first']['goodput_rps']:.2g})")
        figures[f"{d:g}"] = {"verdict": v.outcome, "ratio": round(ratio, 4), "contracts_met": _met(e),
                             "p_goodput": e["p_value_vs_first"]["goodput_rps"], "reasons": list(v.reasons)}
    line = f"| {scenario} | {b['goodput_rps']['mean']:.3f}, {_met(b)}/{int(b['contracts']['mean'])} | " + \
        " | ".join(cells) + " |"
    return line, figures


def _met(entry: dict[str, Any]) -> int:
    """Contracts met on the table: the tenants whose mean in-contract attainment reaches the promise."""
    return sum(1 for t in entry["tenants"].values()
               if "contract" in t and t["contract_attainment"]["mean"] >= t["contract"]["attainment"] - 1e-9)


def results_tables() -> list[str]:
    """The tables of docs/RESULTS.md whose tenants have contracts, in its order."""
    names = [d["scenario"] for p in RESULTS_DIR.glob("*.json") if "scenario" in (d := json.loads(p.read_text()))]
    order = (RESULTS_DIR.parent / "RESULTS.md").read_text()
    return sorted((n for n in names if contracted(n)), key=lambda n: order.find(f"## {n}\n"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", action="append", help="a table (repeat); default: RESULTS' tables with contracts")
    ap.add_argument("--delay", action="append", type=float, help=f"seconds (repeat); default {DELAYS}")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--meanwhile", default=HOLD, help="the policy before T: 'hold' (the operator's limits, the "
                    "default) or a policy name that uses no tuned caps, e.g. contract")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    scenarios = args.scenario or results_tables()
    delays = sorted(args.delay or DELAYS)
    if any(d <= 0 for d in delays):
        ap.error(f"--delay must be > 0 seconds, got {delays}")
    if args.meanwhile != HOLD and uses_tuned_caps(args.meanwhile):
        ap.error(f"--meanwhile {args.meanwhile} uses tuned caps; the point is a policy that has none")
    before = "the operator's limits" if args.meanwhile == HOLD else args.meanwhile
    print(f"static:contract's caps reached after T seconds of {before}, against static:contract itself "
          f"({args.seeds} seeds, RESULTS' verdict rule): verdict (goodput ratio, contracts met, p)\n")
    print("| table | static:contract goodput, met | " + " | ".join(f"T = {d:g} s" for d in delays) + " |")
    print("|---|---|" + "---|" * len(delays))
    out: dict[str, Any] = {}
    for s in scenarios:
        line, figures = row(s, table(s, delays, args.seeds, args.workers, args.meanwhile), delays)
        print(line, flush=True)
        out[s] = figures
    for d in delays:
        lost = [s for s in scenarios if out[s][f"{d:g}"]["verdict"] == "loses"]
        print(f"\nT = {d:g} s: loses on {len(lost)} of {len(scenarios)} tables"
              + (f" ({', '.join(lost)})" if lost else ""))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
