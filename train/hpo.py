"""``admit tune``: hyperparameter search over ``admit train`` as Ray Tune trials, proposed by Optuna.

Each trial is one ``admit train`` run with the base configuration (a config file, ``--set``, the command's
own flags) and the trial's point of the search space put in, written to ``OUT/trials/TRIAL_ID/`` as any run
folder is (model.zip, vecnormalize.pkl, config.yaml, TensorBoard, checkpoints). Its score is what the
project judges by: the trained policy's mean **goodput** (good requests/s) on validation worlds none of the
training saw, each from the episode ``admit evaluate`` runs (admit.envs.rollout): for a scenario, ``validation`` seeds
from the config's ``eval.seed_base``; for a family, the first ``validation`` instances of its validation range,
one seed each. Optuna's TPE sampler (seeded) proposes the points; Ray Tune runs them, ``--concurrent`` at a
time, one CPU each, on the Ray cluster ``--ray`` names (core/ray_session.py: ``local``, ``auto``, HOST:PORT).

Written to ``OUT``: ``trials.json`` (every trial: its point, score, status, run folder), ``best.yaml`` (the
best trial's resolved training config, for ``admit train --config``) and ``best.json`` (its point and score).
Resumable: Ray Tune keeps the experiment's state in ``OUT/ray/``; the same command again restores it, keeps
the finished trials and runs the rest (an interrupted trial starts over); a different command on the same
``OUT`` is refused, since its trials would not be comparable.

The search space (``space``) maps dotted config keys to a distribution: ``{loguniform: [lo, hi]}``,
``{uniform: [lo, hi]}``, ``{int: [lo, hi]}`` (inclusive) or ``{choice: [a, b, ...]}``; `DEFAULT_SPACES` has one
per algorithm, and a YAML file of the same shape replaces it (``--space``). Every corner of the space is checked
against the training schema before anything runs, so a bad key or range fails at once with the schema's message.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from admit.train.config import TrainConfig, TrainConfigError, parse_config

DEFAULT_SPACES: dict[str, dict[str, dict[str, list[Any]]]] = {
    "ppo": {
        "hyperparams.learning_rate": {"loguniform": [1e-5, 1e-3]},
        "hyperparams.n_steps": {"choice": [128, 256, 512, 1024]},
        "hyperparams.batch_size": {"choice": [64, 128, 256]},
        "hyperparams.n_epochs": {"int": [3, 10]},
        "hyperparams.gamma": {"uniform": [0.9, 0.999]},
        "hyperparams.gae_lambda": {"uniform": [0.8, 0.99]},
        "hyperparams.clip_range": {"uniform": [0.1, 0.3]},
        "hyperparams.ent_coef": {"loguniform": [1e-5, 1e-2]},
    },
    "a2c": {
        "hyperparams.learning_rate": {"loguniform": [1e-5, 3e-3]},
        "hyperparams.n_steps": {"choice": [5, 16, 32, 64]},
        "hyperparams.gamma": {"uniform": [0.9, 0.999]},
        "hyperparams.gae_lambda": {"uniform": [0.8, 1.0]},
        "hyperparams.ent_coef": {"loguniform": [1e-5, 1e-2]},
    },
    "dqn": {
        "hyperparams.learning_rate": {"loguniform": [1e-5, 1e-3]},
        "hyperparams.batch_size": {"choice": [32, 64, 128]},
        "hyperparams.gamma": {"uniform": [0.9, 0.999]},
        "hyperparams.exploration_fraction": {"uniform": [0.05, 0.5]},
        "hyperparams.target_update_interval": {"choice": [250, 1000, 4000]},
    },
    "sac": {
        "hyperparams.learning_rate": {"loguniform": [1e-5, 1e-3]},
        "hyperparams.batch_size": {"choice": [64, 128, 256]},
        "hyperparams.gamma": {"uniform": [0.9, 0.999]},
        "hyperparams.tau": {"loguniform": [1e-3, 5e-2]},
    },
}
KINDS = ("loguniform", "uniform", "int", "choice")
STATE = "tune.json"  # what the run in OUT was started with: a rerun must match it to resume


class TuneError(ValueError):
    """A bad ``admit tune`` input; the message says what was wrong and what is allowed."""


def load_space(path: str | Path | None, algo: str) -> dict[str, dict[str, list[Any]]]:
    """The search space of ``path`` (YAML, module doc) or the algorithm's default; TuneError when malformed."""
    if path is None:
        if algo not in DEFAULT_SPACES:
            raise TuneError(f"no default search space for algo {algo!r}; allowed: {', '.join(DEFAULT_SPACES)}")
        return DEFAULT_SPACES[algo]
    p = Path(path)
    if not p.is_file():
        raise TuneError(f"search space {p}: no such file")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise TuneError(f"search space {p}: not valid YAML: {e}") from None
    return check_space(data, str(p))


