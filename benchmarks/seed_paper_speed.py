"""Benchmark: admit's simulator vs a straightforward SimPy implementation of the same slot model.

Measures, in one run on one core:
1. env steps per second through the Gymnasium API (random actions, seed-paper);
2. the wall time of the whole seed-paper table (3 policies × 20 seeds × 1800 s) with admit's simulator;
3. the same table with a SimPy model of the same world (same arrivals and service draws, same controllers
   acting on the same Observation type), and the ratio.
The two implementations' mean results are printed side by side so one can see they model the same thing.

    python benchmarks/seed_paper_speed.py [--seeds 20] [--repeat 3]
"""

from __future__ import annotations

import argparse
import math
import time
from collections import deque

import numpy as np
import simpy
from admit.controllers.registry import make_controller
from admit.core.observation import NO_SLO, Observation, TenantObservation
from admit.core.percentiles import linear_np, linear_np_many
from admit.envs.env import TenantAdmissionEnv
from admit.envs.scenario import load_scenario
from admit.envs.simulation import episode_metrics
from admit.envs.workload import draw_tenant
from admit.evaluate.offline import rollout

POLICIES = ("static", "naive", "differentiated")


# ----------------------------------------------------------------------------- the SimPy version
class _Tenant:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0
        self.waiting: deque = deque()
        self.done: list[tuple[float, float, float]] = []  # (finish time, e2e, wait)
        self.arrivals: list[float] = []
        self.drops: list[float] = []
        self.dropped = 0
        self.completed = 0


def simpy_rollout(sc, policy: str, seed: int) -> dict[str, float]:
    env = simpy.Environment()
    n = len(sc.tenants)
    streams = np.random.SeedSequence(seed).spawn(n)
    draws = [
        draw_tenant(t.arrival, t.prompt_tokens, t.output_tokens, np.random.default_rng(s), sc.horizon_s)
        for t, s in zip(sc.tenants, streams, strict=True)
    ]
    tenants = [_Tenant(sc.limits.initial) for _ in range(n)]
    mean = sc.engine.mean_service_s
    timeout = sc.admission.queue_timeout_s
    e2e_all: list[list[float]] = [[] for _ in range(n)]

    def wake(t: _Tenant) -> None:
        while t.waiting and t.in_flight < t.limit:
            ev = t.waiting.popleft()
            t.in_flight += 1
            ev.succeed()

    def request(k: int, u: float):
        t = tenants[k]
        t0 = env.now
        t.arrivals.append(t0)
        if t.in_flight < t.limit and not t.waiting:
            t.in_flight += 1
        else:
            ev = env.event()
            t.waiting.append(ev)
            res = yield ev | env.timeout(timeout)
            if ev not in res:
                t.waiting.remove(ev)
                t.dropped += 1
                t.drops.append(env.now)
                return
        wait = env.now - t0
        yield env.timeout(-mean * math.log(1.0 - u))
        t.in_flight -= 1
        t.completed += 1
        t.done.append((env.now, env.now - t0, wait))
        e2e_all[k].append(env.now - t0)
        wake(t)

    def source(k: int):
        d = draws[k]
        for at, u in zip(d.times, d.u_service, strict=True):
            yield env.timeout(at - env.now)
            env.process(request(k, u))

    spec = sc.control_spec()
    ctrl = make_controller(policy)
    ctrl.reset(spec, seed)
    lim = spec.limits

    def observe() -> Observation:
        now, w = env.now, sc.window_s
        obs_t = []
        for t, ts in zip(tenants, spec.tenants, strict=True):
            recent = [x for x in t.done if x[0] > now - w]
            # percentiles.LINEAR, by numpy (the simulator's own windows compute the same in pure Python)
            e2e = linear_np_many([x[1] for x in recent], [50, 95, 99]) if recent else [0.0] * 3
            wq = linear_np([x[2] for x in recent], 99) if recent else 0.0
            obs_t.append(
                TenantObservation(
                    queue_depth=len(t.waiting),
                    in_flight=t.in_flight,
                    limit=t.limit,
                    arrivals=sum(1 for a in t.arrivals if a > now - w),
                    completions=len(recent),
                    drops=sum(1 for a in t.drops if a > now - w),
                    e2e_p50=e2e[0],
                    e2e_p95=e2e[1],
                    e2e_p99=e2e[2],
                    ttft_p50=0.0,
                    samples=len(recent),
                    queue_wait_p99=wq,
                    slo_e2e_p99=ts.slo_e2e_p99_s if ts.slo_e2e_p99_s < math.inf else NO_SLO,
                )
            )
        busy = sum(t.in_flight for t in tenants)
        return Observation(now, w, busy / sc.engine.slots, busy, 0, obs_t)

    def control():
        while True:
            deltas = ctrl.act(observe())
            for t, d in zip(tenants, deltas, strict=True):
                t.limit = lim.clamp(t.limit + d)
                wake(t)
            yield env.timeout(sc.interval_s)

    for k in range(n):
        env.process(source(k))
    env.process(control())
    env.run(until=sc.horizon_s)
    from admit.envs.simulation import TenantTotals

    totals = [
        TenantTotals(arrived=len(t.arrivals), completed=t.completed, dropped=t.dropped, e2e=e2e_all[k])
        for k, t in enumerate(tenants)
    ]
    return episode_metrics(totals, sc.horizon_s)


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
    rollout(sc, "static", 0)
    simpy_rollout(sc, "static", 0)
    admit_runs, simpy_runs = [], []
    for _ in range(args.repeat):  # interleaved, so machine noise hits both sides alike
        admit_runs.append(table(rollout, sc, args.seeds))
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
