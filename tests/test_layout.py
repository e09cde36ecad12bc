"""The house's rules: which folder may import which, and a gateway process that never imports Gymnasium
(docs/design.md, "One distribution, one folder per concept")."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# folder -> the admit packages its modules may import (besides itself); the layering of docs/design.md
ALLOWED = {
    "core": set(),
    "engine": {"core"},
    "envs": {"core", "engine"},
    "controllers": {"core"},
    "agents": {"core", "controllers", "envs", "engine", "train"},  # train: the store format of the caps it loads
    "train": {"core", "envs", "engine", "controllers", "agents"},
    "evaluate": {"core", "envs", "engine", "controllers", "agents"},
    "gateway": {"core"},
    "emulator": {"core", "engine"},
    "loadgen": {"core"},
    "live": {"core", "envs", "engine", "controllers", "agents", "gateway", "emulator", "loadgen", "evaluate"},
}


def _admit_imports(path: Path) -> set[str]:
    """The admit sub-packages a module imports (at any depth of its body: lazy imports count too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
        for name in names:
            parts = name.split(".")
            if parts[0] == "admit" and len(parts) > 1:
                out.add(parts[1])
    return out


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_a_folder_imports_only_the_layers_below_it(folder: str) -> None:
    bad = {}
    for path in sorted((ROOT / folder).rglob("*.py")):  # every module, verbs and the policy registry included
        extra = _admit_imports(path) - ALLOWED[folder] - {folder}
        if extra:
            bad[str(path.relative_to(ROOT))] = sorted(extra)
    assert not bad, f"imports across the layering of docs/design.md: {bad}"


# The layers `admit evaluate --policy static:best` passes through, lowest first: the tuned caps (agents/) are
# read in the format the search that writes them (train/static_search.py) defines, as a trained policy is.
DOWNHILL = ["core", "engine", "envs", "controllers", "train", "agents", "evaluate"]


def _module_file(name: str) -> Path | None:
    """The file of ``admit.FOLDER.MOD`` in this tree (None for ``admit`` itself or a name that is no module)."""
    parts = name.split(".")[1:]
    if not parts:
        return None
    base = ROOT.joinpath(*parts)
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imported_modules(path: Path) -> set[Path]:
    """The admit modules ``path`` imports, lazily or not, as files."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]  # a module, or a name in one
        else:
            continue
        out |= {f for n in names if n.startswith("admit.") and (f := _module_file(n)) is not None}
    return out


def test_admit_evaluate_static_best_runs_downhill() -> None:
    """Every import on the way from `admit evaluate` to static:best's caps (and on to the search that tunes
    them where none are stored) goes to a lower layer of DOWNHILL or stays in its folder: nothing leads back."""
    todo, seen, bad = [ROOT / "evaluate" / "cli.py"], set(), []
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        here = path.relative_to(ROOT).parts[0]
        for dep in _imported_modules(path):
            there = dep.relative_to(ROOT).parts[0]
            if there != here and DOWNHILL.index(there) > DOWNHILL.index(here):
                bad.append(f"{path.relative_to(ROOT)} -> {dep.relative_to(ROOT)}")
            todo.append(dep)
    reached = {p.relative_to(ROOT).as_posix() for p in seen}
    assert {"agents/static_best.py", "train/static_search.py", "envs/rollout.py"} <= reached  # the path is walked
    assert not bad, f"imports that climb back up on the way to static:best: {bad}"


def _fresh(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120).stdout


def test_the_gateway_process_does_not_import_gymnasium() -> None:
    out = _fresh("import sys, admit.gateway.app, admit.gateway.server, admit.emulator.server, admit.loadgen.worker\n"
                 "print(sorted(m for m in ('gymnasium', 'torch', 'stable_baselines3') if m in sys.modules))")
    assert out.strip() == "[]"


def test_importing_admit_envs_registers_the_env_and_importing_admit_does_not() -> None:
    out = _fresh("import sys, admit\nprint('gymnasium' in sys.modules)\nimport admit.envs, gymnasium\n"
                 "print(gymnasium.make('admit/TenantAdmission-v1').unwrapped.scenario.name)")
    assert out.split() == ["False", "seed-paper"]  # the default scenario
