"""The README's Python example runs as written, from any working directory.

A folder named ``admit`` in the working directory (the folder that holds a clone called admit, say) is a
namespace package to Python's path finder, which answers before an editable install's finder is asked
(pypa/setuptools#3557): ``admit`` is then that folder, and ``admit/__init__.py`` never runs. ``admit.envs``
still resolves, through the install's mapping (or the clone itself), and registers the env, so the example
works there too; nothing it needs may live in the package root.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _readme_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks, "README.md has no ```python block"
    return blocks[0]


@pytest.mark.parametrize("beside", ["nothing", "a folder named admit", "a clone named admit"])
def test_the_readme_python_example_runs_from_any_folder(tmp_path: Path, beside: str) -> None:
    if beside == "a folder named admit":
        (tmp_path / "admit").mkdir()
    elif beside == "a clone named admit":
        (tmp_path / "admit").symlink_to(ROOT, target_is_directory=True)  # the folder holding this checkout
    run = subprocess.run([sys.executable, "-c", _readme_example()], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert "'goodput'" in run.stdout  # the example prints the reward terms and the limits
