"""An episode's contract figures: which of its requests were in contract and how many of those were good.

Per tenant with a contract (core/contract.py): the requests it sent in contract (classified at arrival on
the tenant's envelope, from the episode's arrivals alone, so the same under every policy on one seed), how
many of them were good, their attainment, whether the promise was kept and the shortfall. Over the
scenario: ``contracts`` (how many tenants have one), ``contracts_met`` and ``contract_shortfall`` (summed),
and ``jain_share``, Jain's index over the tenants' share-normalised service: per tenant with a contract, its
good requests (in contract or not) measured in its contract's unit (requests, or prompt + output tokens) and
divided by its contract's rate; 1 when the good service is divided in proportion to the contracts, 1/n when
one tenant has it all (a common scale leaves the index as it is, so the service is counted, not divided by time).
Read after the run from the world's request columns, so the simulation's hot path carries nothing for it.
Requests that arrived during a warm-up (``Simulation(warmup_s=)``) are classified, as they charge the
envelope, but not counted, as the episode's other totals do not count them.

``episode_lending`` adds, per tenant of a scenario with contracts, what it served and held beyond its share:
``excess_goodput``, its good out-of-contract requests per second (over the episode after the warm-up, as
``goodput_rps``; a tenant without a contract has no promise, so all its goodput), and ``borrowed`` and ``lent``,
the means over the decisions at or after the warm-up of its concurrency borrowed beyond its nominal share and
of its idle nominal share that the borrowers use (core/contract.py's ``nominal_concurrency`` and ``lending``, on
its requests in flight at each decision, ``RequestColumns.in_flight``); with the per-decision series for a plot.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from admit.core.contract import ATTAINMENT_EPS, figures, lending, nominal_concurrency
from admit.envs.scenario import Scenario, parse_scenario
from admit.envs.simulation import RequestColumns, in_contract, jain
from admit.envs.workload import Trace

Classes = tuple[np.ndarray, np.ndarray]  # per request: in contract, good


def request_classes(scenario: Scenario, cols: RequestColumns) -> Classes:
    """Per request, whether it is in contract (as the world classified it, ``cols.inside``, where the columns
    carry it, else classified here on the arrivals: envs/simulation.py's ``in_contract``) and whether it was
    good (the episode's own test, ``cols.good``)."""
    inside = cols.inside if cols.inside is not None else in_contract(scenario, cols.tenant, cols.arrival,
                                                                       cols.prompt, cols.output)
    return inside, cols.good([t.request_bounds for t in scenario.control_spec().tenants])


def episode_contracts(scenario: Scenario, cols: RequestColumns, warmup_s: float = 0.0,
                      classes: Classes | None = None) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """(per tenant name with a contract: its figures, overall: contracts, contracts_met, contract_shortfall,
    jain_share); both empty when no tenant has a contract. The requests are classified and judged here
    (`request_classes`) unless ``classes`` gives them."""
    if not scenario.has_contracts:
        return {}, {}
    inside, good = request_classes(scenario, cols) if classes is None else classes
    return contract_figures(scenario, cols.tenant, inside, good, cols.prompt, cols.output, cols.arrival >= warmup_s)


def episode_lending(scenario: Scenario, cols: RequestColumns, times: np.ndarray, warmup_s: float = 0.0,
                    span_s: float | None = None, classes: Classes | None = None
                    ) -> tuple[dict[str, dict[str, float]], dict[str, Any]]:
    """(per tenant name: ``excess_goodput``, ``borrowed``, ``lent``; the series: ``time_s`` (the decisions'
    times), and by tenant name ``nominal`` (its nominal concurrency) and, one value per decision, ``in_flight``,
    ``borrowed`` and ``lent``, numpy arrays); both empty when no tenant has a contract. ``times``: the episode's
    decision times (envs/simulation.py ``decision_times``); ``span_s``: the seconds ``excess_goodput`` is a rate
    over (default: the scenario's horizon less the warm-up, as ``goodput_rps``'s); ``classes``: as in
    `episode_contracts`."""
    if not scenario.has_contracts:
        return {}, {}
    inside, good = request_classes(scenario, cols) if classes is None else classes
    span = scenario.horizon_s - warmup_s if span_s is None else span_s
    return lending_figures(scenario, cols.tenant, inside, good, cols.arrival >= warmup_s,
                           cols.in_flight(len(scenario.tenants), times), times, times >= warmup_s, span)


def lending_figures(scenario: Scenario, tenant: np.ndarray, inside: np.ndarray, good: np.ndarray,
                    counted: np.ndarray, in_flight: np.ndarray, times: np.ndarray, after: np.ndarray, span_s: float
                    ) -> tuple[dict[str, dict[str, float]], dict[str, Any]]:
    """`episode_lending`'s figures from per-request columns however they were found (the tenant's index, in
    contract, good, counted) and the tenants' requests in flight at each decision (times × tenants, envs/
    simulation.py ``in_flight_at``) with the decisions' ``times`` and which of them count (``after``);
    ``excess_goodput`` is a rate over ``span_s``. The simulator reads both from its request columns; a live run
    (admit.live.protocol) from the gateway's request log and its control loop's decisions, so both report by
    this one arithmetic."""
    if not scenario.has_contracts:
        return {}, {}
    names = [t.name for t in scenario.tenants]
    n = len(names)
    contracted = np.array([t.contract is not None for t in scenario.tenants])
    # good and counted, and out of contract (a tenant without a contract: every good request)
    excess = good & counted & (~inside | ~contracted[tenant])
    n_excess = np.bincount(tenant[excess], minlength=n)
    nominal = nominal_concurrency(scenario.control_spec())
    borrowed, lent = lending(in_flight, nominal)
    b_mean = borrowed[after].mean(axis=0) if after.any() else np.zeros(n)
    l_mean = lent[after].mean(axis=0) if after.any() else np.zeros(n)
    per = {name: {"excess_goodput": float(n_excess[k]) / span_s, "borrowed": float(b_mean[k]),
                  "lent": float(l_mean[k])} for k, name in enumerate(names)}
    series: dict[str, Any] = {
        "time_s": times,
        "nominal": dict(zip(names, nominal, strict=True)),
        **{key: {name: a[:, k] for k, name in enumerate(names)}
           for key, a in (("in_flight", in_flight), ("borrowed", borrowed), ("lent", lent))},
    }
    return per, series


def contract_figures(scenario: Scenario, tenant: np.ndarray, inside: np.ndarray, good: np.ndarray,
                     prompt: np.ndarray, output: np.ndarray, counted: np.ndarray | None = None
                     ) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """`episode_contracts`'s figures from per-request columns however they were found: the tenant's index,
    whether the request was in contract, whether it was good, its prompt and output tokens, and whether it
    counts (``None``: all of them). The simulator classifies and judges from its request columns; a live run
    (admit.live.protocol) reads both from the gateway's request log, so both report by this one arithmetic."""
    if not scenario.has_contracts:
        return {}, {}
    if counted is None:
        counted = np.ones(len(tenant), dtype=bool)
    per: dict[str, dict[str, float]] = {}
    share: list[float] = []  # per tenant with a contract: its good service over its contract's rate
    for k, t in enumerate(scenario.tenants):
        if t.contract is None:
            continue
        mine = np.flatnonzero(tenant == k)
        sel = mine[inside[mine] & counted[mine]]
        per[t.name] = figures(t.contract, len(sel), int(good[sel].sum()))
        served = mine[good[mine] & counted[mine]]
        units = float(len(served)) if t.contract.unit == "requests" else float(
            prompt[served].sum(dtype=np.int64) + output[served].sum(dtype=np.int64))
        share.append(units / t.contract.rate)
    overall = {
        "contracts": float(len(per)),
        "contracts_met": float(sum(f["contract_met"] for f in per.values())),
        "contract_shortfall": float(sum(f["contract_shortfall"] for f in per.values())),
        "jain_share": jain(share),
    }
    return per, overall


def contract_json(scenario: Scenario) -> dict[str, Any]:
    """Each tenant's contract as given (``{name: {requests_per_s | tokens_per_s, burst, attainment}}``)."""
    return {t.name: t.contract.model_dump(exclude_none=True) for t in scenario.tenants if t.contract is not None}


def at_contract(scenario: Scenario, horizon_s: float | None = None) -> Scenario:
    """``scenario`` with every tenant that has a contract sending exactly it: constant arrivals at the
    contracted requests/s (a token contract's at the tenant's mean request size, engine/capacity.py's mix), so
    every request is in contract; its request sizes as before (a replayed trace's by resampling its columns).
    Tenants without a contract are unchanged. Searching its caps under the contracts (``admit search-static
    --at-contract``) says whether some static caps keep every promise when each tenant sends its contract.
    ``horizon_s``: a shorter (or longer) episode than the scenario's."""
    from admit.envs.family import tenant_mix  # the capacity estimate: only when asked

    if not scenario.has_contracts:
        raise ValueError(f"scenario {scenario.name!r} has no contracts to send")
    data = scenario.model_dump(mode="json", exclude_none=True)
    for t, d in zip(scenario.tenants, data["tenants"], strict=True):
        if t.contract is None:
            continue
        rate = t.contract.requests_per_s_at(tenant_mix(t).tokens)
        if isinstance(t.arrival, Trace):
            for key, col in (("prompt_tokens", "prompt"), ("output_tokens", "output")):
                d.setdefault(key, {"kind": "empirical", "source": t.arrival.source, "column": col})
        d["arrival"] = {"kind": "constant", "rate": rate}
    data["name"] = f"{scenario.name}-at-contract"
    if horizon_s is not None:
        data["horizon_s"] = horizon_s
    return parse_scenario(data, f"{scenario.name} at its contracts")


class _Initial:
    """The scenario's initial caps, held: the witness of `kept_at_contract` (a static rule, so the compiled
    world runs the whole episode in one call)."""

    name = "initial caps"

    def reset(self, spec: Any, seed: int | None = None) -> None:
        self.n = spec.n_tenants

    def act(self, obs: Any) -> list[int]:
        return [0] * self.n

    def decision_rule(self) -> tuple[str, tuple[float, ...]]:
        return "static", ()


def attainment_at_contract(scenario: Scenario, seed: int, horizon_s: float | None = None) -> dict[str, float]:
    """Each contracted tenant's in-contract attainment when every tenant with a contract sends exactly it
    (`at_contract`, over ``horizon_s`` or the scenario's horizon) and every limit stays at the scenario's
    initial cap, on ``seed`` (one episode). Every promise kept says that some static caps keep them all at
    contract (these ones): a sufficient test of the contracts' feasibility."""
    from admit.envs.compiled import make_simulation  # the world: only when asked

    at = at_contract(scenario, horizon_s)
    controller = _Initial()
    controller.reset(at.control_spec())
    sim = make_simulation(at, seed)
    sim.run(controller)
    per, _ = episode_contracts(at, sim.request_columns(), getattr(sim, "warmup_s", 0.0))
    return {name: figs["contract_attainment"] for name, figs in per.items()}


def kept_at_contract(scenario: Scenario, seed: int, horizon_s: float | None = None) -> tuple[int, int]:
    """(contracts kept, contracts) of `attainment_at_contract`'s episode."""
    got = attainment_at_contract(scenario, seed, horizon_s)
    promised = {t.name: t.contract.attainment for t in scenario.tenants if t.contract is not None}
    return sum(got[name] + ATTAINMENT_EPS >= p for name, p in promised.items()), len(promised)
