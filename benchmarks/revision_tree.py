"""A git revision's files as an importable ``admit`` package, for the benchmarks that time old code beside new.

``extract(rev, into)`` writes ``git archive REV`` to ``into/admit`` and returns ``into``: put it on PYTHONPATH
(and run from ``into/admit``) and ``import admit`` is that revision's code.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def extract(rev: str, into: Path) -> Path:
    (into / "admit").mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into / "admit")], input=archive, check=True)
    return into