def check_space(data: object, origin: str = "<space>") -> dict[str, dict[str, list[Any]]]:
    """``data`` as a search space (module doc), or TuneError naming the entry that is wrong."""
    if not isinstance(data, dict) or not data:
        raise TuneError(f"search space {origin}: expected a non-empty mapping of dotted config keys to "
                        f"distributions, got {data!r}")
    out: dict[str, dict[str, list[Any]]] = {}
    for key, dist in data.items():
        if not isinstance(dist, dict) or len(dist) != 1 or next(iter(dist)) not in KINDS:
            raise TuneError(f"search space {origin}: {key}: expected one of {', '.join(KINDS)} with its "
                            f"values, e.g. {{loguniform: [1.0e-5, 1.0e-3]}}; got {dist!r}")
        kind, values = next(iter(dist.items()))
        if not isinstance(values, list) or not values:
            raise TuneError(f"search space {origin}: {key}: {kind} needs a list of values, got {values!r}")
        if kind != "choice":
            ok = len(values) == 2 and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
            if not ok or not values[0] < values[1]:
                raise TuneError(f"search space {origin}: {key}: {kind} needs [low, high] numbers with low < high, "
                                f"got {values!r}")
            if kind == "loguniform" and values[0] <= 0:
                raise TuneError(f"search space {origin}: {key}: loguniform needs low > 0, got {values!r}")
            if kind == "int" and not all(isinstance(v, int) for v in values):
                raise TuneError(f"search space {origin}: {key}: int needs integer bounds, got {values!r}")
        out[str(key)] = {kind: list(values)}
    return out


