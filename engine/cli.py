"""``admit fidelity``: the engine's step-time model checked against public measurements (engine/fidelity.py)."""

from __future__ import annotations

from pathlib import Path

import typer


def fidelity(
    out: Path = typer.Option(Path("docs/fidelity.md"), help="where to write the markdown report"),
) -> None:
    """Regenerate the step-time fidelity report (Vidur, BLIS and Lambda checks)."""
    from admit.engine.fidelity import write_report

    checks = write_report(out)
    for c in checks:
        verdict = "PASS" if c.passed else "FAIL"
        typer.echo(f"{verdict}  {c.name}: {100 * abs(c.value):.1f}% (≤ {100 * c.tolerance:.0f}%)")
    typer.echo(f"wrote {out}")
    if not all(c.passed for c in checks):
        raise typer.Exit(1)
