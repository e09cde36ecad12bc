"""Benchmark: the contract controller against static:contract on validation instances (never RESULTS' test
ones), promises first, goodput second.

For each instance (static:contract's caps found in the cache or searched on its tuning seeds 900000–900004,
never the seeds here), each policy runs the same seeds; a promise is kept on an instance when the tenant's
mean in-contract attainment over the seeds reaches it (RESULTS' rule). Printed per instance and in total: the
promises each policy keeps, how many of those static:contract keeps it breaks, and its goodput over
static:contract's (geometric mean over the instances). ``contract:measured-hold`` is the controller with the
hold time as measured on the engine (Little's law on its in-flight and completions) instead of at the target
decode step: the ablation of that choice.

    python benchmarks/contract_validation.py --seeds 200..211
"""

from __future__ import annotations

import argparse
import math
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
from admit.agents.registry import make_controller
from admit.controllers.contract import ContractController
from admit.envs.rollout import rollout
from admit.envs.scenario import load_scenario

INSTANCES = [f"h200-drift@{s}" for s in range(10000, 10008)] + ["h200-mix@10001", "h200-shift@10000"]
POLICIES = ("static:contract", "contract", "contract:measured-hold")


class MeasuredHold(ContractController):
    """The contract controller with the hold time as measured, not at the target decode step."""

    def hold_s(self, i: int) -> float:
        return self.hold[i]


def episode(job: tuple[str, str, int]) -> tuple[str, str, int, float, dict[str, float]]:
    name, policy, seed = job
    sc = load_scenario(name)
    controller = MeasuredHold() if policy == "contract:measured-hold" else make_controller(policy, sc)
    ep = rollout(sc, controller, seed)
    return name, policy, seed, ep["goodput_rps"], {k: v["contract_attainment"] for k, v in ep["tenants"].items()
                                                   if "contract_attainment" in v}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="200..211", help="A..B inclusive")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    a, b = (int(x) for x in args.seeds.split(".."))
    for name in INSTANCES:  # static:contract's caps first (a search where the cache has none), one at a time
        make_controller("static:contract", load_scenario(name))
    jobs = [(n, p, s) for n in INSTANCES for p in POLICIES for s in range(a, b + 1)]
    with ProcessPoolExecutor(args.workers) as pool:
        res = list(pool.map(episode, jobs, chunksize=4))
    kept: dict[str, int] = dict.fromkeys(POLICIES, 0)
    broke: dict[str, int] = dict.fromkeys(POLICIES, 0)
    ratios: dict[str, list[float]] = {p: [] for p in POLICIES}
    total = 0
    for name in INSTANCES:
        promised = {t.name: t.contract.attainment for t in load_scenario(name).tenants if t.contract is not None}
        total += len(promised)
        met: dict[str, set[str]] = {}
        goodput: dict[str, float] = {}
        for p in POLICIES:
            rows = [r for r in res if r[0] == name and r[1] == p]
            goodput[p] = float(np.mean([r[3] for r in rows]))
            met[p] = {t for t in promised if np.mean([r[4][t] for r in rows]) + 1e-9 >= promised[t]}
        cells: list[Any] = [f"{name:18s}"]
        for p in POLICIES:
            lost = len(met["static:contract"] - met[p])
            kept[p] += len(met[p])
            broke[p] += lost
            ratios[p].append(goodput[p] / goodput["static:contract"])
            cells.append(f"{p} {len(met[p])}/{len(promised)}{f' (-{lost})' if lost else ''} {ratios[p][-1]:.3f}x")
        print("  ".join(cells))
    for p in POLICIES:
        g = math.exp(float(np.mean(np.log(ratios[p]))))
        print(f"{p:24s} keeps {kept[p]}/{total}, breaks {broke[p]} static:contract keeps, goodput {g:.3f}x "
              f"(geometric mean; lowest {min(ratios[p]):.3f}x)")


if __name__ == "__main__":
    main()
