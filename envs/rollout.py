"""One episode of a controller on a scenario: what evaluation and the static-caps search both run.

``rollout(scenario, controller, seed)`` resets the controller with the scenario's control spec and the seed,
builds the world for that seed (``make_simulation``: the same requests for every controller on one seed, the
common random numbers of a comparison), runs the decision loop to the horizon and returns the episode's
metrics: ``Simulation.summary()`` with the overall e2e percentiles also under the names the tenants' figures
use, ``mean_limit`` and ``"tenants"`` (``tenant_summary()``), and where tenants have contracts their figures
(envs/contracts.py: per tenant ``contract_attainment``, ``contract_met``, ...; overall ``contracts_met`` and
``contract_shortfall``), each tenant's ``excess_goodput``, ``borrowed`` and ``lent`` and, under ``"lending"``,
their per-decision series (``episode_lending``). A caller that needs more of the finished world
than its summary (the search asks which limits ever held a request back) passes ``inspect``, whose dict is
added to the episode. A caller that runs many policies on one seed passes that seed's ``draw``
(envs/simulation.py ``draw_episode``, made once), and one that reads what it needs of the contracts from the
world itself (``World.contract_totals``: the same in-contract counts) passes ``per_request=False``, which
leaves out the figures read from the request columns (the contract and lending figures): the caps search
does both, for the same numbers at less cost.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from admit.core.controller import Controller
from admit.envs.compiled import World, make_simulation
from admit.envs.contracts import episode_contracts, episode_lending, request_classes
from admit.envs.scenario import Scenario
from admit.envs.simulation import Draw, decision_times

# One episode: the overall metrics (floats) and ``"tenants"``: {name: {metric: float}}.
Episode = dict[str, Any]


def rollout(
    scenario: Scenario,
    controller: Controller,
    seed: int,
    *,
    name: str | None = None,
    start_limits: Sequence[int] | None = None,
    inspect: Callable[[World], dict[str, Any]] | None = None,
    draw: Draw | None = None,
    per_request: bool = True,
) -> Episode:
    """Run one episode of ``controller`` (not yet reset) on ``seed``; ``name`` labels its errors (default: the
    controller's own name); ``start_limits``: the limits at t = 0 instead of the scenario's
    ``initial`` (caps set before traffic, as an operator's quota is); ``draw``: the seed's requests drawn
    before; ``per_request``: whether to add the contract and lending figures (module docstring). Returns the
    episode metrics, overall and per tenant, and what ``inspect`` adds."""
    controller.reset(scenario.control_spec(), seed)
    sim = make_simulation(scenario, seed, draw=draw)
    if start_limits is not None:
        sim.set_limits(start_limits)
    stats = sim.run(controller, name=name)
    out: Episode = dict(sim.summary())
    out.setdefault("e2e_p50_s", out["p50_s"])
    out.setdefault("e2e_p99_s", out["p99_s"])
    out["mean_limit"] = stats.mean_limit
    out["tenants"] = sim.tenant_summary()
    if scenario.has_contracts and per_request:
        cols = sim.request_columns()
        warmup_s = getattr(sim, "warmup_s", 0.0)
        classes = request_classes(scenario, cols)
        per, overall = episode_contracts(scenario, cols, warmup_s, classes)
        for name, figs in per.items():
            out["tenants"][name].update(figs)
        out.update(overall)
        lend, series = episode_lending(scenario, cols, decision_times(scenario), warmup_s, classes=classes)
        for name, figs in lend.items():
            out["tenants"][name].update(figs)
        out["lending"] = series
    if inspect is not None:
        out.update(inspect(sim))
    return out
