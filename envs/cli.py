"""``admit scenarios``: the bundled scenarios of the simulated world (envs/scenarios/)."""

from __future__ import annotations

import typer


def scenarios() -> None:
    """List the bundled scenarios."""
    from admit.envs.scenario import bundled_scenarios, load_scenario

    for name in bundled_scenarios():
        sc = load_scenario(name)
        typer.echo(f"{name:20s} {len(sc.tenants)} tenants, {sc.engine.kind} engine, {sc.horizon_s:g} s")
