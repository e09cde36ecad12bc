"""Scenario families (envs/family.py), the capacity estimate (engine/capacity.py) and long-context-chat."""

import copy

import gymnasium
import numpy as np
import pytest
import yaml
from admit.controllers.static import StaticController
from admit.engine.capacity import capacity_rps, closed_loop_rps, measure_capacity
from admit.engine.presets import get_preset
from admit.envs.family import (
    FamilyError,
    bundled_families,
    instances,
    load_family,
    mean_rate,
    parse_family,
    sample_scenario,
    scenario_load,
    tenant_loads,
    tenant_sizes,
)
from admit.envs.registration import ENV_ID
from admit.envs.scenario import ScenarioError, bundled_scenarios, load_scenario
from admit.envs.simulation import Simulation, draw_requests
from admit.evaluate.offline import run_policy
from typer.testing import CliRunner

from admit.cli import app

FAMILY = "h200-mix"
# 30 instances: the first four and six spread over each range
SEEDS = [0, 1, 2, 3, 17, 512, 2048, 5555, 8191, 9999,
         10000, 10001, 10002, 10003, 10111, 10333, 10500, 10777, 10998, 10999,
         11000, 11001, 11002, 11003, 11222, 11444, 11500, 11666, 11888, 11999]


@pytest.fixture(scope="module")
def fam():
    return load_family(FAMILY)


@pytest.fixture(scope="module")
def sampled(fam):
    return {s: sample_scenario(fam, s) for s in SEEDS}


def _family_dict():
    from importlib import resources

    return yaml.safe_load(resources.files("admit.envs").joinpath("families", f"{FAMILY}.yaml").read_text())


# --------------------------------------------------------------------------- the family and its instances
def test_the_family_is_bundled_and_its_seed_ranges_are_disjoint(fam):
    assert FAMILY in bundled_families()
    ranges = [(fam.seeds.train.first, fam.seeds.train.last), (fam.seeds.validation.first, fam.seeds.validation.last),
              (fam.seeds.test.first, fam.seeds.test.last)]
    seen: set[int] = set()
    for a, b in ranges:
        assert a <= b and not seen & set(range(a, b + 1))
        seen |= set(range(a, b + 1))
    assert {fam.seeds.split_of(s) for s in SEEDS} == {"train", "validation", "test"}
    assert list(instances(FAMILY, "test", 3)) == ["h200-mix@11000", "h200-mix@11001", "h200-mix@11002"]


def test_same_seed_same_scenario_different_seeds_differ(fam, sampled):
    assert sample_scenario(fam, 17) == sampled[17]
    np.random.seed(123)  # the global stream plays no part
    assert sample_scenario(FAMILY, 17).model_dump() == sampled[17].model_dump()
    dumps = [sampled[s].model_dump(exclude={"name", "description"}) for s in SEEDS]
    assert all(dumps[i] != dumps[j] for i in range(len(dumps)) for j in range(i))


@pytest.mark.parametrize("seed", SEEDS)
def test_every_instance_is_valid_with_2_to_8_tenants_at_a_load_in_range(fam, sampled, seed):
    sc = sampled[seed]
    assert sc.name == f"{FAMILY}@{seed}"
    assert fam.tenants.min <= len(sc.tenants) <= fam.tenants.max == 8 and fam.tenants.min == 2
    load = scenario_load(sc)  # measured on the scenario itself, by the capacity estimate
    assert fam.load.min - 1e-4 <= load <= fam.load.max + 1e-4, load
    assert f"{load:.3f}x" in sc.description
    loads = tenant_loads(sc)
    assert min(loads) >= fam.split.min_share * load * (1 - 1e-4)
    tiers = [t.given() for t in fam.slo_tiers.values()]
    assert all(t.slo.given() in tiers for t in sc.tenants)
    fixed = fam.scenario
    assert (sc.horizon_s, sc.interval_s, sc.window_s) == (fixed.horizon_s, fixed.interval_s, fixed.window_s)
    assert sc.limits.model_dump() == fixed.limits and sc.engine.kind == "token"


def test_the_instances_use_every_block_and_tier(fam, sampled):
    names = " ".join(t.name for sc in sampled.values() for t in sc.tenants)
    for block in fam.blocks:
        assert (block if block != "servegen" else "client-") in names, block
    tiers = {t.slo.given().get("ttft_s") for sc in sampled.values() for t in sc.tenants}
    assert tiers == {0.5, 2.0, None}  # interactive, standard, batch
    prompts = [t.prompt_tokens.max for sc in sampled.values() for t in sc.tenants if t.name.startswith("long-context")]
    assert prompts and set(prompts) == {100_000}


