"""The `admit` command line: one verb per capability."""

from __future__ import annotations

from pathlib import Path

import typer

from admit.emulator.cli import emulate
from admit.envs.fidelity import fidelity
from admit.gateway.cli import gateway
from admit.gateway.control_cli import control
from admit.gateway.demo import demo
from admit.gateway.sim2live import sim2live
from admit.loadgen.cli import app as loadgen_app
from admit.train.cli import train

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="admit: learned admission control for multi-tenant LLM serving.",
    pretty_exceptions_enable=False,
)
app.add_typer(loadgen_app, name="loadgen")
app.command()(fidelity)
app.command()(gateway)
app.command()(control)
app.command()(demo)
app.command()(sim2live)
app.command()(train)
app.command()(emulate)


def _fail(msg: str) -> None:
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


@app.command()
def version() -> None:
    """Print admit's version."""
    from admit import __version__

    typer.echo(__version__)


@app.command()
def scenarios() -> None:
    """List the bundled scenarios."""
    from admit.envs.scenario import bundled_scenarios, load_scenario

    for name in bundled_scenarios():
        sc = load_scenario(name)
        typer.echo(f"{name:20s} {len(sc.tenants)} tenants, {sc.engine.kind} engine, {sc.horizon_s:g} s")


@app.command()
def evaluate(
    scenario: str = typer.Option(..., help="bundled scenario name or path to a scenario YAML"),
    policy: list[str] = typer.Option(..., help="policy to evaluate (repeat); the first is the baseline"),
    seeds: int = typer.Option(20, min=1, help="number of evaluation seeds"),
    seed_base: int = typer.Option(0, help="first seed; seeds are seed_base .. seed_base+seeds-1"),
    out: Path = typer.Option(Path("results.json"), help="where to write the JSON results"),
    plot: Path | None = typer.Option(None, help="write a Pareto plot (PNG) here"),
    workers: int = typer.Option(1, min=1, help="worker processes"),
) -> None:
    """Evaluate policies offline on many seeds with common random numbers and paired tests."""
    from rich.progress import Progress

    from admit.envs.scenario import ScenarioError
    from admit.train.evaluate import evaluate as run_eval
    from admit.train.evaluate import write_json
    from admit.train.report import pareto_plot, print_table

    try:
        with Progress(transient=True) as bar:
            task = bar.add_task("evaluating", total=len(policy) * seeds)
            ev = run_eval(
                scenario, policy, seeds, seed_base, workers, progress=lambda i, n: bar.update(task, completed=i)
            )
    except (ScenarioError, ValueError) as e:
        _fail(str(e))
    data = write_json(ev, out)
    print_table(data)
    typer.echo(f"wrote {out}")
    if plot is not None:
        pareto_plot(data, plot)
        typer.echo(f"wrote {plot}")


@app.command()
def results(
    seeds: int = typer.Option(20, min=2, help="evaluation seeds per scenario"),
    scenario: list[str] = typer.Option(None, help="scenario (repeat); default: the four in RESULTS.md"),
    workers: int = typer.Option(2, min=1, help="worker processes"),
    out: Path = typer.Option(Path("docs/RESULTS.md"), help="the report to write"),
) -> None:
    """Regenerate docs/RESULTS.md: every policy × the results scenarios, CIs, p-values vs static, Pareto plots."""
    from rich.progress import Progress

    from admit.train.results import SCENARIOS, build

    with Progress(transient=True) as bar:
        task = bar.add_task("results", total=None)
        chosen = list(scenario or SCENARIOS)
        build(seeds, chosen, workers, out, progress=lambda i, n: bar.update(task, completed=i, total=n))
    typer.echo(f"wrote {out}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
