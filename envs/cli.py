"""``admit scenarios``: the bundled scenarios (envs/scenarios/) and scenario families (envs/families/)."""

from __future__ import annotations

import typer


def scenarios() -> None:
    """List the bundled scenarios (with their load: 1.0 = the engine's estimated capacity) and the scenario
    families, whose instances are named FAMILY@SEED (seeds from the ranges shown)."""
    from admit.envs.family import bundled_families, load_family, scenario_load
    from admit.envs.scenario import bundled_scenarios, load_scenario

    for name in bundled_scenarios():
        sc = load_scenario(name)
        typer.echo(
            f"{name:20s} {len(sc.tenants)} tenants, {sc.engine.kind} engine, {sc.horizon_s:g} s, "
            f"load {scenario_load(sc):.2f}x"
        )
    for name in bundled_families():
        fam = load_family(name)
        fixed = fam.scenario
        typer.echo(
            f"{name + '@SEED':20s} family: {fam.tenants.min}-{fam.tenants.max} tenants, "
            f"{fixed.engine.get('kind', 'token')} engine, {fixed.horizon_s:g} s, "
            f"load {fam.load.min:g}-{fam.load.max:g}x; seeds {fam.seeds}"
        )