def test_mean_rate_is_what_the_draws_deliver(sampled):
    """The load accounting counts the requests the simulator draws: per tenant, over a few episode seeds."""
    for seed in (3, 1, 11000):  # traces (looped, sped up or slowed), ServeGen, Poisson, MMPP among them
        sc = sampled[seed]
        counts = np.zeros(len(sc.tenants))
        for episode in range(4):
            counts += np.bincount([r.tenant for r in draw_requests(sc, episode)], minlength=len(sc.tenants))
        want = np.array([mean_rate(t.arrival, sc.horizon_s) * sc.horizon_s * 4 for t in sc.tenants])
        assert np.all(np.abs(counts / want - 1) < 0.2), (seed, counts / want)


# --------------------------------------------------------------------------- instance names
def test_load_scenario_resolves_instances_and_overrides(sampled):
    sc = load_scenario("h200-mix@11000")
    assert sc == sampled[11000]
    short = load_scenario("h200-mix@11000", horizon_s=60)
    assert short.horizon_s == 60 and short.tenants == sc.tenants


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("nope@3", "unknown family 'nope'; bundled families: h200-drift, h200-mix, h200-shift"),
        ("h200-mix@x", "seed after '@' must be a non-negative integer"),
        ("h200-mix@-1", "seed after '@' must be a non-negative integer"),
        ("h200-mix@12000", r"seed 12000 is in none of h200-mix's seed ranges \(train 0-9999, validation"),
        ("@3", "write FAMILY@SEED"),
        ("h200-mix", "unknown scenario 'h200-mix'.*family instances: .*h200-mix@SEED"),
    ],
)
def test_bad_instance_names_say_what_is_allowed(name, match):
    with pytest.raises(ScenarioError, match=match):
        load_scenario(name)


def test_a_family_file_by_path(tmp_path):
    d = _family_dict()
    d["name"] = "mine"
    d["tenants"] = {"min": 2, "max": 2}
    p = tmp_path / "mine.yaml"
    p.write_text(yaml.safe_dump(d))
    sc = load_scenario(f"{p}@5")
    assert sc.name == "mine@5" and len(sc.tenants) == 2


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda d: d["seeds"].update(validation={"first": 9000, "last": 10999}), "disjoint: train and validation"),
        (lambda d: d["seeds"]["test"].update(first=12000, last=11500), "first <= last"),
        (lambda d: d["blocks"]["chat"].update(tiers={"premium": 1.0}), r"unknown tiers \['premium'\]"),
        (lambda d: d["blocks"]["chat"]["vary"].update({"arrival.rate": [1, 2]}), "a rate the family sets"),
        (lambda d: d["blocks"]["chat"]["vary"].update({"prompt_tokens.mode": [1, 2]}), "names no key"),
        (lambda d: d["blocks"]["chat"]["vary"].update({"prompt_tokens.median": [0, 2]}), "0 < low <= high"),
        (lambda d: d["blocks"]["chat"]["vary"].update({"prompt_tokens.min": [9000, 9500]}), "not a valid tenant"),
        (lambda d: d["blocks"]["chat"]["tenant"].update(name="x"), "a template has no 'name'"),
        (lambda d: d["blocks"]["chat"]["tenant"].update(arrival={"kind": "weibull"}), "cannot be scaled"),
        (lambda d: d["blocks"]["azure-code"]["tenant"]["arrival"].update(loop=False), "needs loop: true"),
        (lambda d: d["blocks"]["chat"].update(servegen={"clients": [61]}), "exactly one of 'tenant'"),
        (lambda d: d["blocks"]["servegen"]["servegen"].update(clients=[15]), "no published length summary"),
        (lambda d: d["split"].update(min_share=0.2), "leaves nothing to split"),
        (lambda d: d.update(tenants={"min": 3, "max": 2}), "min <= max"),
        (lambda d: d["scenario"].update(engine={"kind": "token", "preset": "tpu"}), "unknown token-engine preset"),
        (lambda d: d["scenario"]["limits"].update(initial=999), "min <= initial <= max"),
        (lambda d: d.update(blocks={"chat": {**d["blocks"]["chat"], "max_count": 1}}), "at most 1 tenants"),
        (lambda d: d.update(colour="red"), "colour: unknown key"),
    ],
)
def test_a_bad_family_file_says_what_is_wrong(edit, match):
    d = copy.deepcopy(_family_dict())
    edit(d)
    with pytest.raises(FamilyError, match=match):
        parse_family(d)


