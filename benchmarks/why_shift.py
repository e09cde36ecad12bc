"""What lending to a tenant while another is idle buys on session traffic (h200-shift), against static:best.

The tuned caps of an instance are a compromise over its phases: when a session tenant goes idle, a tenant held
below its demand to protect it could take more. This sweeps the simplest rule that acts on that: for one pair
(borrower ``i``, lender ``j``) at a time, while ``j`` is idle (its window's arrival rate under 15 % of the highest
it has shown, decayed by 0.1 % a decision, and nothing queued), ``i``'s target is its static:best cap times
``F``; otherwise every tenant holds its cap. Borrowers are the tenants whose cap is below 64 (a cap of 64 or
more rarely binds here). Per instance it prints every pair's mean goodput difference to static:best (paired
by seed), the Wilcoxon p and the largest fall of any tenant's attainment (a win needs it above −0.01), and
then the best pair that would win by the verdict's rule, if any. Seeds 1000.. (disjoint from RESULTS' 0..19
and from static:best's tuning seeds).

    python benchmarks/why_shift.py --scenario h200-shift@10001 --scenario h200-shift@10002 [--seeds 6]
        [--factor 2 --factor 4 --factor 8] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
from admit.agents.static_best import BestStatic
from admit.core.observation import Observation
from admit.core.spec import ControlSpec
from admit.envs.compiled import make_simulation
from admit.envs.scenario import load_scenario
from admit.evaluate.offline import paired_p

SEED0 = 1000
IDLE_SHARE = 0.15  # under this share of its recent peak rate (and nothing queued), a tenant counts as idle
DECAY = 0.999  # per decision: the peak rate's memory (~17 minutes' half-life at 2 s decisions)
BORROWER_MAX_CAP = 64


class PairLend:
    """Hold the tuned caps; while tenant ``lender`` is idle, raise ``borrower``'s target to cap × ``factor``."""

    name = "pair-lend"

    def __init__(self, caps: list[int], borrower: int, lender: int, factor: float) -> None:
        self.caps, self.i, self.j, self.factor = list(caps), borrower, lender, factor
        self.k, self.hi, self.peak = 1, 1, 0.0

    def reset(self, spec: ControlSpec, seed: int | None = None) -> None:
        self.k, self.hi, self.peak = spec.limits.max_step, spec.limits.max, 0.0

    def act(self, obs: Observation) -> list[int]:
        lender = obs.tenants[self.j]
        rate = lender.arrivals / obs.window_s
        self.peak = max(self.peak * DECAY, rate)
        targets = list(self.caps)
        if rate < IDLE_SHARE * self.peak and lender.queue_depth == 0:
            c = self.caps[self.i]
            targets[self.i] = min(self.hi, max(c + 1, round(c * self.factor)))
        return [max(-self.k, min(self.k, t - int(o.limit))) for t, o in zip(targets, obs.tenants, strict=True)]


def episode(args: tuple[str, tuple[int, int, float] | None, int]) -> tuple[float, list[float]]:
    name, pair, seed = args
    sc = load_scenario(name)
    best = BestStatic(sc)
    best.reset(sc.control_spec(), seed)
    ctrl: Any = best if pair is None else PairLend(list(best.cap), *pair)
    ctrl.reset(sc.control_spec(), seed)
    sim = make_simulation(sc, seed)
    sim.run(ctrl)
    return sim.summary()["goodput_rps"], [v["attainment"] for v in sim.tenant_summary().values()]


def sweep(name: str, seeds: int, factors: list[float], pool: ProcessPoolExecutor) -> dict[str, Any]:
    sc = load_scenario(name)
    best = BestStatic(sc)
    best.reset(sc.control_spec(), SEED0)  # tunes (and caches) the caps once, before the workers need them
    caps = list(best.cap)
    runs = range(SEED0, SEED0 + seeds)
    base = list(pool.map(episode, [(name, None, s) for s in runs]))
    g0 = [b[0] for b in base]
    a0 = np.array([b[1] for b in base])
    n = len(caps)
    rows = []
    for i in (i for i in range(n) if caps[i] < BORROWER_MAX_CAP):
        for j in (j for j in range(n) if j != i):
            for f in factors:
                eps = list(pool.map(episode, [(name, (i, j, f), s) for s in runs]))
                g1 = [e[0] for e in eps]
                drop = float((np.array([e[1] for e in eps]) - a0).mean(axis=0).min())
                diff = float(np.mean(g1) - np.mean(g0))
                rows.append({"borrower": sc.tenants[i].name, "lender": sc.tenants[j].name, "factor": f,
                             "goodput_diff": diff, "relative": diff / float(np.mean(g0)), "p": paired_p(g1, g0),
                             "worst_attainment_drop": drop})
    winners = [r for r in rows if r["goodput_diff"] > 0 and r["p"] < 0.05 and r["worst_attainment_drop"] > -0.01]
    return {"scenario": name, "caps": caps, "static_best_goodput": float(np.mean(g0)), "pairs": rows,
            "best_winner": max(winners, key=lambda r: r["goodput_diff"]) if winners else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", action="append", required=True)
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--factor", type=float, action="append")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    factors = args.factor or [2.0, 4.0, 8.0]
    with ProcessPoolExecutor(args.workers) as pool:
        for name in args.scenario:
            out = sweep(name, args.seeds, factors, pool)
            print(f"{name}: static:best {out['static_best_goodput']:.3f} req/s, caps {out['caps']}")
            for r in out["pairs"]:
                print(f"  lend {r['borrower']} x{r['factor']:g} while {r['lender']} idles: "
                      f"{r['goodput_diff']:+.3f} req/s ({100 * r['relative']:+.2f} %), p = {r['p']:.2g}, "
                      f"worst tenant {r['worst_attainment_drop']:+.3f}")
            print("  best winning pair:", json.dumps(out["best_winner"]))


if __name__ == "__main__":
    main()
