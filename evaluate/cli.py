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
    plot: Path | None = typer.Option(None, help="write a Pareto plot here: goodput vs the worst tenant's attainment"),
    workers: int = typer.Option(1, min=1, help="worker processes"),
    horizon_s: float | None = typer.Option(
        None, min=1.0, help="simulated seconds per episode instead of the scenario's horizon (a quicker look)"
    ),
) -> None:
    """Evaluate policies offline on many seeds with common random numbers and paired tests."""
    from admit.envs.scenario import ScenarioError, load_scenario
    from admit.evaluate.offline import evaluate as run_eval
    from admit.evaluate.offline import write_json
    from admit.evaluate.report import pareto_plot, print_table
    from rich.progress import Progress

    try:
        sc = load_scenario(scenario) if horizon_s is None else load_scenario(scenario, horizon_s=horizon_s)
        with Progress(transient=True) as bar:
            task = bar.add_task("evaluating", total=len(policy) * seeds)
            ev = run_eval(sc, policy, seeds, seed_base, workers, progress=lambda i, n: bar.update(task, completed=i))
    except (ScenarioError, ValueError) as e:
        _fail(str(e))
    data = write_json(ev, out)
    print_table(data)
    typer.echo(f"wrote {out}")
    if plot is not None:
        pareto_plot(data, plot)
        typer.echo(f"wrote {plot}")


def results(
    seeds: int = typer.Option(20, min=2, help="evaluation seeds per scenario"),
    scenario: list[str] = typer.Option(
        None, help="scenario (repeat); default: seed-paper and every bundled token-engine scenario"
    ),
    extra_scenario: list[str] = typer.Option(
        None, help="a scenario to add to those (repeat): a bundled name, a YAML path or a family instance FAMILY@SEED"
    ),
    workers: int = typer.Option(2, min=1, help="worker processes"),
    out: Path = typer.Option(Path("docs/RESULTS.md"), help="the report to write"),
) -> None:
    """Regenerate docs/RESULTS.md: every policy × the results scenarios on goodput, CIs, p-values and verdicts vs
    static:best, per-tenant figures, Pareto plots."""
    from admit.evaluate.results import build, default_scenarios
    from rich.progress import Progress

    chosen = list(dict.fromkeys([*(scenario or default_scenarios()), *(extra_scenario or [])]))
    try:
        with Progress(transient=True) as bar:
            task = bar.add_task("results", total=None)
            build(seeds, chosen, workers, out, progress=lambda i, n: bar.update(task, completed=i, total=n))
    except ValueError as e:  # a scenario that does not load (ScenarioError) or a policy that cannot run
        _fail(str(e))
    typer.echo(f"wrote {out}")