# --------------------------------------------------------------------------- instances run
def test_a_short_episode_of_an_instance_runs(sampled):
    sc = load_scenario("h200-mix@1", horizon_s=60)
    ctrl = StaticController()
    ctrl.reset(sc.control_spec(), 0)
    sim = Simulation(sc, 0)
    stats = sim.run(ctrl)
    assert stats.decisions == 30
    m = sim.summary()
    assert m["arrived"] > 0 and m["completed"] > 0
    assert set(sim.tenant_summary()) == {t.name for t in sc.tenants}


def test_the_env_and_evaluate_take_an_instance_name():
    env = gymnasium.make(ENV_ID, scenario="h200-mix@10000")
    obs, _ = env.reset(seed=0)
    n = len(env.unwrapped.scenario.tenants)
    assert env.unwrapped.scenario.name == "h200-mix@10000" and env.action_space.shape == (n,)
    for _ in range(3):
        obs, *_ = env.step(np.full(n, env.unwrapped.k))
    assert env.observation_space.contains(obs)
    r = run_policy(load_scenario("h200-mix@10000", horizon_s=30), "static", 0)
    assert r["arrived"] > 0


def test_admit_scenarios_lists_the_family_and_its_seeds():
    res = CliRunner().invoke(app, ["scenarios"])
    assert res.exit_code == 0, res.output
    assert "long-context-chat" in res.output
    line = next(x for x in res.output.splitlines() if x.startswith("h200-mix@SEED"))
    assert "2-8 tenants" in line and "load 0.5-1.5x" in line
    assert "train 0-9999, validation 10000-10999, test 11000-11999" in line


# --------------------------------------------------------------------------- the capacity estimate
def test_capacity_on_the_budget_bound_is_the_inverse_work_per_request():
    """A prefill-heavy mix fills the token budget: capacity = 1 / ((T/B)(overhead + dense(B)) + kv·R + attn·A)."""
    pr = get_preset("h200-llama3-8b")
    m, b = pr.step, pr.max_num_batched_tokens
    p, o = np.array([3000.0, 5000.0]), np.array([20.0, 40.0])
    work = (
        (p + o).mean() / b * (m.overhead_s + m.dense(b))
        + m.kv_read_s_per_token * ((o - 1) * p + o * (o - 1) / 2).mean()
        + m.prefill_attn_s_per_pair * (p * (p + 1) / 2).mean()
    )
    assert capacity_rps(pr, p, o) == pytest.approx(1 / work, rel=1e-12)


def test_capacity_follows_the_engine_limits_and_checks_its_input():
    p, o = [1000, 3000], [200, 50]
    cap = capacity_rps("h200-llama3-8b", p, o)
    assert capacity_rps("h200-llama3-8b", [20_000], [300]) < cap / 10  # long prompts: attention, KV reads
    assert capacity_rps("h200-llama3-8b", p, o, max_num_batched_tokens=512) < cap
    long_out = ([500], [2000])  # decode-heavy: the sequence cap binds
    assert capacity_rps("h200-llama3-8b", *long_out, max_num_seqs=32) < capacity_rps("h200-llama3-8b", *long_out)
    assert capacity_rps("h100-llama3-8b", p, o) < cap  # less HBM: a smaller KV cache, slower reads
    with pytest.raises(ValueError, match=">= 1 token"):
        capacity_rps("h200-llama3-8b", [0], [5])
    with pytest.raises(ValueError, match="one length"):
        capacity_rps("h200-llama3-8b", [10, 20], [5])
    with pytest.raises(ValueError, match="unknown token-engine preset"):
        capacity_rps("tpu", [10], [5])
    with pytest.raises(ValueError, match="can never fit"):
        capacity_rps("h200-llama3-8b", [10_000_000], [5])
    with pytest.raises(ValueError, match="concurrency >= 1"):
        closed_loop_rps("h200-llama3-8b", [10], [5], 0, 100)