def _put(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A copy of ``data`` with the nested key ``a.b.c`` set to ``value``."""
    head, _, rest = dotted.partition(".")
    copy = dict(data)
    copy[head] = _put(dict(copy.get(head) or {}), rest, value) if rest else value
    return copy


def trial_config(base: Mapping[str, Any], point: Mapping[str, Any]) -> TrainConfig:
    """The base configuration (resolved) with a point of the space put in; TrainConfigError when invalid."""
    data: dict[str, Any] = dict(base)
    for key, value in point.items():
        data = _put(data, key, value)
    return parse_config(data, "admit tune trial")


def corners(space: Mapping[str, Mapping[str, list[Any]]]) -> list[dict[str, Any]]:
    """The lowest and the highest point of every dimension (each choice, for a choice), for checking up front."""
    lo: dict[str, Any] = {}
    hi: dict[str, Any] = {}
    extra: list[dict[str, Any]] = []
    for key, dist in space.items():
        kind, values = next(iter(dist.items()))
        lo[key], hi[key] = values[0], values[-1]
        if kind == "choice":
            extra += [{**lo, key: v} for v in values[1:-1]]
    return [lo, hi, *extra]


def check_against_schema(base: Mapping[str, Any], space: Mapping[str, Mapping[str, list[Any]]]) -> None:
    """Every corner of the space must make a valid training config (TuneError with the schema's message)."""
    for point in corners(space):
        try:
            trial_config(base, point)
        except TrainConfigError as e:
            raise TuneError(f"the search space makes an invalid training config at {point}: {e}") from None


def ray_space(space: Mapping[str, Mapping[str, list[Any]]]) -> dict[str, Any]:
    """The space as Ray Tune's search-space objects (OptunaSearch converts them to Optuna's)."""
    from ray import tune

    make = {"loguniform": lambda v: tune.loguniform(v[0], v[1]), "uniform": lambda v: tune.uniform(v[0], v[1]),
            "int": lambda v: tune.randint(v[0], v[1] + 1), "choice": tune.choice}
    return {key: make[kind](values) for key, dist in space.items() for kind, values in dist.items()}


def validation_worlds(cfg: TrainConfig, n: int) -> list[tuple[str, int]]:
    """(scenario, seed) pairs a trial is scored on (module doc): never a world the training saw."""
    if cfg.family is not None:
        from admit.envs.family import instances

        fams = [cfg.family] if isinstance(cfg.family, str) else cfg.family
        return [(name, cfg.eval.seed_base) for fam in fams for name in instances(fam, "validation", n)]
    return [(cfg.scenario, cfg.eval.seed_base + i) for i in range(n)]


def score(run_dir: Path, cfg: TrainConfig, n: int) -> dict[str, float]:
    """The trained policy's goodput on the validation worlds, each one `rollout` as ``admit evaluate`` runs it:
    mean (the score) and worst (req/s)."""
    from admit.agents.registry import make_controller
    from admit.envs.rollout import rollout
    from admit.envs.scenario import load_scenario

    policy = f"{cfg.algo}:{run_dir}"
    values: list[float] = []
    for name, seed in validation_worlds(cfg, n):
        sc = load_scenario(name)
        values.append(rollout(sc, make_controller(policy, sc), seed, name=policy)["goodput_rps"])
    return {"goodput_rps": sum(values) / len(values), "worst_goodput_rps": min(values)}


def _trial(point: dict[str, Any], base: dict[str, Any], out: str, validation: int) -> None:
    """One Ray Tune trial: train with the point put in, score the result, report it."""
    from admit.train.trainer import train
    from ray import tune

    cfg = trial_config(base, point)
    run_dir = Path(out) / "trials" / tune.get_context().get_trial_id()
    t0 = time.perf_counter()
    summary = train(cfg, run_dir, progress=False)
    result = score(run_dir, cfg, validation)
    tune.report({**result, "train_wall_s": summary["wall_s"], "wall_s": time.perf_counter() - t0,
                 "run_dir": str(run_dir)})


def identity(base: Mapping[str, Any], space: Mapping[str, Any], trials: int, validation: int, seed: int) -> str:
    """What makes two runs the same search: a rerun on the same OUT resumes only when this matches."""
    blob = json.dumps({"base": base, "space": space, "trials": trials, "validation": validation, "seed": seed},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def run(base_cfg: TrainConfig, space: Mapping[str, Mapping[str, list[Any]]], trials: int, out: Path,
        ray: str = "local", concurrent: int = 2, validation: int = 4, seed: int = 0) -> dict[str, Any]:
    """The search (module doc); returns what ``best.json`` holds. TuneError on a bad input, before any work."""
    if trials < 1:
        raise TuneError(f"--trials must be >= 1, got {trials}")
    if concurrent < 1:
        raise TuneError(f"--concurrent must be >= 1, got {concurrent}")
    if validation < 1:
        raise TuneError(f"--validation must be >= 1, got {validation}")
    base = base_cfg.resolved()
    check_against_schema(base, space)
    validation_worlds(base_cfg, validation)  # a family with too few validation seeds fails here
    out = Path(out).resolve()
    ident = identity(base, space, trials, validation, seed)
    state_path = out / STATE
    if state_path.is_file():
        earlier = json.loads(state_path.read_text())
        if earlier.get("identity") != ident:
            raise TuneError(f"{out} holds another search (other config, space, --trials, --validation or --seed); "
                            "give a new --out, or the same command to resume it")
    out.mkdir(parents=True, exist_ok=True)
    state_path.write_text(json.dumps({"identity": ident, "trials": trials, "validation": validation, "seed": seed,
                                      "space": space, "base": base}, indent=2, default=str))

    from admit.core.ray_session import session
    from ray import tune
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    storage, name = out / "ray", "search"
    trainable = tune.with_resources(
        tune.with_parameters(_trial, base=base, out=str(out), validation=validation), {"cpu": 1})
    t0 = time.perf_counter()
    with session(ray):
        if tune.Tuner.can_restore(storage / name):
            tuner = tune.Tuner.restore(str(storage / name), trainable=trainable, resume_errored=True)
        else:
            searcher = ConcurrencyLimiter(OptunaSearch(metric="goodput_rps", mode="max", seed=seed),
                                          max_concurrent=concurrent)
            tuner = tune.Tuner(
                trainable,
                param_space=ray_space(space),
                tune_config=tune.TuneConfig(search_alg=searcher, num_samples=trials),
                run_config=tune.RunConfig(name=name, storage_path=str(storage), verbose=0),
            )
        grid = tuner.fit()
    wall_s = time.perf_counter() - t0
    rows: list[dict[str, Any]] = []
    for i in range(len(grid)):
        r = grid[i]
        m, point = r.metrics or {}, r.config or {}
        rows.append({"trial_id": m.get("trial_id") or Path(r.path).name, "point": {k: point[k] for k in space},
                     "status": "error" if r.error else "done", "error": str(r.error)[:500] if r.error else None,
                     "goodput_rps": m.get("goodput_rps"), "worst_goodput_rps": m.get("worst_goodput_rps"),
                     "train_wall_s": m.get("train_wall_s"), "run_dir": m.get("run_dir")})
    rows.sort(key=lambda x: str(x["trial_id"]))
    (out / "trials.json").write_text(json.dumps(rows, indent=2))
    done = [x for x in rows if x["status"] == "done" and x["goodput_rps"] is not None
            and math.isfinite(x["goodput_rps"])]
    if not done:
        errors = "; ".join(f"{x['trial_id']}: {x['error']}" for x in rows if x["error"])
        raise TuneError(f"no trial finished ({errors or 'none reported a score'}); see {out / 'trials.json'}")
    best = max(done, key=lambda x: x["goodput_rps"])
    cfg_file = Path(best["run_dir"]) / "config.yaml"
    (out / "best.yaml").write_text(cfg_file.read_text())
    summary = {"best": best, "trials": len(rows), "finished": len(done), "wall_s": wall_s,
               "validation": [list(w) for w in validation_worlds(base_cfg, validation)]}
    (out / "best.json").write_text(json.dumps(summary, indent=2))
    return summary
