"""Benchmark: what a family's contract check (envs/family.py `_contracted`) costs a training env.

One tenant-set training env (admit.train.worlds.SetEnv) on h200-mix + h200-shift + h200-drift with the
contract-first reward runs whole episodes, every step holding the limits, on the same episode seeds with the
check on (the families as shipped) and off (`contracts.check_seeds: 0`), interleaved, each drawing its instance
(the env's instance cache cleared first). Printed per side: the
mean reset time (the instance's draw and check included), the mean episode time and the env steps per second
of the env alone (no policy, no update: a training run pays this share, see docs/BENCHMARKS.md).

    python benchmarks/family_contract_check.py --episodes 16
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from admit.agents import set_codec
from admit.envs import family
from admit.train import worlds
from admit.train.worlds import SetEnv, Worlds

FAMILIES = ("h200-mix", "h200-shift", "h200-drift")
REWARD = {"throughput": 0, "goodput": 1, "slo_violation": 0, "drop": 0, "contract_miss": 4}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=16, help="episodes per side")
    args = ap.parse_args()
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