@pytest.mark.parametrize(
    ("scenario", "tenant", "concurrencies"),
    [("h200-mix@3", "azure-code", (64, 256)), ("long-context-chat", "long-context", (16, 32))],
)
def test_the_estimate_matches_the_engine_in_closed_loop(scenario, tenant, concurrencies):
    """Within 12 % of the best closed-loop throughput the token engine itself reaches (docs/scenarios.md has
    13 mixes; here two, at the concurrencies that reach the best, to be quick)."""
    sc = load_scenario(scenario)
    t = next(x for x in sc.tenants if x.name == tenant)
    p, o = tenant_sizes(t)
    idx = np.random.default_rng(0).integers(0, len(p), 2000)
    est = capacity_rps("h200-llama3-8b", p, o)
    meas, _ = measure_capacity("h200-llama3-8b", p[idx], o[idx], concurrencies, requests=1500)
    assert est == pytest.approx(meas, rel=0.12)


# --------------------------------------------------------------------------- long-context-chat
def test_long_context_chat_is_bundled_and_overloaded_by_the_long_context_tenant():
    assert "long-context-chat" in bundled_scenarios()
    sc = load_scenario("long-context-chat")
    lc, chat = tenant_loads(sc)
    assert 1.1 < lc < 1.35 and 0.2 < chat < 0.3  # the long-context tenant alone overfills the engine
    assert sc.tenants[0].prompt_tokens.max == 100_000 and sc.tenants[0].arrival.rate == 1.7
    lim = sc.limits
    assert lim.initial == 64 and lim.max_step >= 16 and lim.min <= 4 and lim.max >= 256


def test_long_context_chat_static_64_thrashes_and_4_256_does_much_better():
    """The issue's contrast, on 300 s and two seeds: caps of 64 let the long prompts overfill the KV cache."""
    sc = load_scenario("long-context-chat", horizon_s=300)
    for seed in (0, 1):
        default = run_policy(sc, "static:64", seed)
        tuned = run_policy(sc, "static:4,256", seed)
        assert default["throughput_rps"] < 0.45 * tuned["throughput_rps"]
        assert default["goodput_rps"] < 0.2 * tuned["goodput_rps"]
        assert default["attainment"] < 0.15 < 0.6 < tuned["attainment"]


# --------------------------------------------------------------------------- h200-shift: tenants that come and go
SHIFT_SEEDS = [0, 1, 2, 3, 10000, 10001, 11000, 11001, 11002, 11003]


@pytest.mark.parametrize("seed", SHIFT_SEEDS)
def test_h200_shift_instances_are_valid_and_at_their_load(seed):
    fam = load_family("h200-shift")
    sc = sample_scenario(fam, seed)
    assert fam.tenants.min <= len(sc.tenants) <= fam.tenants.max
    assert fam.load.min <= scenario_load(sc) <= fam.load.max
    assert min(tenant_loads(sc)) >= 0.99 * fam.split.min_share * scenario_load(sc)


def test_h200_shift_session_tenants_work_and_idle_in_turns_drawn_anew_per_episode():
    """A session tenant's minutes alternate between work (near its on-rate) and idleness (2 % of it), and which
    minutes are which changes with the episode seed: what caps tuned on other episodes cannot know."""
    fam = load_family("h200-shift")
    found, episodes, both = 0, 0, 0
    for seed in range(12):
        sc = sample_scenario(fam, seed)
        for i, t in enumerate(sc.tenants):
            if t.arrival.kind != "mmpp":
                continue
            assert t.arrival.rate_off == pytest.approx(0.02 * t.arrival.rate_on, rel=1e-4)
            assert 60 <= t.arrival.mean_on_s <= 600 and 60 <= t.arrival.mean_off_s <= 600
            per_minute = []
            for ep in (0, 1):
                arrivals = [r.arrival for r in draw_requests(sc, ep) if r.tenant == i]
                per_minute.append(np.histogram(arrivals, bins=np.arange(0, sc.horizon_s + 1, 60))[0])
            on_per_min = 60 * t.arrival.rate_on
            for counts in per_minute:
                if on_per_min >= 20:  # enough requests a minute to tell work from idleness
                    assert counts.max() < 1.6 * on_per_min
                    episodes += 1
                    both += counts.max() > 0.5 * on_per_min and counts.min() < 0.2 * on_per_min
            assert not np.array_equal(per_minute[0], per_minute[1])
            found += 1
    assert found >= 10
    # a session may last the whole 30 minutes (sojourns average 1 to 10 minutes), but most episodes see both
    assert episodes >= 10 and both >= 0.6 * episodes
