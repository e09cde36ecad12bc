"""admit search-static (train/static_search.py) and static:best (agents/static_best.py): the search, the stores, the
seed rule, the verb."""

import json
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from admit.agents import static_best as best
from admit.agents.registry import make_controller
from admit.core.spec import Limits
from admit.envs.scenario import load_scenario, parse_scenario
from admit.evaluate.offline import evaluate, run_policy
from admit.train import static_search as search

# One tenant on a pool of 4 slots, deterministic 1 s service, no admission queue (max_queue 0: over the limit
# is a rejection), and a TTFT objective of 1 ms: a request is good only if it starts the moment it arrives.
# Under a cap c ≤ 4 every admitted request finds a free slot, so goodput is an Erlang loss system's
# throughput with c servers, increasing in c; over 4, admitted requests wait in the engine (never good) and
# hold slots later arrivals would have started on. The best cap is the pool's size, 4.
TINY = {
    "name": "tiny-slots",
    "horizon_s": 200,
    "interval_s": 5,
    "window_s": 10,
    "engine": {"kind": "slot", "slots": 4, "mean_service_s": 1.0, "distribution": "deterministic"},
    "admission": {"queue_timeout_s": 1.0, "max_queue": 0},
    "limits": {"min": 1, "max": 16, "initial": 1, "max_step": 16},  # the first decision (t = 0) reaches any cap
    "tenants": [
        {
            "name": "only",
            "arrival": {"kind": "poisson", "rate": 6.0},
            "prompt_tokens": {"kind": "constant", "value": 1},
            "output_tokens": {"kind": "constant", "value": 1},
            "slo": {"ttft_s": 0.001},
        }
    ],
}
SHIPPED = ("h200-mixed", "h200-azure-2023", "servegen-skewed", "h200-live-small", "seed-paper", "long-context-chat")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache for static:best, one worker for searches on the fly, and no resolutions remembered."""
    monkeypatch.setenv("ADMIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ADMIT_SEARCH_WORKERS", "1")
    monkeypatch.setattr(best, "_RESOLVED", {})
    monkeypatch.setattr(best, "_BY_SPEC", {})
    return tmp_path / "cache" / "static_best"


# ------------------------------------------------------------------------------------------ the search core
def _log2(c: int) -> float:
    return math.log2(c)


def counting(f):
    """A batch objective from a point function, counting every point it is asked for."""
    calls: list[tuple[int, ...]] = []

    def objective(points):
        calls.extend(points)
        return [f(p) for p in points]

    return objective, calls


GRID = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def test_descent_finds_a_separable_optimum_and_stops_one_idle_round_after_the_last_move():
    target = (4, 32, 1)
    obj, _ = counting(lambda c: -sum((_log2(a) - _log2(t)) ** 2 for a, t in zip(c, target, strict=True)))
    d = search.coordinate_descent(obj, (64, 64, 64), search.log_sweep([GRID] * 3))
    assert d.best == target and d.converged and d.score == 0.0
    moves = [i for i, w in enumerate(d.sweeps) if w.moved]
    assert len(d.sweeps) == moves[-1] + 1 + 3  # after the last move, one sweep per tenant and no more
    assert all(w.scores[w.end[w.tenant]] == max(w.scores.values()) for w in d.sweeps)


def test_descent_needs_several_rounds_when_coordinates_interact():
    # on the log scale f = -(x0 - x1)²/2 - (x0 - 3)²: the optimum (8, 8) is reached only by alternating moves
    obj, _ = counting(lambda c: -0.5 * (_log2(c[0]) - _log2(c[1])) ** 2 - (_log2(c[0]) - 3) ** 2)
    d = search.coordinate_descent(obj, (256, 1), search.log_sweep([GRID] * 2))
    assert d.best == (8, 8) and d.converged and d.rounds > 1


def test_ties_go_to_the_smaller_cap():
    obj, _ = counting(lambda c: min(c[0], 16) + min(c[1], 8))  # caps above 16 and 8 change nothing
    d = search.coordinate_descent(obj, (64, 64), search.log_sweep([GRID] * 2))
    assert d.best == (16, 8) and d.score == 24


def test_rel_tol_trades_a_little_goodput_for_smaller_caps():
    value = {1: 0.5, 2: 0.99, 4: 1.0}
    obj, _ = counting(lambda c: value[c[0]])
    assert search.coordinate_descent(obj, (4,), search.log_sweep([[1, 2, 4]])).best == (4,)
    assert search.coordinate_descent(obj, (4,), search.log_sweep([[1, 2, 4]]), rel_tol=0.02).best == (2,)


def test_dropped_candidates_are_never_chosen_and_a_bad_start_is_an_error():
    obj, _ = counting(lambda c: -math.inf if c[0] == 8 else float(c[0]))
    assert search.coordinate_descent(obj, (1,), search.log_sweep([[1, 2, 8]])).best == (2,)
    with pytest.raises(ValueError, match="start point"):
        search.coordinate_descent(obj, (8,), search.log_sweep([[1, 2, 8]]))
    with pytest.raises(ValueError, match="max_rounds"):
        search.coordinate_descent(obj, (1,), search.log_sweep([[1]]), max_rounds=0)


def test_local_refinement_moves_between_neighbours_only():
    obj, calls = counting(lambda c: -abs(c[0] - 6))
    d = search.coordinate_descent(obj, (4,), search.adjacent([search.fine_grid([1, 2, 4, 8, 16])]), stage="refine")
    assert d.best == (6,)
    assert set(calls) <= {(3,), (4,), (6,), (8,)}


def test_grids():
    assert search.log_grid(Limits(min=2, max=256, initial=64, max_step=4)) == [2, 4, 8, 16, 32, 64, 128, 256]
    assert search.log_grid(Limits(min=1, max=4, initial=4, max_step=1)) == [1, 2, 4]
    assert search.log_grid(Limits(min=0, max=10, initial=3, max_step=1)) == [0, 1, 2, 3, 4, 8, 10]
    assert search.fine_grid([1, 2, 4, 8]) == [1, 2, 3, 4, 6, 8]
    assert search.fine_grid([4, 10]) == [4, 6, 10]


def test_seed_spellings():
    assert search.parse_seeds("3..5") == [3, 4, 5]
    assert search.parse_seeds("7") == [7]
    assert search.parse_seeds("1,4") == [1, 4]
    assert search.format_seeds([3, 4, 5]) == "3..5" and search.format_seeds([1, 4]) == "1,4"
    for bad, msg in (("5..3", "A <= B"), ("x", "integers"), ("1,1", "at most once"), ("-1", ">= 0"), ("", "integers")):
        with pytest.raises(ValueError, match=msg):
            search.parse_seeds(bad)


# ------------------------------------------------------------------------------------------ on the simulator
def test_the_search_finds_the_provable_best_cap_of_a_slot_pool():
    full = search.search_static(parse_scenario(TINY), seeds=[0, 1, 2], workers=1, race_margin=0)
    ob = full.objective
    scores = {c[0]: ob.mean(c) for c, _ in ob.episodes}
    assert full.best == (4,)
    assert scores[4] > scores[3] > scores[2] > scores[1] and scores[4] > scores[6] > scores[8] > scores[16]
    raced = search.search_static(parse_scenario(TINY), seeds=[0, 1, 2], workers=1)
    assert raced.best == (4,) and raced.objective.rollouts < ob.rollouts
    assert (16,) in raced.objective.pruned and not raced.objective.complete((16,))  # dropped after one seed
    data = raced.to_json("test")
    assert data["caps"] == {"only": 4} and data["policy"] == "static:4"
    assert data["plain_static"]["caps"] == [1] and data["goodput_rps"] == pytest.approx(scores[4])
    assert data["ramp"]["decisions"] == 1  # limits 1 → 4 at the first decision (t = 0): no ramp to speak of
    assert data["ramp"]["goodput_rps_at_caps"] == pytest.approx(data["ramp"]["goodput_rps_ramped"])
    assert {tuple(p["caps"]) for p in data["points"]} == {c for c, _ in raced.objective.episodes}
    assert all(p["pruned"] == ("goodput_rps" not in p) for p in data["points"])


def test_workers_give_the_serial_result_and_the_cache_runs_each_episode_once():
    sc = parse_scenario(TINY)
    serial = search.search_static(sc, seeds=[0, 1], workers=1, race_margin=0, measure_ramp=False)
    pooled = search.search_static(sc, seeds=[0, 1], workers=2, race_margin=0, measure_ramp=False)
    assert serial.best == pooled.best
    assert serial.objective.episodes == pooled.objective.episodes
    assert serial.objective.rollouts == len(serial.objective.episodes)  # no episode ran twice
    assert not serial.objective.pruned


def test_the_objective_is_the_figure_admit_evaluate_gives():
    """The search scores caps with the episodes `admit evaluate` runs for ``static:CAPS``: the same function
    (admit.envs.rollout), so the same goodput seed by seed, overall and per tenant."""
    sc = load_scenario("h200-live-small")
    caps = (12, 4)
    ob = search.SimObjective(sc, [3, 4], None, 1, race_margin=0)
    (score,) = ob([caps])
    policy = search.static_policy(caps)
    ev = evaluate(sc, [policy], seeds=2, seed_base=3).to_json()["policies"][policy]
    assert [ob.episodes[(caps, s)]["goodput_rps"] for s in (3, 4)] == ev["goodput_rps"]["values"]
    assert score == pytest.approx(ev["goodput_rps"]["mean"], rel=1e-12)
    for name, t in ev["tenants"].items():
        assert [ob.episodes[(caps, s)]["tenants"][name]["attainment"] for s in (3, 4)] == t["attainment"]["values"]
    assert ob.episodes[(caps, 3)]["mean_limit"] == pytest.approx(search.mean_limit(sc, caps))


def test_caps_above_a_limit_that_never_bound_are_the_same_episode():
    light = {**TINY["tenants"][0], "name": "light", "arrival": {"kind": "poisson", "rate": 0.2}}
    sc = parse_scenario({**TINY, "tenants": [TINY["tenants"][0], light]})  # 'only' overloads, 'light' hardly
    ob = search.SimObjective(sc, [0], None, 1, race_margin=0)
    ob([(4, 8)])
    assert ob.episodes[((4, 8), 0)]["bound"] == [True, False]
    ob([(4, 16)])
    assert ob.rollouts == 1 and ob.inferred == 1
    inferred = dict(ob.episodes[((4, 16), 0)])
    assert inferred.pop("inferred_from") == [4, 8]
    assert inferred == search._episode((sc, ob.key, (4, 16), 0))  # what running it gives
    ob([(8, 8), (4, 4)])  # 'only' was held back at 4, and a smaller cap may bind: both run
    assert ob.rollouts == 3


# ------------------------------------------------------------------------------------------ static:best
def _shipped(name: str) -> dict:
    return json.loads((best.shipped_dir() / f"{name}.json").read_text())


STORES = [(goal, p.stem) for goal in ("goodput", "contract") for p in sorted(best.shipped_dir(goal).glob("*.json"))]


@pytest.mark.parametrize(("goal", "name"), STORES)
def test_shipped_caps_are_fresh_and_disjoint_from_evaluation_seeds(goal, name):
    """Every store shipped for static:best (static-best/) and static:contract (static-contract/, a drift
    instance's last week included): tuned on the scenario as it is now, on seeds no evaluation uses."""
    data = json.loads((best.shipped_dir(goal) / f"{name}.json").read_text())
    sc = load_scenario(data["source"])
    blind = " --blind" if goal == "goodput" and sc.has_contracts else ""
    assert data["fingerprint"] == search.fingerprint(sc, goal), (
        f"{name} changed since its caps were tuned: admit search-static --scenario {name} --workers 2 "
        f"--out {best.shipped_dir(goal).relative_to(best.shipped_dir(goal).parents[2])}/{name}.json{blind}"
    )
    assert tuple(data["seeds"]) == search.SEARCH_SEEDS  # never an evaluation seed of admit evaluate (0..N-1)
    if goal == "goodput":
        assert data["goodput_rps"] >= data["plain_static"]["goodput_rps"]
    else:
        assert data["searched_for"] == "contract"
    # the command that made it, under the verb's name of the day (the shipped stores are kept byte for byte)
    scenario = re.escape(shlex.quote(name))  # as shlex.join wrote it: a last week's ~ is quoted
    assert re.match(rf"admit (tune|search)-static --scenario {scenario} ", data["command"]), data["command"]
    assert data["wall_s"] > 0


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_caps_reproduce_their_goodput(name):
    """The stored episodes replay: the simulator has not changed under the caps (else search again and ship)."""
    data = _shipped(name)
    seed = data["seeds"][0]
    got = run_policy(load_scenario(name), data["policy"], seed)["goodput_rps"]
    assert got == pytest.approx(_per_seed(data, seed)), (
        f"the simulator's goodput for {name}'s caps moved: admit search-static --scenario {name} --workers 2 "
        f"--out agents/pretrained/static-best/{name}.json"
    )


def _per_seed(data: dict, seed: int) -> float:
    (point,) = [p for p in data["points"] if p["caps"] == data["best"]["caps"]]
    return point["goodput_rps_per_seed"][str(seed)]


def test_static_best_resolves_the_shipped_caps_unbound_and_bound(cache, capsys):
    sc = load_scenario("h200-live-small")
    caps = tuple(_shipped("h200-live-small")["best"]["caps"])
    unbound = make_controller("static:best")  # as admit evaluate makes it: it sees only the spec
    unbound.reset(sc.control_spec(), 0)
    bound = make_controller("static:best", scenario=sc)
    bound.reset(sc.control_spec(), 0)
    for c in (unbound, bound):
        assert c.name == "static:best" and tuple(c.cap) == caps
        assert c.tuned.path.parent == best.shipped_dir()
    assert "searching now" not in capsys.readouterr().err and not cache.exists()
    # and it is exactly the static policy at those caps
    a, b = run_policy(sc, "static:best", 3), run_policy(sc, search.static_policy(caps), 3)
    lend_a, lend_b = a.pop("lending"), b.pop("lending")  # numpy series: compared on their own
    assert a == b and lend_a.keys() == lend_b.keys()
    assert all(np.array_equal(lend_a[k], lend_b[k]) if not isinstance(lend_a[k], dict) else
               all(np.array_equal(lend_a[k][t], lend_b[k][t]) for t in lend_a[k]) for k in lend_a)


def test_static_best_searches_a_changed_scenario_again_with_a_message_and_caches_it(cache, capsys):
    short = load_scenario("h200-live-small", horizon_s=20)  # not the world the shipped caps were tuned on
    c = make_controller("static:best", scenario=short)
    c.reset(short.control_spec(), 0)
    err = capsys.readouterr().err
    assert "stale" in err and "h200-live-small.json" in err and "searching now on seeds 900000..900004" in err
    path = best.cache_path(short)
    assert c.tuned.path == path and path.is_file()
    data = json.loads(path.read_text())
    assert data["fingerprint"] == search.fingerprint(short) and data["seeds"] == list(search.SEARCH_SEEDS)
    # a new process (nothing remembered) finds the cached caps and searches nothing
    best._RESOLVED.clear()
    again = make_controller("static:best", scenario=short)
    again.reset(short.control_spec(), 0)
    assert again.cap == c.cap and "searching now" not in capsys.readouterr().err


def test_static_best_refuses_its_own_search_seeds(cache):
    sc = load_scenario("h200-live-small")
    c = make_controller("static:best", scenario=sc)
    with pytest.raises(ValueError, match="tuned on seeds 900000..900004"):
        c.reset(sc.control_spec(), 900_002)
    with pytest.raises(ValueError, match="choose evaluation seeds outside"):
        evaluate(sc, ["static", "static:best"], seeds=3, seed_base=899_999)
    with pytest.raises(ValueError, match="900003..900004"):
        best.check_seeds(["static:best"], range(900_003, 900_010), sc)
    best.check_seeds(["static:best"], range(20), sc)  # admit evaluate's default seeds are fine
    best.check_seeds(["static"], range(900_000, 900_010), sc)  # and plain static has no tuning seeds


def test_static_best_without_a_known_scenario_says_how_to_get_one(cache):
    odd = parse_scenario({**TINY, "tenants": [{**TINY["tenants"][0], "name": "nobody-has-me"}]})
    with pytest.raises(ValueError, match="no known scenario has this control spec"):
        make_controller("static:best").reset(odd.control_spec(), 0)


def test_static_best_finds_a_cached_tuning_of_a_scenario_file_by_its_spec(cache, tmp_path, capsys):
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({**TINY, "name": "mine"}))
    sc = load_scenario(path)
    res = search.search_static(path, seeds=[0, 1], workers=1)
    search.write_store(res.to_json("test"), best.cache_path(sc))
    c = make_controller("static:best")
    c.reset(sc.control_spec(), 5)
    assert tuple(c.cap) == res.best == (4,) and "searching now" not in capsys.readouterr().err
    with pytest.raises(ValueError, match="tuned on seeds 0..1"):
        c.reset(sc.control_spec(), 1)


