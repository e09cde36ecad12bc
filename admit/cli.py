"""The `admit` command line: one verb per capability."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="admit: learned admission control for multi-tenant LLM serving.")


@app.command()
def version() -> None:
    """Print admit's version."""
    from admit import __version__

    typer.echo(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
