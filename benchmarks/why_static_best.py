"""Why no adaptive policy beats static:best: what moving a limit away from the tuned caps buys and costs.

Two measurements, on seeds 1000.. (disjoint from RESULTS' 0..19 and from static:best's tuning seeds):

1. **Deviations from the tuned caps** (``--sweep``): on each scenario, static:best against ledger:best
   variants that lend above the caps (``borrow_frac``: the KV share that may be lent; ``healthy_frac``: how
   far under the miss target every latency tenant must be, with confidence, before anything is lent),
   that excuse tenants waiting at their own limit from that check (``own_excused``) and lend only to fresh
   queues (``fresh_only``), or that also cut a tenant without TTFT/TPOT objective below its cap
   (``cut_below``). Per variant: mean goodput, its difference to static:best and the largest drop of any
   tenant's attainment (the verdict's second condition: a win needs it above −0.01).
2. **What a loan costs the others** (``--harm SCENARIO:VICTIM``): under ledger:best with a lending bound of
   10% of the KV cache, every decision's window is binned by the number of requests lent at that moment
   (limits above the caps, summed over tenants, capped at 8) and the victim tenant's share of requests
   over its TTFT objective is read from the window's percentiles, completion-weighted, per bin.

    python benchmarks/why_static_best.py --sweep h200-mix@2 --sweep h200-mix@4 --sweep h200-mix@6 \
        --harm h200-azure-2023:conversation [--seeds 6] [--horizon-s 1800]
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict
from typing import Any

from admit.agents.static_best import BestStatic
from admit.controllers.around import AroundBase
from admit.controllers.ledger import LedgerController
from admit.controllers.slo_bound import share_above
from admit.core.observation import Observation
from admit.envs.compiled import make_simulation
from admit.envs.scenario import Scenario, load_scenario

VARIANTS: list[dict[str, Any]] = [
    {},
    {"borrow_frac": 0.015},
    {"borrow_frac": 0.06},
    {"healthy_frac": 1.0},
    {"own_excused": True, "fresh_only": True},
    {"own_excused": True},
    {"cut_below": True},
]
SEED0 = 1000


def episode(sc: Scenario, ctrl: Any, seed: int) -> tuple[float, dict[str, float]]:
    ctrl.reset(sc.control_spec(), seed)
    sim = make_simulation(sc, seed)
    sim.run(ctrl, name=getattr(ctrl, "name", "x"))
    return sim.summary()["goodput_rps"], {k: v["attainment"] for k, v in sim.tenant_summary().items()}


def mean_run(sc: Scenario, make: Any, seeds: int) -> tuple[float, dict[str, float]]:
    g, att = 0.0, defaultdict(float)
    for s in range(SEED0, SEED0 + seeds):
        gs, a = episode(sc, make(), s)
        g += gs / seeds
        for k, v in a.items():
            att[k] += v / seeds
    return g, dict(att)


def sweep(name: str, seeds: int, horizon: float | None) -> None:
    sc = load_scenario(name) if horizon is None else load_scenario(name, horizon_s=horizon)
    g0, a0 = mean_run(sc, lambda: BestStatic(sc), seeds)
    print(f"\n{name} ({sc.horizon_s:.0f} s, seeds {SEED0}..{SEED0 + seeds - 1})", flush=True)
    print("| variant | goodput req/s | vs static:best | largest attainment drop | tenants' attainment |")
    print("|---|---|---|---|---|")
    cells = " ".join(f"{k} {v:.3f}" for k, v in a0.items())
    print(f"| static:best | {g0:.3f} | — | — | {cells} |", flush=True)
    for kw in VARIANTS:
        g, a = mean_run(sc, lambda kw=kw: AroundBase(LedgerController(**kw), BestStatic(sc)), seeds)
        drop = min(a[k] - a0[k] for k in a)
        label = "ledger:best" + (f" {json.dumps(kw)}" if kw else " (defaults)")
        cells = " ".join(f"{k} {v:.3f}" for k, v in a.items())
        print(f"| {label} | {g:.3f} | {g - g0:+.3f} | {drop:+.3f} | {cells} |", flush=True)


def harm(spec: str, seeds: int, horizon: float | None) -> None:
    name, _, victim = spec.partition(":")
    sc = load_scenario(name) if horizon is None else load_scenario(name, horizon_s=horizon)
    vi = [t.name for t in sc.tenants].index(victim)
    slo = sc.control_spec().tenants[vi].slo_ttft_s
    for label, make in (("static:best", lambda: BestStatic(sc)),
                        ("ledger:best, 10% lendable",
                         lambda: AroundBase(LedgerController(borrow_frac=0.1), BestStatic(sc)))):
        bins: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for s in range(SEED0, SEED0 + seeds):
            ctrl = make()
            ctrl.reset(sc.control_spec(), s)
            caps = list(ctrl.inner.quota) if isinstance(ctrl, AroundBase) else list(ctrl.cap)
            inner = ctrl.act

            def act(obs: Observation, inner: Any = inner, caps: list[int] = caps, bins: Any = bins) -> list[int]:
                lent = sum(max(0, int(t.limit) - c) for t, c in zip(obs.tenants, caps, strict=True))
                v = obs.tenants[vi]
                if v.samples > 0:
                    b = bins[min(lent, 8)]
                    b[0] += v.completions
                    b[1] += v.completions * share_above(v.ttft_p50, v.ttft_p95, v.ttft_p99, slo)
                return inner(obs)

            ctrl.act = act
            make_simulation(sc, s).run(ctrl, name=label)
        rows = ", ".join(f"{k} lent: {b[1] / b[0]:.4f} of {b[0]:.0f}" for k, b in sorted(bins.items()) if b[0] > 0)
        print(f"{name} {victim} TTFT miss share by requests lent, {label}: {rows}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="append", default=[], help="scenario for the deviation sweep (repeat)")
    ap.add_argument("--harm", action="append", default=[], help="SCENARIO:VICTIM for the loan's cost (repeat)")
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--horizon-s", type=float, default=None)
    a = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}")
    for name in a.sweep:
        sweep(name, a.seeds, a.horizon_s)
    for spec in a.harm:
        harm(spec, a.seeds, a.horizon_s)


if __name__ == "__main__":
    main()
