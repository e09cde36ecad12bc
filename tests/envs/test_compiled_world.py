"""The compiled world (envs/compiled.py, envs/kernels.py) against the Python world it transcribes.

The claim is bit-identical episodes: the same observation vectors, interval counts, limits, episode and
tenant summaries and request timestamps, decision by decision, under random actions that push limits to
both bounds. The scenarios are chosen to reach every path of the kernels: macro-steps (h200-mixed), heavy
KV preemption (long-context-chat and a family instance), queue timeouts and rejections (servegen-skewed's
queues under low limits), many tenants (servegen-skewed, 8), and contracts, whose in-contract requests
overtake the same tenant's queued excess (``CONTRACTS``: contracts below the tenants' rates, so a good part
of their requests is excess).
"""

from __future__ import annotations

import math
import platform
from pathlib import Path

import admit.envs  # noqa: F401  (registers the env ids)
import gymnasium as gym
import numpy as np
import pytest
from admit.agents.registry import make_controller
from admit.core.loop import run_loop
from admit.core.observation import Observation
from admit.envs.compiled import CompiledSimulation, _rule_of, make_simulation
from admit.envs.scenario import Scenario, load_scenario, parse_scenario
from admit.envs.simulation import SimulatedWorld, Simulation, decision_count, in_contract

CPU_DUO = Path(__file__).resolve().parents[2] / "live" / "scenarios" / "cpu-smollm2-duo.yaml"


# per scenario, contracts on some of its tenants (the others send everything in their one queue)
CONTRACTS: dict[str, dict[str, dict[str, float]]] = {
    "seed-paper": {"bursty": {"requests_per_s": 0.1, "burst": 3, "attainment": 0.9}},
    "h200-mixed": {"chat": {"requests_per_s": 1.2, "burst": 4, "attainment": 0.95},
                   "agent": {"tokens_per_s": 3000, "burst": 8000, "attainment": 0.9}},
    "servegen-skewed": {"client-61": {"requests_per_s": 0.2, "burst": 2, "attainment": 0.9},
                        "client-143": {"tokens_per_s": 500, "burst": 2000, "attainment": 0.9},
                        "client-34": {"requests_per_s": 0.05, "burst": 1, "attainment": 0.5}},
}


def _scenario(name: str, horizon_s: float, max_queue: int | None = None, contracts: bool = False,
              **update: float) -> Scenario:
    sc = load_scenario(name).model_copy(update={"horizon_s": horizon_s, **update})
    if max_queue is not None:  # short queues: offers are rejected as well as timed out
        sc = sc.model_copy(update={"admission": sc.admission.model_copy(update={"max_queue": max_queue})})
    if contracts:
        data = sc.model_dump(exclude_none=True)
        for t in data["tenants"]:
            if t["name"] in CONTRACTS[name]:
                t["contract"] = CONTRACTS[name][t["name"]]
        sc = parse_scenario(data, f"{name} with contracts")
    return sc


def _random_episode(name: str, seed: int, horizon_s: float, max_queue: int | None = None, contracts: bool = False,
                    **update: float) -> tuple[Simulation, CompiledSimulation, int]:
    sc = _scenario(name, horizon_s, max_queue, contracts, **update)
    py, cw = Simulation(sc, seed), CompiledSimulation(sc, seed)
    rng = np.random.default_rng(seed)
    k = sc.limits.max_step
    n = len(sc.tenants)
    steps = 0
    assert np.array_equal(np.asarray(py.observe_values()), cw.observe_values())
    while not py.done:
        deltas = rng.integers(-k, k + 1, size=n).tolist()
        if steps % 2:  # the env's fused call
            limits, values, counts = cw.step_observed(deltas)
            assert py.step(deltas) == limits
            want = py.observe_values()
            got_counts = counts.tolist()
        else:  # step, observe and count as three calls (what Simulation.run does)
            limits = cw.step(deltas)
            assert py.step(deltas) == limits
            want, values = py.observe_values(), cw.observe_values()
            got_counts = [[c.arrived, c.completed, c.dropped, c.rejected, c.slo_violations, c.good, c.output_tokens]
                          for c in cw.take_interval_totals()]
        bad = np.flatnonzero(np.asarray(want) != values)
        assert bad.size == 0, f"{name} seed {seed} t={py.now}: observation entries {bad[:8].tolist()} differ"
        want_counts = [[c.arrived, c.completed, c.dropped, c.rejected, c.slo_violations, c.good, c.output_tokens]
                       for c in py.take_interval_totals()]
        assert got_counts == want_counts, f"{name} seed {seed} t={py.now}"
        steps += 1
    assert cw.done and cw.now == py.now
    return py, cw, steps


