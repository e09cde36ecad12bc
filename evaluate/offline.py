"""Offline policy evaluation with common random numbers and paired statistics.

For every policy and every seed s the simulation draws the same workload (arrivals, sizes, service
draws) from s, so differences between policies on one seed are due to the policies alone. Per policy we
report the mean, the sample standard deviation and a 95% confidence interval (Student t, n−1 degrees of
freedom) of each metric over seeds, and a paired two-sided Wilcoxon signed-rank test of every policy
against the first one on each metric (seeds are the pairs; zero differences are split between the ranks,
scipy's ``zero_method="zsplit"``). The test is distribution-free, which matters for drop counts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from admit.controllers.registry import make_controller
from admit.envs.scenario import Scenario, load_scenario
from admit.envs.simulation import Simulation
from scipy import stats

METRICS = ("throughput_rps", "p99_s", "dropped", "slo_attainment", "jain_fairness", "ttft_p99_s", "p50_s")


def rollout(scenario: Scenario, policy: str, seed: int) -> dict[str, float]:
    """Run one episode of ``policy`` on ``seed``; returns the episode metrics."""
    ctrl = make_controller(policy)
    ctrl.reset(scenario.control_spec(), seed)
    sim = Simulation(scenario, seed)
    stats = sim.run(ctrl, name=policy)
    out = sim.summary()
    out["mean_limit"] = stats.mean_limit
    return out


def _job(args: tuple[Scenario, str, int]) -> dict[str, float]:
    return rollout(*args)


def summarize(values: Sequence[float]) -> dict[str, float | list[float]]:
    x = np.asarray(values, dtype=float)
    n = len(x)
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if n > 1 else 0.0
    half = float(stats.t.ppf(0.975, n - 1) * std / math.sqrt(n)) if n > 1 else 0.0
    return {"mean": mean, "std": std, "ci95": [mean - half, mean + half]}


def paired_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided Wilcoxon signed-rank p-value of paired samples; 1.0 when they never differ."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if np.allclose(d, 0.0):
        return 1.0
    return float(stats.wilcoxon(a, b, zero_method="zsplit", alternative="two-sided").pvalue)


@dataclass
class Evaluation:
    scenario: str
    seeds: list[int]
    policies: list[str]
    per_seed: dict[str, list[dict[str, float]]]

    def to_json(self) -> dict:
        first = self.policies[0]
        out: dict = {
            "scenario": self.scenario,
            "seeds": len(self.seeds),
            "seed_list": self.seeds,
            "test": "two-sided Wilcoxon signed-rank, paired by seed, vs the first policy",
            "policies": {},
        }
        for p in self.policies:
            runs = self.per_seed[p]
            entry: dict = {}
            for m in (*METRICS, "mean_limit"):
                entry[m] = summarize([r[m] for r in runs])
                entry[m]["values"] = [r[m] for r in runs]
            entry["p_value_vs_first"] = {
                m: (1.0 if p == first else paired_p([r[m] for r in runs], [r[m] for r in self.per_seed[first]]))
                for m in METRICS
            }
            out["policies"][p] = entry
        return out


def evaluate(
    scenario: str | Scenario,
    policies: Sequence[str],
    seeds: int,
    seed_base: int = 0,
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> Evaluation:
    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    if not policies:
        raise ValueError("give at least one --policy")
    if len(set(policies)) != len(policies):
        raise ValueError(f"policies must be distinct, got {list(policies)}")
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    for p in policies:  # fail fast on a bad name, before any work
        make_controller(p).reset(sc.control_spec(), 0)
    seed_list = [seed_base + i for i in range(seeds)]
    jobs = [(sc, p, s) for p in policies for s in seed_list]
    results: list[dict[str, float]] = []
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as ex:
            for i, r in enumerate(ex.map(_job, jobs, chunksize=max(1, len(jobs) // (4 * workers)))):
                results.append(r)
                if progress:
                    progress(i + 1, len(jobs))
    else:
        for i, j in enumerate(jobs):
            results.append(_job(j))
            if progress:
                progress(i + 1, len(jobs))
    per_seed = {p: results[k * seeds : (k + 1) * seeds] for k, p in enumerate(policies)}
    return Evaluation(sc.name, seed_list, list(policies), per_seed)


def write_json(ev: Evaluation, path: str | Path) -> dict:
    data = ev.to_json()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=2))
    return data
