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

# bounds a hang; a loaded 2-core machine starts Ray in tens of seconds
pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]

RAY = Path(sys.executable).parent / "ray"
needs_ray = pytest.mark.skipif(not RAY.exists(), reason="Ray is not installed (pip install 'admit[ray]'; "
                               "`make test` installs it)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _reread_ray_auth() -> None:
    """Make this process's Ray take RAY_AUTH_MODE and RAY_AUTH_TOKEN from the environment as it is now. Ray
    reads them once and caches them (the C++ RayConfig and token loader); when Ray was imported before this
    module set them (other test modules import it at collection) the driver would keep the old "disabled"
    mode and send no token, and the head refuses it (InvalidAuthToken). A user sets them before starting
    admit, so admit itself needs none of this."""
    if "ray" not in sys.modules:
        return  # nothing is cached yet: Ray will read the environment when it is first used
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A Ray head on 127.0.0.1 with its own (short: Unix socket paths are bounded) temp dir, stopped after."""
    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    port = _free_port()
    # token authentication, Ray's default for a new cluster, on both sides, with a token of this test's own in
    # the environment (the head and this driver read RAY_AUTH_TOKEN; nothing is written to ~/.ray)
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    _reread_ray_auth()
    # the head's workers at normal priority, as `--ray local` starts them (evaluate/ray_jobs.py): Ray's default
    # nice 15 starves them whenever anything else keeps this machine busy
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_worker_niceness": "0"}
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
        _reread_ray_auth()  # later tests' own local Ray instances start as they would have without this one


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
    mechanics; which policies the full report runs is tests/evaluate/test_evaluate.py's matter)."""
    from importlib import resources

    import yaml
    from admit.evaluate import results

    monkeypatch.delenv("ADMIT_LLM_URL", raising=False)
    monkeypatch.setattr(results, "HAND_POLICIES", ("static", "static:16", "aimd"))
    monkeypatch.setattr(results, "baseline", lambda scenario: ("static", None))
    monkeypatch.setattr(results, "learned_policies", lambda scenario: [])
    monkeypatch.setattr(results, "CONTRACT_POLICIES", ())  # nor the contract baselines, where it has contracts
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


@pytest.mark.parametrize("verb", ["evaluate", "results"])
def test_the_ray_option_names_the_extra_to_install(verb: str) -> None:
    res = CliRunner().invoke(app, [verb, "--help"], env={"COLUMNS": "400"})
    assert res.exit_code == 0 and "pip install 'admit[ray]'" in res.output, res.output  # not eaten as markup


TUNE = ["--scenario", "seed-paper", "--timesteps", "512", "--set", "n_envs=1", "--set", "eval.freq=0",
        "--set", "checkpoint_freq=0", "--set", "hyperparams.n_steps=128", "--validation", "2"]
SPACE = {"hyperparams.learning_rate": {"loguniform": [1e-5, 1e-3]}, "hyperparams.gamma": {"uniform": [0.9, 0.999]},
         "hyperparams.batch_size": {"choice": [32, 64, 128]}}


@needs_ray
def test_admit_tune_runs_trials_on_the_cluster_and_writes_the_best_config(cluster: str, tmp_path: Path) -> None:
    import yaml
    from admit.evaluate.offline import evaluate
    from admit.train.config import load_config

    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(SPACE))
    out = tmp_path / "search"
    res = CliRunner().invoke(app, ["tune", *TUNE, "--trials", "3", "--space", str(space), "--ray", cluster,
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    trials = json.loads((out / "trials.json").read_text())
    assert len(trials) == 3 and all(t["status"] == "done" for t in trials)
    assert len({json.dumps(t["point"], sort_keys=True) for t in trials}) == 3  # Optuna proposed three points
    for t in trials:
        assert 1e-5 <= t["point"]["hyperparams.learning_rate"] <= 1e-3
        assert t["point"]["hyperparams.batch_size"] in (32, 64, 128)
        cfg = load_config(Path(t["run_dir"]) / "config.yaml")  # a run folder as admit train writes it
        assert cfg.hyperparams["batch_size"] == t["point"]["hyperparams.batch_size"] and cfg.timesteps == 512
        assert (Path(t["run_dir"]) / "model.zip").is_file()
    best = json.loads((out / "best.json").read_text())["best"]
    assert best["goodput_rps"] == max(t["goodput_rps"] for t in trials)
    assert (out / "best.yaml").read_text() == (Path(best["run_dir"]) / "config.yaml").read_text()
    # the score is what it says: the best policy's goodput on validation seeds 500000, 500001 of seed-paper
    policy = f"ppo:{best['run_dir']}"
    again = evaluate("seed-paper", [policy], 2, seed_base=500_000).to_json()["policies"][policy]["goodput_rps"]
    assert again["mean"] == pytest.approx(best["goodput_rps"], rel=1e-12)
    assert "validation goodput" in res.output and "best.yaml" in res.output


@needs_ray
def test_an_interrupted_tune_resumes_keeping_finished_trials(tmp_path: Path) -> None:
    import signal
    import time

    out = tmp_path / "search"
    cmd = [str(RAY.parent / "admit"), "tune", *TUNE, "--trials", "2", "--concurrent", "1", "--ray", "local",
           "--out", str(out)]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        def finished() -> list[Path]:
            return [p for p in (out / "ray" / "search").glob("*/result.json") if p.stat().st_size > 0]

        deadline = time.monotonic() + 400
        while not finished():  # the first trial reported its score
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "no trial finished"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)  # Ctrl-C: Ray Tune saves the experiment's state and stops
        proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    first = json.loads(finished()[0].read_text().splitlines()[-1])
    model = Path(first["run_dir"]) / "model.zip"
    mtime = model.stat().st_mtime_ns
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=500)
    assert again.returncode == 0, again.stdout + again.stderr
    trials = json.loads((out / "trials.json").read_text())
    assert len(trials) == 2 and all(t["status"] == "done" for t in trials)
    assert first["run_dir"] in [t["run_dir"] for t in trials]
    assert model.stat().st_mtime_ns == mtime  # the finished trial was kept, not trained again
    # another search on the same folder is refused, not mixed in
    other = subprocess.run([*cmd[:-2], "--seed", "1", "--out", str(out)], capture_output=True, text=True, env=env,
                           timeout=300)
    assert other.returncode == 2 and "holds another search" in other.stderr, other.stderr


def test_admit_tune_refuses_a_bad_space_before_any_work(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    out = tmp_path / "search"
    for body, needle in (("hyperparams.learning_rate: {loguniform: [0, 1.0e-3]}", "loguniform needs low > 0"),
                         ("hyperparams.gamma: {normal: [0.9, 0.99]}", "expected one of loguniform, uniform, int"),
                         ("hyperparams.gamma: {uniform: [0.99, 0.9]}", "low < high"),
                         ("hyperparams.gamma: {uniform: [0.9, 1.5]}", "invalid training config"),
                         ("hyperparams.no_such: {choice: [1, 2]}", "no_such")):
        space.write_text(body)
        res = CliRunner().invoke(app, ["tune", *TUNE, "--trials", "2", "--space", str(space), "--out", str(out)])
        assert res.exit_code == 2 and needle in res.output, (body, res.output)
    assert not out.exists()
