"""Benchmark: PPO env steps/s on a scenario family, a recipe at a time, with the rollout and the update split.

Each measurement is a fresh process that builds the training envs and the model exactly as ``admit train``
does (the anchors' caps searched or found first where the tree has ``search_anchors``, ``tune_anchors`` in
older trees, untimed; ``make_vec_env``, ``build_model``, the episode-metrics callback, ``torch_threads`` and,
where the tree and recipe have it, ``update_threads``), runs one warm-up rollout and update (worker start-up,
torch's lazy set-up), then times ``--steps`` env steps: the wall clock, the part spent collecting rollouts
(envs and the policy's forward passes) and the part spent in PPO's update. No evaluations or checkpoints
(``admit train`` adds those; the recipe's own wall time is in its run's summary.json).

``--recipe LABEL=CONFIG[:KEY=VALUE,...]`` names a training config and ``--set`` overrides (dotted keys, YAML
values), run in this tree; ``--before REV --before-recipe LABEL=CONFIG[:...]`` runs a recipe in the code of
``git archive REV`` (CONFIG relative to that tree). Everything alternates within each of ``--repeat`` rounds,
so the machine's noise falls on all of it; every round is printed and the median reported. See
docs/BENCHMARKS.md for the command behind its figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from revision_tree import extract

REPO = Path(__file__).resolve().parent.parent


def child(config: str, sets: list[str], steps: int) -> dict[str, Any]:
    """One measurement in this process (the tree on the import path decides which code runs)."""
    import torch
    from admit.train.callbacks import EpisodeMetricsLogger
    from admit.train.config import load_config
    from admit.train.trainer import build_model, make_vec_env
    from stable_baselines3.common.callbacks import BaseCallback

    import admit

    cfg = load_config(config, sets=sets)
    torch.set_num_threads(cfg.torch_threads)
    torch.distributions.Distribution.set_default_validate_args(False)
    update_threads = getattr(cfg, "update_threads", None) or cfg.torch_threads

    class Phases(BaseCallback):
        """Wall time in rollouts and in updates; the thread counts as admit train sets them."""

        def __init__(self) -> None:
            super().__init__()
            self.rollout = self.update = 0.0
            self.mark: float | None = None

        def _on_rollout_start(self) -> None:
            now = time.perf_counter()
            if self.mark is not None:
                self.update += now - self.mark
            torch.set_num_threads(cfg.torch_threads)
            self.mark = now

        def _on_rollout_end(self) -> None:
            now = time.perf_counter()
            assert self.mark is not None
            self.rollout += now - self.mark
            self.mark = now
            torch.set_num_threads(update_threads)

        def _on_step(self) -> bool:
            return True

    from admit.train import trainer

    # an anchored recipe's caps, searched (or found) before the envs, untimed; older trees name it tune_anchors
    search_anchors = getattr(trainer, "search_anchors", None) or getattr(trainer, "tune_anchors", None)
    if search_anchors is not None:
        search_anchors(cfg, None)
    venv = make_vec_env(cfg, None)
    try:
        model = build_model(cfg, venv, None)
        per_rollout = cfg.n_envs * int(cfg.algo_params()["n_steps"])
        model.learn(per_rollout, callback=[EpisodeMetricsLogger(), Phases()])  # warm-up
        phases = Phases()
        w0, c0 = time.perf_counter(), time.process_time()
        model.learn(steps, callback=[EpisodeMetricsLogger(), phases], reset_num_timesteps=False)
        end = time.perf_counter()
        wall = end - w0
        assert phases.mark is not None
        phases.update += end - phases.mark  # the last update ends where the wall clock stops
        done = int(model.num_timesteps) - per_rollout
    finally:
        venv.close()
    return {"tree": str(Path(admit.train.config.__file__).resolve().parents[1]), "steps": done, "wall_s": wall,
            "steps_per_s": done / wall, "rollout_s": phases.rollout, "update_s": phases.update,
            "trainer_cpu_s": time.process_time() - c0,
            "trainer_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _parse_recipe(text: str) -> tuple[str, str, list[str]]:
    label, _, rest = text.partition("=")
    config, _, sets = rest.partition(":")
    if not label or not config:
        raise SystemExit(f"--recipe wants LABEL=CONFIG[:KEY=VALUE,...], got {text!r}")
    items = [item for item in sets.split(",") if item]
    for item in items:
        if "=" not in item:
            raise SystemExit(f"--recipe override {item!r} is not KEY=VALUE")
    return label, config, items


def _run(tree: Path | None, config: str, overrides: list[str], steps: int) -> dict[str, Any]:
    env = dict(os.environ)
    cwd = REPO
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
        cwd = tree / "admit"
    args = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps([config, overrides, steps])]
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"measurement failed ({config} {overrides}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", action="append", required=False, default=[],
                    help="LABEL=CONFIG[:KEY=VALUE,...], run in this tree (repeat)")
    ap.add_argument("--before", metavar="REV", help="a git revision to measure beside this tree")
    ap.add_argument("--before-recipe", action="append", default=[],
                    help="LABEL=CONFIG[:KEY=VALUE,...], run in the code of --before (repeat)")
    ap.add_argument("--steps", type=int, default=32768, help="timed env steps per measurement")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        config, overrides, steps = json.loads(args.child)
        print(json.dumps(child(config, overrides, steps)))
        return
    if not args.recipe:
        raise SystemExit("give at least one --recipe LABEL=CONFIG[:KEY=VALUE,...]")
    if args.before_recipe and not args.before:
        raise SystemExit("--before-recipe needs --before REV")
    runs = [(_parse_recipe(r), False) for r in args.recipe] + [(_parse_recipe(r), True) for r in args.before_recipe]
    rows: dict[str, list[dict[str, Any]]] = {}
    print(f"{args.steps} timed env steps per measurement, cores {os.cpu_count()}, load {_load()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        tree = None
        if args.before:
            tree = extract(args.before, Path(tmp))
        for r in range(args.repeat):
            load0 = _load()
            for (label, config, overrides), old in runs:
                t = tree if old else None
                res = _run(t, config if t is None else str(t / "admit" / config), overrides, args.steps)
                name = f"{label}, {f'before ({args.before})' if old else 'this tree'}"
                rows.setdefault(name, []).append(res)
                print(f"  round {r + 1} {name:40s} {res['steps_per_s']:7,.0f} env steps/s  rollout "
                      f"{res['rollout_s']:5.2f} s  update {res['update_s']:5.2f} s", flush=True)
            print(f"round {r + 1}: load {load0} -> {_load()}", flush=True)
    print(f"\nmedian of {args.repeat} rounds (range in brackets), per {args.steps} env steps; load {_load()}")
    print("| recipe, tree | env steps/s | rollout s | update s | trainer's peak RSS MB |")
    print("|---|---|---|---|---|")
    for name, res in rows.items():
        cells = [_spread([x[key] for x in res], f) for key, f in (("steps_per_s", ",.0f"), ("rollout_s", ".2f"),
                                                                   ("update_s", ".2f"), ("trainer_max_rss_mb", ",.0f"))]
        print(f"| {name} | {' | '.join(cells)} |")


def _spread(v: list[float], f: str) -> str:
    return f"{statistics.median(v):{f}} [{min(v):{f}}–{max(v):{f}}]"


if __name__ == "__main__":
    main()
