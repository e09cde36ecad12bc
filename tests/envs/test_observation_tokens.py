"""The simulator's token features (Observation layout 2) against the requests they summarise, and the
preemption window's arithmetic."""

from __future__ import annotations

import math

import pytest
from admit.core.observation import LAYOUT_VERSION, LAYOUTS, Observation, layout_of
from admit.core.telemetry import PreemptionWindow
from admit.envs.scenario import load_scenario
from admit.envs.simulation import Simulation


def _requests_in(sim: Simulation) -> tuple[list, list]:
    """The requests queued at the admission core, and those in the engine (dispatched, not finished)."""
    queued = [p for st in sim.core._t for q in (st.queue, st.excess) for _, _, p in q]
    engine = sim.engine
    in_engine = list(engine.running()) + list(engine.waiting())
    return queued, in_engine


@pytest.mark.parametrize("name", ["h200-mixed", "long-context-chat"])
def test_footprints_are_the_sums_over_the_requests(name: str) -> None:
    sc = load_scenario(name, horizon_s=120)
    sim = Simulation(sc, 3)
    seen_prefill = seen_queue = False
    for step in range(int(120 / sc.interval_s) - 1):
        # hold the limits low for a while so that the admission queues fill, then open them
        limits = [sc.limits.min] * len(sc.tenants) if step < 20 else [sc.limits.max] * len(sc.tenants)
        sim.set_limits(limits)
        sim.advance(sim.now + sc.interval_s)
        obs = sim.observe()
        queued, in_engine = _requests_in(sim)
        for i, t in enumerate(obs.tenants):
            q = sum(r.prompt_tokens for r in queued if r.tenant == i)
            held = sum(r.prompt_tokens + r.generated for r in in_engine if r.tenant == i)
            prefill = sum(r.prompt_tokens for r in in_engine if r.tenant == i and math.isnan(r.first_token))
            assert (t.prompt_tokens_queued, t.tokens_in_flight, t.prefill_tokens) == (q, held, prefill)
            assert t.in_flight == sum(1 for r in in_engine if r.tenant == i)
            seen_prefill |= prefill > 0
            seen_queue |= q > 0
        assert obs.prefill_tokens_waiting == sum(t.prefill_tokens for t in obs.tenants)
        assert obs.preemptions >= 0
    assert seen_prefill and seen_queue  # the scenario exercised both


def test_window_features_of_completions() -> None:
    sc = load_scenario("h200-mixed", horizon_s=60)
    sim = Simulation(sc, 1)
    sim.advance(40.0)
    obs = sim.observe()
    w = sc.window_s
    for i, t in enumerate(obs.tenants):
        done = [r for r in sim.requests if r.tenant == i and r.finished == r.finished and r.finished > 40.0 - w]
        assert t.completions == len(done)
        assert t.output_tokens_per_s == pytest.approx(sum(r.output_tokens for r in done) / w)
        spec = sim.spec.tenants[i]
        assert (t.slo_ttft, t.slo_tpot) == (spec.slo_ttft_s if spec.slo_ttft_s != math.inf else 1e4,
                                             spec.slo_tpot_s if spec.slo_tpot_s != math.inf else 1e4)
        assert 0 <= t.goodput <= t.completions / w + 1e-9


def test_layouts_are_prefixes_and_old_vectors_are_built_by_selection() -> None:
    sc = load_scenario("h200-mixed", horizon_s=30)
    sim = Simulation(sc, 0)
    sim.advance(20.0)
    obs = sim.observe()
    v2, v1 = obs.to_vector(), obs.to_vector(layout=1)
    n = len(sc.tenants)
    assert len(v2) == Observation.vector_size(n) and len(v1) == Observation.vector_size(n, 1) == 3 + 17 * n
    assert (v2[Observation.layout_index(n, 1)] == v1).all()
    assert layout_of(len(v1), n) == 1 and layout_of(len(v2), n) == LAYOUT_VERSION and layout_of(7, n) is None
    for version, (g, t) in LAYOUTS.items():
        g2, t2 = LAYOUTS[LAYOUT_VERSION]
        assert g2[: len(g)] == g and t2[: len(t)] == t, f"layout {version} is not a prefix of the current one"


def test_preemption_window_counts_the_growth_within_it() -> None:
    w = PreemptionWindow(10.0)
    assert w.count(0.0) == 0
    w.add(0.0, 5)
    assert w.count(0.0) == 0  # one sample: no growth seen yet
    w.add(4.0, 8)
    w.add(8.0, 8)
    assert w.count(8.0) == 3
    w.add(13.0, 9)  # the window now starts at 3 s: the sample at 0 s is still the base before it
    assert w.count(13.0) == 4
    w.add(16.0, 12)  # starts at 6 s: the base is the 4 s sample (8)
    assert w.count(16.0) == 4
