"""`admit evaluate --ray`: the episodes as Ray tasks on a real local Ray cluster (`ray start --head` on
127.0.0.1, two CPUs), figure for figure the local evaluation's."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from admit.cli import app

pytestmark = pytest.mark.timeout(600)  # bounds a hang; a loaded 2-core machine starts Ray in tens of seconds

RAY = Path(sys.executable).parent / "ray"
needs_ray = pytest.mark.skipif(not RAY.exists(), reason="Ray is not installed (pip install 'admit[ray]'; "
                               "`make test` installs it)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A Ray head on 127.0.0.1 with its own (short: Unix socket paths are bounded) temp dir, stopped after."""
    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    port = _free_port()
    # token authentication, Ray's default for a new cluster, on both sides, with a token of this test's own in
    # the environment (the head and this driver read RAY_AUTH_TOKEN; nothing is written to ~/.ray)
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    start = subprocess.run(
        [str(RAY), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
         "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={tmp}"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert start.returncode == 0, start.stdout + start.stderr
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([str(RAY), "stop", "--force"], capture_output=True, env=env, timeout=120)
        shutil.rmtree(tmp, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _evaluate(out: Path, *extra: str) -> dict:
    res = CliRunner().invoke(app, ["evaluate", "--scenario", "seed-paper", "--policy", "static", "--policy",
                                   "static:best", "--policy", "aimd", "--seeds", "4", "--out", str(out), *extra])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    data.pop("wall_s", None)
    return data


@needs_ray
def test_episodes_on_a_ray_cluster_are_the_local_evaluation_figure_for_figure(cluster: str, tmp_path: Path) -> None:
    local = _evaluate(tmp_path / "local.json")
    on_ray = _evaluate(tmp_path / "ray.json", "--ray", cluster)
    assert on_ray == local  # every per-seed value, interval, p-value and verdict
    assert len(local["policies"]["aimd"]["goodput_rps"]["values"]) == 4


@needs_ray
def test_a_ray_address_nobody_listens_on_is_refused_at_once_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    for address, needle in ((f"127.0.0.1:{_free_port()}", "nothing accepts connections there"),
                            ("no-port", "expected 'local', 'auto', HOST:PORT")):
        res = CliRunner().invoke(app, ["evaluate", "--scenario", "seed-paper", "--policy", "static", "--seeds", "2",
                                       "--ray", address, "--out", str(out)])
        assert res.exit_code == 2 and needle in res.output, res.output
    res = CliRunner().invoke(app, ["evaluate", "--scenario", "seed-paper", "--policy", "static", "--seeds", "2",
                                   "--ray", "local", "--workers", "2", "--out", str(out)])
    assert res.exit_code == 2 and "give --workers or --ray, not both" in res.output, res.output
    assert not out.exists()


def _results(monkeypatch: pytest.MonkeyPatch, tmp: Path, *extra: str) -> tuple[str, dict]:
    """`admit results` on a one-minute three-tenant scenario and three hand-written policies (the report's
    mechanics; which policies the full report runs is tests/test_evaluate.py's matter)."""
    from importlib import resources

    import yaml
    from admit.evaluate import results

    monkeypatch.delenv("ADMIT_LLM_URL", raising=False)
    monkeypatch.setattr(results, "HAND_POLICIES", ("static", "static:16", "aimd"))
    monkeypatch.setattr(results, "baseline", lambda scenario: ("static", None))
    monkeypatch.setattr(results, "learned_policies", lambda scenario: [])
    raw = yaml.safe_load(resources.files("admit.envs").joinpath("scenarios", "h200-mixed.yaml").read_text())
    tmp.mkdir()
    path = tmp / "mixed-short.yaml"
    path.write_text(yaml.safe_dump({**raw, "name": "mixed-short", "horizon_s": 60}))
    out = tmp / "docs" / "RESULTS.md"
    res = CliRunner().invoke(app, ["results", "--seeds", "3", "--scenario", str(path), "--out", str(out), *extra])
    assert res.exit_code == 0, res.output
    data = json.loads((out.parent / "results" / "mixed-short.json").read_text())
    data.pop("wall_s")
    return out.read_text(), data


@needs_ray
def test_admit_results_on_ray_is_the_local_report(cluster: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from admit.evaluate import ray_jobs

    text, local = _results(monkeypatch, tmp_path / "local", "--workers", "1")
    calls: list[int] = []
    run = ray_jobs.run_episodes
    monkeypatch.setattr(ray_jobs, "run_episodes", lambda sc, jobs, *a, **k: calls.append(len(jobs)) or run(
        sc, jobs, *a, **k))
    ray_text, on_ray = _results(monkeypatch, tmp_path / "ray", "--ray", cluster)
    assert calls == [9]  # the episodes did go to Ray: 3 policies x 3 seeds
    assert on_ray == local and len(local["policies"]["aimd"]["goodput_rps"]["values"]) == 3
    # the report says how it ran; apart from that line, the command line and the paths it is the same text
    assert f"--ray {cluster}" in ray_text and f"Wall time of this run (Ray ({cluster})):" in ray_text

    def body(t: str, where: Path) -> list[str]:
        return [x.replace(str(where), "") for x in t.splitlines()
                if not x.startswith(("Regenerated by", "Wall time of this run"))]

    assert body(ray_text, tmp_path / "ray") == body(text, tmp_path / "local")


def test_admit_results_refuses_workers_and_ray_together(tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    res = CliRunner().invoke(app, ["results", "--seeds", "2", "--scenario", "seed-paper", "--ray", "local",
                                   "--workers", "2", "--out", str(out)])
    assert res.exit_code == 2 and "give --workers or --ray, not both" in res.output, res.output
    assert not out.exists()