@pytest.mark.parametrize(("name", "seed", "horizon_s", "max_queue", "contracts"), [
    ("seed-paper", 0, 1800.0, None, False),  # the slot engine
    ("seed-paper", 5, 1800.0, 2, False),
    ("h200-mixed", 0, 600.0, None, False),
    ("long-context-chat", 3, 600.0, None, False),
    ("h200-mix@5", 3, 600.0, None, False),
    ("h200-mix@11002", 1, 600.0, None, False),
    ("servegen-skewed", 1, 300.0, None, False),
    ("servegen-skewed", 2, 300.0, 3, False),
    (str(CPU_DUO), 4, 300.0, None, False),  # the cpu-smollm2 preset: a front-end delay (preset.frontend_delay_s)
    ("seed-paper", 0, 1800.0, None, True),  # contracts: two classes in each queue
    ("h200-mixed", 0, 600.0, None, True),
    ("servegen-skewed", 2, 300.0, 3, True),
])
def test_random_episode_is_bit_identical(name: str, seed: int, horizon_s: float, max_queue: int | None,
                                         contracts: bool) -> None:
    py, cw, steps = _random_episode(name, seed, horizon_s, max_queue, contracts)
    assert steps > 100
    assert py.summary() == cw.summary()
    assert py.tenant_summary() == cw.tenant_summary()
    for a, b in zip(py.totals, cw.totals, strict=True):
        assert (list(a.e2e), list(a.ttft), list(a.tpot)) == (list(b.e2e), list(b.ttft), list(b.tpot))
    fields = ("rid", "tenant", "arrival", "prompt_tokens", "output_tokens", "u_service", "dispatched",
              "first_scheduled", "first_token", "finished", "preemptions")
    for a, b in zip(py.requests, cw.requests, strict=True):
        va, vb = (tuple(getattr(r, f) for f in fields) for r in (a, b))
        assert va == vb or all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(va, vb, strict=True))
    assert cw.num_preemptions == py.engine.num_preemptions


@pytest.mark.parametrize(("interval_s", "window_s"), [(15.0, 10.0), (7.0, 10.0), (0.5, 10.0)])
def test_windows_that_turn_over_between_decisions_are_bit_identical(interval_s: float, window_s: float) -> None:
    """The sorted windows take in a decision's completions in one merge (kernels._sync_window). With the
    interval longer than the window every summary starts a fresh window; with the two close most of it
    changes; a short interval changes a little at a time. The busiest tenant's window holds far more than
    the 24 values up to which the kernels sort by insertion (heapsort beyond)."""
    py, cw, steps = _random_episode("servegen-skewed", 4, 240.0, interval_s=interval_s, window_s=window_s)
    assert steps >= 240.0 / interval_s - 1
    assert py.summary() == cw.summary()
    samples = Observation.from_vector(cw.observe_values(), cw.now, window_s).tenants
    assert max(t.samples for t in samples) > 100


def test_the_paths_the_scenarios_were_chosen_for_are_reached() -> None:
    """Preemptions, queue-timeout drops and rejections all happen in the episodes above (else the
    comparison would not cover them)."""
    _, cw, _ = _random_episode("long-context-chat", 3, 600.0)
    assert cw.num_preemptions > 50
    assert _random_episode("h200-mix@11002", 1, 600.0)[1].summary()["timeouts"] > 0
    assert _random_episode("servegen-skewed", 2, 300.0, 3)[1].summary()["rejected"] > 0
    for name, seed, horizon_s, max_queue in (("seed-paper", 0, 1800.0, None), ("h200-mixed", 0, 600.0, None),
                                             ("servegen-skewed", 2, 300.0, 3)):
        assert _overtaken(*_random_episode(name, seed, horizon_s, max_queue, True)[:2]) > 0, name


