"""Benchmark: admit's simulator vs a straightforward SimPy implementation of the same slot model.

Measures, in one run on one core:
1. env steps per second through the Gymnasium API (random actions, seed-paper);
2. the wall time of the whole seed-paper table (3 policies × 20 seeds × 1800 s) with admit's simulator;
3. the same table with the SimPy peer (benchmarks/simpy_peer.py: one process per request, a
   ``simpy.Resource`` gate per tenant, the same arrivals and service draws, the same controllers acting on
   the same Observation type), and the ratio.
The two implementations' mean results are printed side by side so one can see they model the same thing
(tests/test_benchmarks.py checks they agree seed by seed).

    python benchmarks/seed_paper_speed.py [--seeds 20] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from admit.envs.env import TenantAdmissionEnv
from admit.envs.scenario import load_scenario
from admit.evaluate.offline import run_policy
from simpy_peer import simpy_rollout

POLICIES = ("static", "naive", "differentiated")


# ----------------------------------------------------------------------------- measurement
def table(fn, sc, seeds: int) -> tuple[float, dict[str, dict[str, float]]]:
    t0 = time.perf_counter()
    res = {p: [fn(sc, p, s) for s in range(seeds)] for p in POLICIES}
    wall = time.perf_counter() - t0
    means = {
        p: {m: float(np.mean([r[m] for r in rs])) for m in ("throughput_rps", "p99_s", "dropped")}
        for p, rs in res.items()
    }
    return wall, means


def env_steps_per_second(n_steps: int = 20_000) -> float:
    env = TenantAdmissionEnv("seed-paper")
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 3, size=(n_steps, 2))
    env.reset(seed=0)
    for a in actions[:100]:  # load the kernels (numba's cache) before timing
        env.step(a)
    t0 = time.perf_counter()
    for a in actions:
        _, _, _, trunc, _ = env.step(a)
        if trunc:
            env.reset()
    return n_steps / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3, help="take the best of this many timings of each side")
    args = ap.parse_args()
    sc = load_scenario("seed-paper")
    # warm up imports and caches on both sides
    run_policy(sc, "static", 0)
    simpy_rollout(sc, "static", 0)
    admit_runs, simpy_runs = [], []
    for _ in range(args.repeat):  # interleaved, so machine noise hits both sides alike
        admit_runs.append(table(run_policy, sc, args.seeds))
        simpy_runs.append(table(simpy_rollout, sc, args.seeds))
    a_wall = min(w for w, _ in admit_runs)
    s_wall = min(w for w, _ in simpy_runs)
    a_means, s_means = admit_runs[0][1], simpy_runs[0][1]
    sps = env_steps_per_second()
    print(
        f"seed-paper table, {len(POLICIES)} policies × {args.seeds} seeds × {sc.horizon_s:g} s, best of {args.repeat}"
    )
    print(f"  admit simulator : {a_wall:7.3f} s")
    print(f"  SimPy           : {s_wall:7.3f} s")
    print(f"  ratio           : {s_wall / a_wall:7.1f}× faster")
    print(f"env steps/s (Gymnasium API, random actions): {sps:,.0f}")
    print("same model, side by side (mean over seeds):")
    print(
        f"  {'policy':16s} {'admit tput':>10s} {'simpy tput':>10s} {'admit p99':>9s} {'simpy p99':>9s} "
        f"{'admit drops':>11s} {'simpy drops':>11s}"
    )
    for p in POLICIES:
        a, s = a_means[p], s_means[p]
        print(
            f"  {p:16s} {a['throughput_rps']:10.3f} {s['throughput_rps']:10.3f} {a['p99_s']:9.2f} {s['p99_s']:9.2f} "
            f"{a['dropped']:11.1f} {s['dropped']:11.1f}"
        )


if __name__ == "__main__":
    main()
