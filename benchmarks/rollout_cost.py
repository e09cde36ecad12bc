"""Benchmark: the CPU cost of one evaluation episode (``rollout``, what `admit evaluate` runs per policy and seed)
on a scenario with a contract on every tenant, this revision against another, side by side in one run.

Each side runs ``--episodes`` episodes of each ``--policy`` on seeds 0, 1, ... in a fresh subprocess, after one
warm-up episode (imports, the kernels loaded from numba's cache), and reports the process's CPU time per
episode (user + system, from ``resource``). The scenario is the bundled one with whatever contracts its file
gives taken off and, with ``--contracts`` (the default), a contract on every tenant at its own mean rate in
requests/s, a burst of two seconds of it and attainment 0.9 (benchmarks/env_step_cost.py's), so both
revisions run the same scenario whatever their scenario files say; ``--no-contracts`` leaves every tenant
without one. ``--before REV`` runs the other side on git revision REV (``git archive``, as
benchmarks/env_step_cost.py does); without it the other side is this revision with no contracts (the price of
the contract figures against none). The sides alternate over ``--repeat`` rounds; the median of the rounds'
ratios is reported.

    python benchmarks/rollout_cost.py --before REV [--scenario h200-mixed --scenario servegen-skewed]
        [--policy static --policy aimd] [--episodes 20] [--repeat 5]
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
from admit.agents.registry import make_controller
from admit.envs.family import mean_rate
from admit.envs.rollout import rollout
from admit.envs.scenario import load_scenario, parse_scenario
name, policy, episodes, contracts = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1"
sc = load_scenario(name)
data = sc.model_dump(exclude_none=True)
for t, d in zip(sc.tenants, data["tenants"]):
    d.pop("contract", None)
    if contracts:  # every tenant promised its own mean rate (requests/s), a burst of two seconds of it
        rate = max(mean_rate(t.arrival, sc.horizon_s), 0.01)
        d["contract"] = {"requests_per_s": rate, "burst": max(1.0, 2 * rate), "attainment": 0.9}
sc = parse_scenario(data, f"{name} for the benchmark")
rollout(sc, make_controller(policy, sc), 10_000)  # warm up
t0 = resource.getrusage(resource.RUSAGE_SELF)
keys = None
for seed in range(episodes):
    ep = rollout(sc, make_controller(policy, sc), seed)
    keys = sorted(ep["tenants"][sc.tenants[0].name])
t1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = (t1.ru_utime - t0.ru_utime) + (t1.ru_stime - t0.ru_stime)
print(json.dumps({"cpu_ms_per_episode": 1e3 * cpu / episodes, "figures": len(keys)}))
"""


def one(code: Path | None, scenario: str, policy: str, episodes: int, contracts: bool) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", LOOP, str(code) if code else "", scenario, policy, str(episodes),
                          "1" if contracts else "0"],
                         check=True, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", help="git revision to compare against (default: this one without contracts)")
    ap.add_argument("--scenario", action="append", help="bundled scenario (repeat); default h200-mixed")
    ap.add_argument("--policy", action="append", help="policy (repeat); default static, aimd")
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-contracts", action="store_true", help="no tenant has a contract on either side")
    a = ap.parse_args()
    if a.before is None and a.no_contracts:
        ap.error("--no-contracts compares against --before REV")
    contracts = not a.no_contracts
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        old = baseline_tree(a.before, Path(tmp)) if a.before else None
        for sc in a.scenario or ["h200-mixed"]:
            for policy in a.policy or ["static", "aimd"]:
                ratios = []
                for r in range(a.repeat):
                    pair = [("after", None, contracts), ("before", old, contracts if a.before else False)]
                    if r % 2:
                        pair.reverse()
                    got = {name: one(code, sc, policy, a.episodes, con) for name, code, con in pair}
                    af, bf = got["after"], got["before"]
                    ratios.append(af["cpu_ms_per_episode"] / bf["cpu_ms_per_episode"])
                    print(f"{sc} {policy} round {r + 1}: after {af['cpu_ms_per_episode']:.2f} ms/episode "
                          f"({af['figures']} figures per tenant), before {bf['cpu_ms_per_episode']:.2f} ms/episode "
                          f"({bf['figures']}), after/before {ratios[-1]:.3f}", flush=True)
                print(f"{sc} {policy}: episode after/before median {statistics.median(ratios):.3f} "
                      f"(range {min(ratios):.3f}-{max(ratios):.3f}) over {a.repeat} rounds", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
