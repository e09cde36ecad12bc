"""``admit evaluate`` (policies on many seeds, evaluate/offline.py) and ``admit results`` (docs/RESULTS.md,
evaluate/results.py)."""

from __future__ import annotations

from pathlib import Path

import typer


def _fail(msg: str) -> None:
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def evaluate(
    scenario: str = typer.Option(..., help="bundled scenario name or path to a scenario YAML"),
    policy: list[str] = typer.Option(..., help="policy to evaluate (repeat); the first is the baseline"),
    seeds: int = typer.Option(20, min=1, help="number of evaluation seeds"),
    seed_base: int = typer.Option(0, help="first seed; seeds are seed_base .. seed_base+seeds-1"),
    out: Path = typer.Option(Path("results.json"), help="where to write the JSON results"),
    plot: Path | None = typer.Option(
        None, help="write a Pareto plot here: goodput vs the worst tenant's attainment (with contracts: vs the "
        "contract shortfall)"),
    lending_plot: Path | None = typer.Option(
        None, help="where the tenants have contracts, draw each tenant's concurrency borrowed and lent over time "
        "here, per policy (the mean over the seeds)"),
    workers: int = typer.Option(1, min=1, help="worker processes"),
    horizon_s: float | None = typer.Option(
        None, min=1.0, help="simulated seconds per episode instead of the scenario's horizon (a quicker look)"
    ),
    ray: str | None = typer.Option(
        None, help="run the episodes as Ray tasks (pip install 'admit\\[ray]'): 'local' (a Ray instance on this "
        "machine for the run), 'auto' (RAY_ADDRESS or a running `ray start`), or a head's HOST:PORT; same figures"
    ),
) -> None:
    """Evaluate policies offline on many seeds with common random numbers and paired tests."""
    from admit.envs.scenario import ScenarioError, load_scenario
    from admit.evaluate.offline import evaluate as run_eval
    from admit.evaluate.offline import lending_series, write_json
    from admit.evaluate.report import lending_plot as draw_lending
    from admit.evaluate.report import pareto_plot, print_table
    from rich.progress import Progress

    try:
        sc = load_scenario(scenario) if horizon_s is None else load_scenario(scenario, horizon_s=horizon_s)
        if lending_plot is not None and not sc.has_contracts:  # said before any episode runs
            raise ValueError(f"--lending-plot: {sc.name} has no tenant with a contract, so nothing is borrowed or "
                             "lent (both are measured against each contract's nominal share; give tenants a "
                             "contract: block)")
        with Progress(transient=True) as bar:
            task = bar.add_task("evaluating", total=len(policy) * seeds)
            ev = run_eval(sc, policy, seeds, seed_base, workers, progress=lambda i, n: bar.update(task, completed=i),
                          ray=ray)
    except (ScenarioError, ValueError, RuntimeError) as e:
        _fail(str(e))
    data = write_json(ev, out)
    print_table(data)
    typer.echo(f"wrote {out}")
    if plot is not None:
        pareto_plot(data, plot)
        typer.echo(f"wrote {plot}")
    if lending_plot is not None:
        draw_lending(lending_series(ev), lending_plot, sc.name)
        typer.echo(f"wrote {lending_plot}")


def results(
    seeds: int = typer.Option(20, min=2, help="evaluation seeds per scenario"),
    scenario: list[str] = typer.Option(
        None, help="scenario (repeat); default: seed-paper and every bundled token-engine scenario"
    ),
    extra_scenario: list[str] = typer.Option(
        None, help="a scenario to add to those (repeat): a bundled name, a YAML path or a family instance FAMILY@SEED"
    ),
    workers: int | None = typer.Option(None, min=1, help="worker processes (default 2)"),
    ray: str | None = typer.Option(
        None, help="run the episodes as Ray tasks (pip install 'admit\\[ray]') on one Ray session for the whole "
        "report: 'local', 'auto' or a head's HOST:PORT (as admit evaluate --ray); same figures as --workers"
    ),
    out: Path = typer.Option(Path("docs/RESULTS.md"), help="the report to write"),
    render_only: bool = typer.Option(
        False, help="write the report from the JSON an earlier run left beside it, without running anything"
    ),
    rerun: list[str] = typer.Option(
        None, help="evaluate again only this policy (repeat; 'ppo:' names every ppo: policy) and the baseline, "
        "keeping the other rows of the earlier run's JSON; refused if the baseline's figures changed"
    ),
) -> None:
    """Regenerate docs/RESULTS.md: every policy × the results scenarios on goodput, CIs, p-values and verdicts vs
    static:best, per-tenant figures, Pareto plots."""
    from admit.evaluate.results import build, default_scenarios
    from rich.progress import Progress

    chosen = list(dict.fromkeys([*(scenario or default_scenarios()), *(extra_scenario or [])]))
    if ray is not None and workers is not None:
        _fail(f"give --workers or --ray, not both (--workers {workers}, --ray {ray}): on Ray the cluster's CPUs are "
              "the workers")
    try:
        with Progress(transient=True) as bar:
            task = bar.add_task("results", total=None)
            build(seeds, chosen, workers or (1 if ray is not None else 2), out,
                  progress=lambda i, n: bar.update(task, completed=i, total=n),
                  render_only=render_only, rerun=rerun or (), ray=ray)
    except ValueError as e:  # a scenario that does not load (ScenarioError) or a policy that cannot run
        _fail(str(e))
    typer.echo(f"wrote {out}")
