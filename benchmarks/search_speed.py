"""Benchmark: searching the caps of a recipe's training instances from an empty cache, this tree beside another.

    python benchmarks/search_speed.py [--config train/configs/ppo-general-anchored.yaml] [--limit K]
        [--before REV] [--repeat 1]

What ``admit train --config CONFIG`` does before its envs start (``search_anchors``: every train and validation
instance's caps searched, one instance per process on two processes), timed in a child process whose
``ADMIT_CACHE_DIR`` is a new empty folder, after the kernels are loaded. ``--limit K`` keeps the first K train and
K validation instances of each family (``family_pool.train`` / ``validation``), so the old code can be timed
beside the new in minutes; without it, all the recipe's instances (the shipped recipe: 64 + 8 of two families,
144). ``--before REV`` times the same in ``git archive REV`` (its kernels compiled first, untimed), in the same
rounds, and checks that both trees found the same caps for every instance.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from revision_tree import extract

REPO = Path(__file__).resolve().parents[1]


def child(config: str, limit: int | None) -> dict[str, Any]:
    from admit.envs.compiled import warm
    from admit.train.config import load_config
    from admit.train.trainer import search_anchors, worlds_of
    from admit.train.worlds import search_pool

    warm()
    cfg = load_config(Path(config))
    if limit is not None:
        assert cfg.family_pool is not None, "--limit needs a recipe with family_pool"
        cfg = cfg.model_copy(update={"family_pool": cfg.family_pool.model_copy(
            update={"train": min(limit, cfg.family_pool.train), "validation": min(limit, cfg.family_pool.validation)})})
    t0 = time.perf_counter()
    seconds = search_anchors(cfg, None)
    wall = time.perf_counter() - t0
    k = cfg.family_pool.search_seeds if cfg.family_pool is not None else 5
    caps: dict[str, list[int]] = {}
    for split in ("train", "validation"):  # found in the cache now: what the search chose
        caps.update(search_pool(worlds_of(cfg, None, split), workers=1, search_seeds=k))
    return {"search_s": seconds, "wall_s": wall, "instances": len(caps), "caps": caps}


def _run(tree: Path | None, config: str, limit: int | None) -> dict[str, Any]:
    env = dict(os.environ)
    cwd = REPO
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
        cwd = tree / "admit"
    with tempfile.TemporaryDirectory() as cache:
        env["ADMIT_CACHE_DIR"] = cache
        args = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps([config, limit])]
        out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"measurement failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="train/configs/ppo-general-anchored.yaml")
    ap.add_argument("--limit", type=int, help="the first K train and validation instances of each family")
    ap.add_argument("--before", metavar="REV", help="a git revision to time beside this tree")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        config, limit = json.loads(args.child)
        print(json.dumps(child(config, limit)))
        return
    print(f"{args.config}, limit {args.limit}; load average {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        tree = None
        if args.before:
            tree = extract(args.before, Path(tmp))
            env = dict(os.environ, PYTHONPATH=str(tree))
            subprocess.run([sys.executable, "-m", "admit.envs.compiled"], cwd=tree / "admit", env=env, check=True)
        best: dict[str, dict[str, Any]] = {}
        for r in range(args.repeat):
            for name, t in (("this tree", None), (f"before ({args.before})", tree)):
                if name != "this tree" and t is None:
                    continue
                cfg = args.config if t is None else str(t / "admit" / args.config)
                res = _run(t, cfg, args.limit)
                print(f"  round {r + 1} {name:22s} {res['instances']} instances searched in {res['search_s']:.1f} s "
                      f"(load average {os.getloadavg()[0]:.2f})", flush=True)
                if name not in best or res["search_s"] < best[name]["search_s"]:
                    best[name] = res
    now = best["this tree"]
    if len(best) > 1:
        old = best[f"before ({args.before})"]
        same = old["caps"] == now["caps"]
        print(f"this tree {now['search_s']:.1f} s, before {old['search_s']:.1f} s: "
              f"{old['search_s'] / now['search_s']:.2f}x faster; the same caps for every instance: {same}")
    else:
        print(f"this tree {now['search_s']:.1f} s for {now['instances']} instances")


if __name__ == "__main__":
    main()
