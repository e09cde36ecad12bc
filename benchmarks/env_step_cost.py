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

Every side runs the scenario without the contracts its file may give (bundled scenarios have them);
``--contracts`` gives this revision's side a contract on every tenant (core/contract.py: requests/s at the
tenant's own mean rate, so the contracts fit together wherever the scenario's load does; a burst of two
seconds of it; attainment 0.9): the price of the contract bookkeeping, the classification at each episode's
start and the two queues per tenant. Without ``--before`` the other side is this revision without contracts.
``--before-contracts`` gives the other side the same contracts (a revision that has them), and
``--contract-miss W`` this revision's side the contract-first reward term at weight W (envs/env.py, "Rewards";
``goodput`` 1 beside it): with both, the ratio is the term's price on a scenario with contracts.
Each side also reports the CPU time of a reset (``--resets`` of them, timed after the steps), where an
episode's requests are drawn and classified.

    python benchmarks/env_step_cost.py --before d88995f [--scenario h200-mixed --scenario servegen-skewed]
        [--steps 20000] [--repeat 5]
    python benchmarks/env_step_cost.py --contracts --env-id admit/TenantAdmission-v1 [--before REV]
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
scenario, steps, env_id, resets, contracts = sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), \
    sys.argv[6] == "1"
miss = sys.argv[7] if len(sys.argv) > 7 else ""
from admit.envs.scenario import load_scenario, parse_scenario
sc = load_scenario(scenario)
data = sc.model_dump(exclude_none=True)
for d in data["tenants"]:  # the scenario's own contracts (a bundled file's) off: none, or the ones below
    d.pop("contract", None)
if contracts:  # every tenant promised its own mean rate (requests/s), a burst of two seconds of it
    from admit.envs.family import mean_rate
    for t, d in zip(sc.tenants, data["tenants"]):
        rate = max(mean_rate(t.arrival, sc.horizon_s), 0.01)
        d["contract"] = {"requests_per_s": rate, "burst": max(1.0, 2 * rate), "attainment": 0.9}
    if miss:  # the contract-first reward term (only a revision that has it)
        data["reward"] = {**data.get("reward", {}), "goodput": 1.0, "contract_miss": float(miss)}
scenario = parse_scenario(data, f"{scenario} with contracts" if contracts else f"{scenario} without contracts")
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
for j in range(resets):  # an episode's start alone: its requests drawn (and classified, with contracts)
    env.reset(seed=10_000 + j)
t2 = resource.getrusage(resource.RUSAGE_SELF)
reset_cpu = (t2.ru_utime - t1.ru_utime) + (t2.ru_stime - t1.ru_stime)
print(json.dumps({"cpu_us_per_step": 1e6 * cpu / steps, "obs_size": obs_size,
                  "cpu_ms_per_reset": 1e3 * reset_cpu / max(resets, 1)}))
"""


def one(code: Path | None, scenario: str, steps: int, env_id: str, resets: int, contracts: bool,
        miss: str = "") -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", LOOP, str(code) if code else "", scenario, str(steps), env_id,
                          str(resets), "1" if contracts else "0", miss],
                         check=True, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", help="git revision to compare against (default with --contracts: this one)")
    ap.add_argument("--scenario", action="append",
                    help="bundled scenario (repeat); default h200-mixed, servegen-skewed")
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--env-id", default="admit/TenantAdmission-v1", help="this revision's env id")
    ap.add_argument("--before-env-id", default="admit/TenantAdmission-v0", help="the other revision's env id")
    ap.add_argument("--contracts", action="store_true", help="this revision's side: a contract on every tenant")
    ap.add_argument("--before-contracts", action="store_true", help="the other side: the same contracts")
    ap.add_argument("--contract-miss", default="", help="this revision's side, with --contracts: the reward's "
                    "contract_miss weight (goodput 1)")
    ap.add_argument("--resets", type=int, default=5, help="resets timed after the steps, per round and side")
    a = ap.parse_args()
    if a.before is None and not a.contracts:
        ap.error("--before REV, --contracts or both")
    if a.resets < 1:
        ap.error("--resets must be at least 1")
    scenarios = a.scenario or ["h200-mixed", "servegen-skewed"]
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        old = baseline_tree(a.before, Path(tmp)) if a.before else None
        before_env = a.before_env_id if a.before else a.env_id
        for sc in scenarios:
            ratios, reset_ratios = [], []
            for r in range(a.repeat):
                pair = [("after", None, a.env_id, a.contracts, a.contract_miss),
                        ("before", old, before_env, a.before_contracts, "")]
                if r % 2:
                    pair.reverse()
                got = {name: one(code, sc, a.steps, env, a.resets, con, miss)
                       for name, code, env, con, miss in pair}
                af, bf = got["after"], got["before"]
                ratios.append(af["cpu_us_per_step"] / bf["cpu_us_per_step"])
                reset_ratios.append(af["cpu_ms_per_reset"] / bf["cpu_ms_per_reset"])
                print(f"{sc} round {r + 1}: after {af['cpu_us_per_step']:.1f} µs/step (obs {af['obs_size']}), "
                      f"before {bf['cpu_us_per_step']:.1f} µs/step (obs {bf['obs_size']}), after/before "
                      f"{ratios[-1]:.3f}; reset after {af['cpu_ms_per_reset']:.2f} ms, before "
                      f"{bf['cpu_ms_per_reset']:.2f} ms, after/before {reset_ratios[-1]:.3f}", flush=True)
            for what, rs in (("step", ratios), ("reset", reset_ratios)):
                print(f"{sc}: {what} after/before median {statistics.median(rs):.3f} "
                      f"(range {min(rs):.3f}-{max(rs):.3f}) over {a.repeat} rounds", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
