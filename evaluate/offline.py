"""Offline policy evaluation with common random numbers and paired statistics.

For every policy and every seed s the simulation draws the same workload (arrivals, sizes, service
draws) from s, so differences between policies on one seed are due to the policies alone. Per policy we
report the mean, the sample standard deviation and a 95% confidence interval (Student t, n−1 degrees of
freedom; clipped at 0 for a count that cannot be negative, `LOWER_BOUNDS`) of each metric over seeds, and a
paired two-sided Wilcoxon signed-rank test of every policy against the first one on each metric (seeds are
the pairs; zero differences are split between the ranks, scipy's ``zero_method="zsplit"``). The test is
distribution-free, which matters for drop counts.

The same is done per tenant (``"tenants"`` in the JSON, `TENANT_METRICS`): a tenant's attainment is
tested on its own, because an overall figure can rise while one tenant is shed. evaluate/verdict.py turns
these into the wins / ties / loses verdict.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from admit.agents.registry import make_controller
from admit.core.stats import summarize
from admit.envs.contracts import contract_json
from admit.envs.rollout import Episode, rollout
from admit.envs.scenario import Scenario, load_scenario
from scipy import stats

# Overall metrics, in the order the table shows them: goodput and attainment first (what the verdict judges
# by), then latency, drops (``timeouts``: dropped from a queue), rejections and the mean limit; after them the
# seed study's figures (e2e p99 as ``p99_s``, drops + rejections as ``dropped``, ...), kept for seed-paper's
# reproduction (docs/reproduction.md) and for older readers of results.json.
METRICS = (
    "goodput_rps",
    "attainment",
    "worst_attainment",
    "jain_attainment",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p99_s",
    "e2e_p50_s",
    "e2e_p99_s",
    "timeouts",
    "rejected",
    "mean_limit",
    "throughput_rps",
    "p99_s",
    "p50_s",
    "dropped",
    "slo_attainment",
    "jain_fairness",
)
# Per tenant (envs/simulation.py `tenant_metrics`); every one is summarized and tested like the overall ones.
TENANT_METRICS = (
    "goodput_rps",
    "attainment",
    "throughput_rps",
    "output_tokens_per_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p99_s",
    "e2e_p50_s",
    "e2e_p99_s",
    "timeouts",
    "rejected",
    "arrived",
    "completed",
    "good",
)
# Where tenants have contracts (envs/contracts.py), these too, overall and per tenant with one; overall in the
# order the reports show them: contracts met, shortfall, (goodput,) Jain over share-normalised service.
CONTRACT_METRICS = ("contracts_met", "contract_shortfall", "jain_share", "contracts")
# Per tenant also what it served and held beyond its share (envs/contracts.py ``episode_lending``): excess goodput,
# and its mean concurrency borrowed beyond its nominal share and lent of it; every tenant of such a scenario has
# these (a tenant without a contract has a nominal share of 0).
TENANT_CONTRACT_METRICS = ("contract_attainment", "contract_met", "contract_shortfall", "contract_arrived",
                           "contract_good", "excess_goodput", "borrowed", "lent")
# Figures that cannot go below a bound, with it: their interval is clipped there (`summarize`). Only the contract
# shortfall, overall and per tenant: a count of requests that is often 0 on most seeds and large on a few, so its
# t-interval would reach below 0 (e.g. 19.4 [-8.6, 47.4]).
LOWER_BOUNDS = {"contract_shortfall": 0.0}


def run_policy(scenario: Scenario, policy: str, seed: int) -> Episode:
    """One episode of the policy named ``policy`` on ``seed`` (admit.envs.rollout.rollout, the function the
    static-caps search scores with); returns the episode metrics, overall and per tenant."""
    return rollout(scenario, make_controller(policy, scenario), seed, name=policy)


def _job(args: tuple[Scenario, str, int]) -> Episode:
    return run_policy(*args)


def bound_intervals(data: dict) -> dict:
    """``data`` (results.json) with the interval of every `LOWER_BOUNDS` figure, overall and per tenant, computed
    again from its stored values by `summarize` (in place; returned): a report re-rendered from results written
    before a figure was bounded shows it clipped. Every other figure is left as stored."""
    for entry in data["policies"].values():
        for block in (entry, *entry.get("tenants", {}).values()):
            for m, lower in LOWER_BOUNDS.items():
                if m in block and "values" in block[m]:
                    block[m]["ci95"] = summarize(block[m]["values"], lower)["ci95"]
    return data


def paired_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided Wilcoxon signed-rank p-value of paired samples; 1.0 when they never differ."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if np.allclose(d, 0.0):
        return 1.0
    return float(stats.wilcoxon(a, b, zero_method="zsplit", alternative="two-sided").pvalue)


def _block(runs: Sequence[dict[str, float]], base: Sequence[dict[str, float]] | None, metrics: Sequence[str]) -> dict:
    """``{metric: {mean, std, ci95, values}}`` of one policy's runs, and ``p_value_vs_first`` against ``base``'s
    runs seed by seed (1.0 everywhere when ``base`` is None: the first policy itself)."""
    entry: dict = {}
    for m in metrics:
        vals = [r[m] for r in runs]
        entry[m] = {**summarize(vals, LOWER_BOUNDS.get(m)), "values": vals}
    entry["p_value_vs_first"] = {
        m: 1.0 if base is None else paired_p([r[m] for r in runs], [r[m] for r in base]) for m in metrics
    }
    return entry


@dataclass
class Evaluation:
    scenario: str
    seeds: list[int]
    policies: list[str]
    per_seed: dict[str, list[Episode]]
    horizon_s: float | None = None
    metrics: Sequence[str] = METRICS  # a live protocol measures a subset (admit.live.protocol)
    tenant_metrics: Sequence[str] = TENANT_METRICS
    contracts: dict[str, dict] = field(default_factory=dict)  # per tenant with one: its contract as given

    def to_json(self) -> dict:
        """Per policy: every metric of `METRICS` summarized over seeds with its values and its paired p-value vs
        the first policy, and ``"tenants"``: the same for each tenant over `TENANT_METRICS`."""
        first = self.policies[0]
        out: dict = {
            "scenario": self.scenario,
            "seeds": len(self.seeds),
            "seed_list": self.seeds,
            "horizon_s": self.horizon_s,
            "baseline": first,
            "test": "two-sided Wilcoxon signed-rank, paired by seed (zero differences split), vs the first policy; "
            "overall and per tenant",
            "policies": {},
        }
        for p in self.policies:
            runs = self.per_seed[p]
            base = None if p == first else self.per_seed[first]
            entry = _block(runs, base, _present(self.metrics, CONTRACT_METRICS, runs))
            tenants = list(runs[0]["tenants"]) if runs else []
            entry["tenants"] = {}
            for t in tenants:
                mine = [r["tenants"][t] for r in runs]
                entry["tenants"][t] = _block(mine, None if base is None else [r["tenants"][t] for r in base],
                                             _present(self.tenant_metrics, TENANT_CONTRACT_METRICS, mine))
                if t in self.contracts:
                    entry["tenants"][t]["contract"] = self.contracts[t]
            out["policies"][p] = entry
        return out


def _present(always: Sequence[str], optional: Sequence[str], runs: Sequence[dict]) -> tuple[str, ...]:
    """``always``, then those of ``optional`` that the runs measured (the contract figures, where there are
    contracts)."""
    return (*always, *(m for m in optional if runs and m in runs[0]))


def p_values_vs(data: dict, base: str, metrics: Sequence[str] = METRICS) -> dict[str, dict[str, float]]:
    """Paired p-values of every policy of ``data`` (results.json) against ``base`` instead of the first policy,
    recomputed from the stored per-seed values with the same test (`paired_p`)."""
    ref = data["policies"][base]
    return {
        p: {m: 1.0 if p == base else paired_p(e[m]["values"], ref[m]["values"]) for m in metrics}
        for p, e in data["policies"].items()
    }


def check_policies(policies: Sequence[str]) -> None:
    """At least one policy (the first is the baseline of every test), each named once; ValueError otherwise."""
    if not policies:
        raise ValueError("give at least one --policy (the first is the baseline)")
    if len(set(policies)) != len(policies):
        raise ValueError(f"policies must be distinct, got {list(policies)}")


def evaluate(
    scenario: str | Scenario,
    policies: Sequence[str],
    seeds: int,
    seed_base: int = 0,
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
    ray: str | None = None,
) -> Evaluation:
    """Every policy on seeds ``seed_base`` .. ``seed_base + seeds - 1`` (the same seeds for each: common random
    numbers), in this process, on ``workers`` processes, or as Ray tasks on the cluster ``ray`` names
    (evaluate/ray_jobs.py; the same figures wherever the episodes ran)."""
    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    check_policies(policies)
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    if ray is not None and workers > 1:
        raise ValueError(f"give --workers or --ray, not both (--workers {workers}, --ray {ray}): on Ray the "
                         "cluster's CPUs are the workers")
    for p in policies:  # fail fast on a bad name, before any work
        make_controller(p, sc).reset(sc.control_spec(), 0)
    seed_list = [seed_base + i for i in range(seeds)]
    jobs = [(sc, p, s) for p in policies for s in seed_list]
    results: list[Episode] = []
    if ray is not None:
        from admit.evaluate.ray_jobs import run_episodes

        results = run_episodes(sc, [(p, s) for _, p, s in jobs], ray, progress)
    elif workers > 1:
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
    return Evaluation(sc.name, seed_list, list(policies), per_seed, sc.horizon_s, contracts=contract_json(sc))


def lending_series(ev: Evaluation) -> dict[str, Any]:
    """Each tenant's concurrency borrowed and lent over time, per policy: the mean over the seeds at each
    decision (every seed decides at the same times) of the episodes' series (envs/contracts.py
    ``episode_lending``). ``{"time_s": [...], "nominal": {tenant: n}, "policies": {policy: {"borrowed":
    {tenant: [...]}, "lent": {tenant: [...]}}}}``; a ValueError where the tenants have no contracts (borrowed and
    lent are measured against each contract's nominal share)."""
    first = ev.per_seed[ev.policies[0]]
    if not first or "lending" not in first[0] or not first[0]["lending"]:
        raise ValueError(f"{ev.scenario}: no tenant has a contract, so nothing is borrowed or lent (both are "
                         "measured against each contract's nominal share; give tenants a contract: block)")
    head = first[0]["lending"]
    out: dict[str, Any] = {"time_s": [float(t) for t in head["time_s"]],
                           "nominal": {k: int(v) for k, v in head["nominal"].items()}, "policies": {}}
    for p in ev.policies:
        runs = [r["lending"] for r in ev.per_seed[p]]
        out["policies"][p] = {key: {name: np.mean([r[key][name] for r in runs], axis=0).tolist()
                                    for name in head[key]} for key in ("borrowed", "lent")}
    return out


def write_json(ev: Evaluation, path: str | Path) -> dict:
    data = ev.to_json()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=2))
    return data
