"""The `admit` command line: one root that assembles the verbs each folder defines in its own cli.py."""

from __future__ import annotations

import typer

from admit.emulator.cli import emulate
from admit.engine.cli import fidelity
from admit.envs.cli import scenarios
from admit.evaluate.cli import evaluate, results
from admit.gateway.cli import gateway
from admit.live.cli import calibrate, control, demo, protocol, sim2live
from admit.loadgen.cli import app as loadgen_app
from admit.train.cli import search_static, train, tune

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="admit: learned admission control for multi-tenant LLM serving.",
    pretty_exceptions_enable=False,
)
app.add_typer(loadgen_app, name="loadgen")
for verb in (scenarios, evaluate, results, train, tune, search_static, fidelity, calibrate, emulate, gateway, control,
             demo, protocol, sim2live):
    app.command()(verb)
# The caps search's former name: command lines written before it became search-static keep working, unlisted.
app.command("tune-static", hidden=True)(search_static)


@app.command()
def version() -> None:
    """Print admit's version."""
    from admit import __version__

    typer.echo(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
