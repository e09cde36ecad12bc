"""``python -m admit.emulator``: the same command as ``admit emulate``."""

from __future__ import annotations

import typer
from admit.emulator.cli import emulate


def main() -> None:
    typer.run(emulate)


if __name__ == "__main__":
    main()
