"""The benchmarks' peers model what admit models: a peer that served other requests would make a speed ratio
meaningless, so these check the peers against admit's simulator on the same seeds."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from admit.envs.scenario import load_scenario
from admit.evaluate.offline import rollout

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def simpy_peer():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import simpy_peer

        yield simpy_peer
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.mark.parametrize("policy", ["static", "naive", "differentiated"])
def test_simpy_peer_serves_the_same_requests_as_admit_seed_by_seed(simpy_peer, policy: str) -> None:
    sc = load_scenario("seed-paper", horizon_s=600.0)
    for seed in (0, 1):
        ours, peer = rollout(sc, policy, seed), simpy_peer.simpy_rollout(sc, policy, seed)
        for metric in ("throughput_rps", "p99_s", "p50_s", "dropped"):
            assert peer[metric] == pytest.approx(ours[metric], rel=1e-9, abs=1e-12), (policy, seed, metric)
    assert ours["dropped"] > 0 or policy == "static"  # the heuristics shed load: the gate and timeouts matter


def test_family_train_speed_measures_the_steps_it_was_asked_for_and_splits_them() -> None:
    """One measurement of benchmarks/family_train_speed.py on a tiny family recipe: the steps timed are the
    steps asked for (whole rollouts), and the rollout and update phases account for the wall time."""
    import json
    import subprocess

    sets = ["n_envs=2", "hyperparams.n_steps=16", "hyperparams.batch_size=16", "hyperparams.n_epochs=1",
            "policy.hidden=8", "vec_env=dummy", "update_threads=2"]
    arg = json.dumps(["train/configs/ppo-general-fast.yaml", sets, 64])
    out = subprocess.run([sys.executable, str(BENCHMARKS / "family_train_speed.py"), "--child", arg],
                         cwd=BENCHMARKS.parent, capture_output=True, text=True, timeout=600, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["steps"] == 64 and res["steps_per_s"] == pytest.approx(64 / res["wall_s"])
    assert res["rollout_s"] > 0 and res["update_s"] > 0
    phases = res["rollout_s"] + res["update_s"]
    assert 0.7 * res["wall_s"] <= phases <= res["wall_s"] + 1e-6  # learn's own set-up is the rest
    assert res["trainer_max_rss_mb"] > 50