def _overtaken(py: Simulation, cw: CompiledSimulation) -> int:
    """How many excess requests an in-contract request of the same tenant that arrived after it was dispatched
    before (the two classes' path), checked equal in both worlds' request records."""
    cols = cw.request_columns()
    inside = in_contract(cw.scenario, cols.tenant, cols.arrival, cols.prompt, cols.output)
    counts = []
    for reqs in (py.requests, cw.requests):
        n = 0
        latest_excess: dict[int, float] = {}  # per tenant: the latest dispatch of an earlier excess request
        for r, inc in zip(reqs, inside, strict=True):
            if not inc and not math.isnan(r.dispatched):
                latest_excess[r.tenant] = max(latest_excess.get(r.tenant, -math.inf), r.dispatched)
            elif inc and r.dispatched < latest_excess.get(r.tenant, -math.inf):
                n += 1
        counts.append(n)
    assert counts[0] == counts[1]
    return counts[0]


class Recorded(SimulatedWorld):
    """The simulator as the decision loop's World, keeping the limits each decision set and every tenant's
    running totals after its interval (``IntervalCounts`` order), as ``kernels.run_rule`` records them."""

    def __init__(self, sim: Simulation | CompiledSimulation) -> None:
        super().__init__(sim)
        self.limits: list[list[int]] = []
        self.totals: list[list[list[int]]] = []

    def apply(self, deltas: list[int]) -> list[int]:
        self.limits.append(out := super().apply(deltas))
        return out

    def advance(self) -> None:
        super().advance()
        self.totals.append([[t.arrived, t.completed, t.dropped, t.rejected, t.slo_violations, t.good,
                             t.output_tokens] for t in self.sim.totals])


@pytest.mark.parametrize("policy", ["static", "static:3", "naive", "differentiated"])
@pytest.mark.parametrize("name", ["seed-paper", "h200-mix@11002"])
def test_the_rule_loop_is_the_decision_loop_in_one_kernel_call(name: str, policy: str) -> None:
    """Static caps and the study's two rules run the whole decision loop in the kernel (kernels.run_rule), an
    optimisation of core/loop.py's ``run_loop``: the same limits at every decision and the same running totals
    after it as the one loop driving the Python controller, in the compiled world and in the Python world, and
    the same episode (what ``run`` returns, every count and latency)."""
    sc = load_scenario(name).model_copy(update={"horizon_s": 600.0})
    n, steps = len(sc.tenants), decision_count(sc)
    loops = []
    for world in ("python", "compiled"):
        ctrl = make_controller(policy)
        ctrl.reset(sc.control_spec(), 3)
        rec = Recorded(make_simulation(sc, 3, world=world))
        stats = run_loop(rec, ctrl, name=policy)
        loops.append((stats, rec.limits, rec.totals, rec.sim.summary(), rec.sim.tenant_summary()))
    ctrl = make_controller(policy)
    ctrl.reset(sc.control_spec(), 3)
    cw = CompiledSimulation(sc, 3)
    rule = _rule_of(ctrl, n)
    assert rule is not None
    limits, totals = np.zeros((steps, n), dtype=np.int64), np.zeros((steps, n, 7), dtype=np.int64)
    stats = cw._run_rule(rule, None, totals, limits)
    in_kernel = (stats, limits.tolist(), totals.tolist(), cw.summary(), cw.tenant_summary())
    assert loops[0] == loops[1] == in_kernel
    assert stats.decisions == steps == 600.0 / sc.interval_s
    assert len({tuple(x) for x in in_kernel[1]}) > 1 or policy.startswith("static")  # the rules move the limits
    ctrl = make_controller(policy)
    ctrl.reset(sc.control_spec(), 3)
    assert CompiledSimulation(sc, 3).run(ctrl, name=policy) == stats  # run takes the kernel's way
    assert _rule_of(make_controller("gradient2"), 2) is None  # anything else runs the Python loop