def test_fingerprint_reads_the_world_not_its_labels():
    base = parse_scenario(TINY)
    assert search.fingerprint(base) == search.fingerprint(parse_scenario({**TINY, "name": "x", "description": "y"}))
    assert search.fingerprint(base) == search.fingerprint(parse_scenario({**TINY, "reward": {"drop": 5.0}}))
    assert search.fingerprint(base) != search.fingerprint(parse_scenario({**TINY, "horizon_s": 100}))
    other = {**TINY["tenants"][0], "arrival": {"kind": "constant", "rate": 6.0}}
    assert search.fingerprint(base) != search.fingerprint(parse_scenario({**TINY, "tenants": [other]}))


def test_a_malformed_store_is_named_and_skipped(cache, capsys):
    cache.mkdir(parents=True)
    (cache / "broken.json").write_text("{not json")
    assert best.all_stores() == [s for s in best.all_stores() if s.path.name != "broken.json"]
    assert "ignoring tuning store" in capsys.readouterr().err
    with pytest.raises(ValueError, match="malformed"):
        (cache / "old.json").write_text(json.dumps({"format": 1, "tenants": ["a"]}))
        best.TunedCaps.load(cache / "old.json")


# ------------------------------------------------------------------------------------------ the verb
def _admit(*args: str, env_cache: Path) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, "ADMIT_CACHE_DIR": str(env_cache)}
    return subprocess.run(
        [sys.executable, "-m", "admit.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


def _short_scenario(tmp_path: Path) -> Path:
    data = yaml.safe_load((Path(best.__file__).parents[1] / "envs/scenarios/h200-live-small.yaml").read_text())
    for t in data["tenants"]:  # the tenant-blind search (with contracts: tests/train/test_static_contract.py)
        del t["contract"]
    src = tmp_path / "short.yaml"
    src.write_text(yaml.safe_dump({**data, "name": "short", "horizon_s": 30}))
    return src


def test_cli_search_static_end_to_end_on_a_short_scenario(tmp_path):
    src = _short_scenario(tmp_path)
    out = tmp_path / "caps.json"
    r = _admit(
        "search-static",
        "--scenario",
        str(src),
        "--seeds",
        "0..2",
        "--workers",
        "2",
        "--out",
        str(out),
        env_cache=tmp_path / "c",
    )
    assert r.returncode == 0, r.stderr
    assert "best caps: chat=" in r.stdout and "plain static" in r.stdout and f"wrote {out}" in r.stdout
    assert "grid round 1 · chat" in r.stdout  # the search, sweep by sweep
    got = json.loads(out.read_text())
    for key in ("caps", "seeds", "goodput_rps", "attainment", "command", "fingerprint", "points", "search", "ramp"):
        assert key in got, key
    assert got["seeds"] == [0, 1, 2] and set(got["caps"]) == {"chat", "agent"}
    assert got["command"] == f"admit search-static --scenario {src} --seeds 0..2 --workers 2 --out {out}"
    assert got["fingerprint"] == search.fingerprint(load_scenario(src))
    assert all(p["goodput_rps"] <= got["goodput_rps"] for p in got["points"] if "goodput_rps" in p)
    # without --out it goes where static:best looks
    r = _admit("search-static", "--scenario", str(src), "--seeds", "0", "--workers", "1", env_cache=tmp_path / "c")
    assert r.returncode == 0, r.stderr
    assert list((tmp_path / "c" / "static_best").glob("short-*.json"))


def test_cli_tune_static_is_a_hidden_alias_of_search_static(tmp_path):
    """The verb's former name runs the same command: the same caps, points and figures, recorded under the
    current name; ``--help`` lists only search-static."""
    src = _short_scenario(tmp_path)
    got = {}
    for verb in ("search-static", "tune-static"):
        out = tmp_path / f"{verb}.json"
        r = _admit(verb, "--scenario", str(src), "--seeds", "0..1", "--workers", "1", "--out", str(out),
                   env_cache=tmp_path / "c")
        assert r.returncode == 0, r.stderr
        got[verb] = json.loads(out.read_text())
        assert got[verb].pop("command") == f"admit search-static --scenario {src} --seeds 0..1 --workers 1 --out {out}"
        assert got[verb].pop("wall_s") >= 0
    assert got["tune-static"] == got["search-static"]
    assert got["search-static"]["points"] and set(got["search-static"]["caps"]) == {"chat", "agent"}
    listed = _admit("--help", env_cache=tmp_path / "c").stdout
    assert "search-static" in listed and "tune-static" not in listed


def test_cli_default_seeds_are_static_best_s_and_a_bad_static_arg_names_best():
    import inspect

    from admit.train.cli import search_static as verb

    assert inspect.signature(verb).parameters["seeds"].default.default == search.format_seeds(search.SEARCH_SEEDS)
    with pytest.raises(ValueError, match="'best'"):
        make_controller("static:bestest")


def test_cli_search_static_bad_input_is_a_clear_error(tmp_path):
    r = _admit("search-static", "--scenario", "no-such-scenario", env_cache=tmp_path)
    assert r.returncode == 2 and "unknown scenario 'no-such-scenario'" in r.stderr
    r = _admit("tune-static", "--scenario", "seed-paper", "--seeds", "9..3", env_cache=tmp_path)
    assert r.returncode == 2 and "A <= B" in r.stderr


def test_an_unbound_static_best_finds_a_family_instances_shipped_caps_by_its_spec() -> None:
    """The shipped stores' spec fingerprints are of the ControlSpec of the day they were tuned (it has gained
    fields since): the lookup by spec must not depend on them."""
    sc = load_scenario("h200-mix@11000")
    ctrl = make_controller("static:best")
    ctrl.reset(sc.control_spec(), 0)
    shipped = _shipped("h200-mix@11000")
    assert list(ctrl.cap) == list(best.tuned_caps(sc).caps) == [shipped["caps"][t.name] for t in sc.tenants]
