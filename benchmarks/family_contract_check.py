"""Benchmark: what a family's contract check (envs/family.py `_contracted`) costs a training env.

One tenant-set training env (admit.train.worlds.SetEnv) on h200-mix + h200-shift + h200-drift with the
contract-first reward runs whole episodes, every step holding the limits, on the same episode seeds with the
check on (the families as shipped) and off (`contracts.check_seeds: 0`), interleaved, each drawing its instance
(the env's instance cache cleared first). Printed per side: the
mean reset time (the instance's draw and check included), the mean episode time and the env steps per second
of the env alone (no policy, no update: a training run pays this share, see docs/BENCHMARKS.md).

    python benchmarks/family_contract_check.py --episodes 16

``--report`` prints instead what the check did to the instances (docs/scenarios.md's figures): per family, over
its first 200 train instances, how many had their rates scaled (and by how much) and how many promises were
lowered or withdrawn; and for the five test instances of each, the scaling, the promises lowered and how many
(seed × tenant) promises the initial caps keep at contract on five seeds the check never ran (900000–900004).

    python benchmarks/family_contract_check.py --report
"""

from __future__ import annotations

import argparse
import collections
import re
import time

import numpy as np
from admit.agents import set_codec
from admit.envs import family
from admit.train import worlds
from admit.train.worlds import SetEnv, Worlds

FAMILIES = ("h200-mix", "h200-shift", "h200-drift")
REWARD = {"throughput": 0, "goodput": 1, "slo_violation": 0, "drop": 0, "contract_miss": 4}


SCALED = re.compile(r"then all by ([0-9.]+)")


def report() -> None:
    """What the check did to the instances (module docstring)."""
    from admit.envs.contracts import kept_at_contract
    from admit.envs.scenario import load_scenario

    for name in FAMILIES:
        fam = family.load_family(name)
        by: collections.Counter[str] = collections.Counter()
        lowered = withdrawn = 0
        for seed in range(fam.seeds.train.first, fam.seeds.train.first + 200):
            desc = family.sample_scenario_data(fam, seed)["description"]
            m = SCALED.search(desc)
            by[m.group(1) if m else "1"] += 1
            lowered += desc.count("promise lowered")
            withdrawn += desc.count("promise withdrawn")
        print(f"{name}, 200 train instances: scaled {200 - by['1']} ({dict(sorted(by.items()))}), "
              f"{lowered} promises lowered, {withdrawn} withdrawn")
    for name in FAMILIES:
        for inst in family.instances(name, "test", 5):
            sc = load_scenario(inst)
            m = SCALED.search(sc.description)
            low = re.findall(r"(\S+)'s promise (lowered to [0-9.]+|withdrawn)", sc.description)
            kept = [kept_at_contract(sc, s) for s in range(900000, 900005)]
            print(f"{inst}: rates x{m.group(1) if m else 1}, lowered {low or '-'}, kept at contract "
                  f"{sum(k for k, _ in kept)}/{sum(n for _, n in kept)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=16, help="episodes per side")
    ap.add_argument("--report", action="store_true", help="what the check did to the instances instead")
    args = ap.parse_args()
    if args.report:
        report()
        return
    shipped = family.load_family

    def unchecked(name: str) -> family.Family:
        fam = shipped(name)
        assert fam.contracts is not None
        return fam.model_copy(update={"contracts": fam.contracts.model_copy(update={"check_seeds": 0})})

    hold = np.full(set_codec.MAX_TENANTS, set_codec.HOLD)
    rows: dict[str, list[tuple[float, float, int]]] = {"on": [], "off": []}
    try:
        for k in range(args.episodes):
            for side in ("on", "off"):
                family.load_family = shipped if side == "on" else unchecked  # type: ignore[assignment]
                env = SetEnv(Worlds(family=FAMILIES, reward=REWARD))
                worlds._instance.cache_clear()  # both sides draw the instance (a training run rarely hits it)
                t0 = time.perf_counter()
                env.reset(seed=5000 + k)
                reset = time.perf_counter() - t0
                steps, done = 0, False
                while not done:
                    _, _, term, trunc, _ = env.step(hold)
                    steps, done = steps + 1, term or trunc
                rows[side].append((reset, time.perf_counter() - t0, steps))
    finally:
        family.load_family = shipped  # type: ignore[assignment]
    for side, label in (("on", "check on (shipped)"), ("off", "check off")):
        r = np.array(rows[side])
        print(f"{label:19s} {len(r)} episodes: reset {r[:, 0].mean() * 1e3:.0f} ms, episode {r[:, 1].mean():.3f} s, "
              f"{r[:, 2].sum() / r[:, 1].sum():,.0f} env steps/s")
    on, off = np.array(rows["on"]), np.array(rows["off"])
    print(f"episode time, on / off: {on[:, 1].sum() / off[:, 1].sum():.2f}")


if __name__ == "__main__":
    main()