def test_only_a_controller_that_decides_by_a_rule_runs_as_one() -> None:
    from admit.controllers.naive import NaiveController

    class Bolder(NaiveController):  # decides otherwise: must not run as the naive rule
        def act(self, obs: Observation) -> list[int]:
            return [1] * obs.n_tenants

    class Unknown:
        def decision_rule(self) -> tuple[str, tuple[float, ...]]:
            return "bang-bang", ()

    assert _rule_of(Bolder(), 2) is None
    assert _rule_of(NaiveController(p99_threshold_s=4.0), 2) is not None
    with pytest.raises(ValueError, match="decision_rule 'bang-bang' is unknown; allowed: static, naive, "
                                         "differentiated"):
        _rule_of(Unknown(), 2)  # type: ignore[arg-type]


def test_a_controller_run_matches_in_both_worlds() -> None:
    """Simulation.run's decision loop (what the evaluator and tuner use) on a hand-written adaptive policy."""
    sc = load_scenario("h200-mix@11002").model_copy(update={"horizon_s": 400.0})
    out = []
    for world in ("python", "compiled"):
        ctrl = make_controller("gradient2")
        ctrl.reset(sc.control_spec(), 7)
        sim = make_simulation(sc, 7, world=world)
        stats = sim.run(ctrl, name="gradient2")
        out.append((stats, sim.summary(), sim.tenant_summary()))
    assert out[0] == out[1]
    assert isinstance(make_simulation(sc, 7), CompiledSimulation)


def test_env_is_identical_in_both_worlds() -> None:
    rewards, obs = [], []
    for world in ("python", "compiled"):
        env = gym.make("admit/TenantAdmission-v1", scenario="h200-mixed", world=world)
        env.action_space.seed(5)
        o, _ = env.reset(seed=5)
        rs, os_ = [], [o]
        for _ in range(150):
            o, r, _, trunc, info = env.step(env.action_space.sample())
            rs.append((r, info["reward_terms"], info["limits"], info["p99_s"], info["completions"]))
            os_.append(o)
        last = env.unwrapped.last_observation
        rewards.append(rs)
        obs.append((np.stack(os_), last))
    assert rewards[0] == rewards[1]
    assert np.array_equal(obs[0][0], obs[1][0]) and obs[0][0].dtype == obs[1][0].dtype == np.float32
    assert obs[0][1] == obs[1][1]


def test_world_choice_and_what_the_compiled_world_refuses() -> None:
    with pytest.raises(ValueError, match="world 'fast' is unknown; allowed: compiled, python"):
        make_simulation(load_scenario("h200-mixed"), 0, world="fast")
    with pytest.raises(ValueError, match="world 'fast' is unknown"):
        gym.make("admit/TenantAdmission-v1", scenario="h200-mixed", world="fast")
    assert isinstance(make_simulation(load_scenario("seed-paper"), 0), CompiledSimulation)  # the slot engine too
    sc = load_scenario("h200-mixed")
    assert isinstance(make_simulation(sc, 0, world="python"), Simulation)
    replay = Simulation(sc, 0).requests[:50]
    assert isinstance(make_simulation(sc, 0, requests=replay), Simulation)  # replayed requests: the Python world


def test_a_request_that_can_never_run_is_refused_before_the_episode() -> None:
    data = load_scenario("h200-mixed").model_dump()
    data["tenants"][0]["prompt_tokens"] = {"kind": "constant", "value": 200_000}
    data["tenants"][0]["contract"] = None  # at 200k-token prompts its contract would ask for 77 engines
    from admit.envs.scenario import parse_scenario

    sc = parse_scenario(data)
    with pytest.raises(ValueError, match=r"request \d+ \(200000 prompt \+ \d+ output tokens\): prompt \+ output "
                                         r"exceeds max_model_len 131072"):
        CompiledSimulation(sc, 0)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the allocator settings are glibc's")
def test_on_glibc_the_world_keeps_freed_memory_for_the_next_one() -> None:
    """Importing the compiled world set glibc's malloc to serve a world's arrays from the heap and keep what is
    freed (the module docstring's "Memory"); trimming gives it back and leaves the setting as it is."""
    from admit.envs import compiled

    assert compiled.KEEPS_FREED_MEMORY
    compiled.release_freed_memory()
    assert compiled.keep_freed_memory()
