"""Where an env step's time goes: cProfile over random-action steps, grouped by the part of admit that spends it.

    python benchmarks/profile_env.py [--scenario h200-mixed --scenario servegen-skewed --scenario h200-mix@11000]
        [--steps 4000] [--top 12]

Per scenario: steps/s without the profiler (the same seeded actions, measured first), then the profiled run's
self time (cProfile's ``tottime``) summed per group — the token engine (engine/), the simulation loop and
its accounting (envs/simulation.py), telemetry windows and percentiles (core/telemetry.py,
core/percentiles.py), building the observation (core/observation.py, envs/env.py), admission queues
(core/admission.py), the workload draws (envs/workload.py, core/workload.py), Gymnasium's own code, and the
rest — and the ``--top`` functions by self time. It profiles the Python world (``world="python"``, the
reference that envs/kernels.py transcribes); the compiled world's kernels are opaque to cProfile, and
benchmarks/env_speed.py measures the two side by side. cProfile adds a roughly constant cost per call, so it
overstates the share of small, often-called functions; the groups still say where a rewrite would pay.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from pathlib import Path

import gymnasium as gym

import admit

GROUPS = (
    ("token engine", ("/engine/",)),
    ("simulation loop", ("/envs/simulation.py",)),
    ("telemetry windows", ("/core/telemetry.py", "/core/percentiles.py")),
    ("observation + env", ("/core/observation.py", "/envs/env.py")),
    ("admission queues", ("/core/admission.py",)),
    ("workload draws", ("/envs/workload.py", "/core/workload.py", "/envs/servegen.py", "/envs/family.py")),
    ("gymnasium", ("/gymnasium/",)),
)


def _group(filename: str) -> str:
    for name, keys in GROUPS:
        if any(k in filename for k in keys):
            return name
    return "python builtins" if filename == "~" else "other"


def _run(scenario: str, steps: int, world: str = "python") -> None:
    import admit.envs  # noqa: F401  (registers the env ids)

    env = gym.make("admit/TenantAdmission-v1", scenario=scenario, world=world)
    env.reset(seed=0)
    env.action_space.seed(0)
    for i in range(steps):
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            env.reset(seed=i + 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", action="append", help="scenario (repeat); default: three")
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    for sc in args.scenario or ["h200-mixed", "servegen-skewed", "h200-mix@11000"]:
        _run(sc, 100)  # warm up: imports, traces, caches
        t0 = time.perf_counter()
        _run(sc, args.steps)
        plain = args.steps / (time.perf_counter() - t0)
        prof = cProfile.Profile()
        prof.enable()
        _run(sc, args.steps)
        prof.disable()
        stats = pstats.Stats(prof)
        raw = stats.stats  # type: ignore[attr-defined]  # {(file, line, func): (cc, nc, tt, ct, callers)}
        by: dict[str, float] = {}
        for (filename, _, _), (_, _, tt, _, _) in raw.items():
            by[_group(filename)] = by.get(_group(filename), 0.0) + tt
        total = sum(by.values())
        print(f"\n{sc}: {plain:,.0f} env steps/s unprofiled (random actions, {args.steps} steps); profiled self time:")
        for name, tt in sorted(by.items(), key=lambda x: -x[1]):
            print(f"  {name:20s} {100 * tt / total:5.1f} %")
        top = sorted(raw.items(), key=lambda x: -x[1][2])[: args.top]
        print("  top functions by self time:")
        for (filename, line, func), (_, nc, tt, _, _) in top:
            root = str(Path(admit.__file__).resolve().parent) + "/"
            short = filename.removeprefix(root) if filename.startswith(root) else filename.rsplit("/", 2)[-1]
            print(f"    {100 * tt / total:5.1f} %  {nc:>8,d} calls  {short}:{line}({func})")


if __name__ == "__main__":
    main()
