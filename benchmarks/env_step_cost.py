"""Benchmark: the cost of one env step, this revision against another, side by side in one run.

Each configuration steps the Gymnasium env of a bundled scenario with seeded random actions for
``--steps`` steps (resetting at episode ends) in a fresh subprocess, and reports the process's CPU time
per step (user + system, from ``resource``), the figure that moves least with the machine's other load.
``--before REV`` runs the same loop on the code of git revision REV (``git archive``, imported from a temp
dir, as benchmarks/gateway_bench.py does); the two alternate over ``--repeat`` rounds so that machine
noise hits both, and the median of the rounds' ratios is reported. This revision runs
``admit/TenantAdmission-v1`` (Observation layout 2, the token features) and REV its
``admit/TenantAdmission-v0`` (``--env-id``, ``--before-env-id``): against a revision from before the
token-aware Observation and the per-request SLO accounting (d88995f below) the ratio is their price together.

    python benchmarks/env_step_cost.py --before d88995f [--scenario h200-mixed --scenario servegen-skewed]
        [--steps 20000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_bench import baseline_tree

LOOP = r"""
import json, resource, sys
sys.path.insert(0, sys.argv[1]) if sys.argv[1] else None
import gymnasium as gym, numpy as np
import admit.envs  # registers the ids
scenario, steps, env_id = sys.argv[2], int(sys.argv[3]), sys.argv[4]
env = gym.make(env_id, scenario=scenario)
rng = np.random.default_rng(0)
env.reset(seed=0)
env.action_space.seed(0)
for _ in range(200):  # warm up: imports, first episode set-up
    env.step(env.action_space.sample())
t0 = resource.getrusage(resource.RUSAGE_SELF)
obs_size = None
for i in range(steps):
    obs, r, term, trunc, _ = env.step(env.action_space.sample())
    obs_size = len(obs)
    if term or trunc:
        env.reset(seed=i + 1)
t1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = (t1.ru_utime - t0.ru_utime) + (t1.ru_stime - t0.ru_stime)
print(json.dumps({"cpu_us_per_step": 1e6 * cpu / steps, "obs_size": obs_size}))
"""


def one(code: Path | None, scenario: str, steps: int, env_id: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", LOOP, str(code) if code else "", scenario, str(steps), env_id],
                         check=True, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="git revision to compare against")
    ap.add_argument("--scenario", action="append",
                    help="bundled scenario (repeat); default h200-mixed, servegen-skewed")
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--env-id", default="admit/TenantAdmission-v1", help="this revision's env id")
    ap.add_argument("--before-env-id", default="admit/TenantAdmission-v0", help="the other revision's env id")
    a = ap.parse_args()
    scenarios = a.scenario or ["h200-mixed", "servegen-skewed"]
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        old = baseline_tree(a.before, Path(tmp))
        for sc in scenarios:
            ratios, rows = [], []
            for r in range(a.repeat):
                pair = [("after", None, a.env_id), ("before", old, a.before_env_id)]
                if r % 2:
                    pair.reverse()
                got = {name: one(code, sc, a.steps, env) for name, code, env in pair}
                ratios.append(got["after"]["cpu_us_per_step"] / got["before"]["cpu_us_per_step"])
                rows.append(got)
                print(f"{sc} round {r + 1}: after {got['after']['cpu_us_per_step']:.1f} µs/step "
                      f"(obs {got['after']['obs_size']}), before {got['before']['cpu_us_per_step']:.1f} µs/step "
                      f"(obs {got['before']['obs_size']}), after/before {ratios[-1]:.3f}", flush=True)
            print(f"{sc}: after/before median {statistics.median(ratios):.3f} "
                  f"(range {min(ratios):.3f}-{max(ratios):.3f}) over {a.repeat} rounds", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
