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
