"""`admit evaluate` on local worker processes against the same evaluation as Ray tasks, side by side.

Each round runs the evaluation twice, ``--workers W`` and ``--ray local`` (a Ray instance on this machine
with as many CPUs as it has; Ray's own start-up is inside the timing, as a user pays it), in alternating
order, and checks the two results are identical; then the cost of one Ray task on that instance, from a
batch of empty tasks. Prints walls, their ratio per round, and the per-task overhead.

    python benchmarks/ray_eval_bench.py --scenario h200-mixed --policy static --policy aimd \\
        --policy ledger:best --seeds 10 --rounds 2

With ``--results`` each round is the RESULTS sweep instead (``admit results``: every policy on every results
scenario, one Ray session for all of them), ``--workers W`` against ``--ray local``, the per-scenario JSON
compared figure for figure (all but the wall time):

    python benchmarks/ray_eval_bench.py --results --seeds 3 --rounds 1
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


def evaluate(args: argparse.Namespace, out: Path, how: list[str]) -> float:
    cmd = [sys.executable, "-m", "admit.cli", "evaluate", "--scenario", args.scenario, "--seeds", str(args.seeds),
           "--out", str(out), *how]
    for p in args.policy:
        cmd += ["--policy", p]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    return time.perf_counter() - t0


def results(args: argparse.Namespace, out: Path, how: list[str]) -> float:
    cmd = [sys.executable, "-m", "admit.cli", "results", "--seeds", str(args.seeds), "--out", str(out), *how]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    return time.perf_counter() - t0


def sweep_figures(report: Path) -> dict[str, dict]:
    """The per-scenario JSON an `admit results` run left beside its report, less the wall times."""
    out = {}
    for f in sorted((report.parent / "results").glob("*.json")):
        data = json.loads(f.read_text())
        data.pop("wall_s", None)
        for r in data.get("reruns", []):
            r.pop("wall_s", None)
        out[f.name] = data
    return out


def task_overhead_ms(n: int) -> float:
    import ray

    ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        @ray.remote(num_cpus=1)
        def nothing(i: int) -> int:
            return i

        ray.get([nothing.remote(i) for i in range(50)])  # workers started
        t0 = time.perf_counter()
        assert ray.get([nothing.remote(i) for i in range(n)]) == list(range(n))
        return (time.perf_counter() - t0) / n * 1000
    finally:
        ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", default="h200-mixed")
    ap.add_argument("--policy", action="append", default=None)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tasks", type=int, default=1000, help="empty tasks for the per-task overhead")
    ap.add_argument("--results", action="store_true", help="the RESULTS sweep (admit results) instead")
    args = ap.parse_args()
    args.policy = args.policy or ["static", "aimd", "ledger:best"]
    if args.results:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds):
                walls = {}
                order = [("local", ["--workers", str(args.workers)]), ("ray", ["--ray", "local"])]
                for name, how in order if r % 2 == 0 else order[::-1]:
                    walls[name] = results(args, Path(tmp) / name / "RESULTS.md", how)
                a, b = (sweep_figures(Path(tmp) / n / "RESULTS.md") for n in ("local", "ray"))
                print(f"round {r + 1}: admit results --seeds {args.seeds} ({len(a)} scenarios): --workers "
                      f"{args.workers} {walls['local']:.1f} s, --ray local {walls['ray']:.1f} s, ray / local "
                      f"{walls['ray'] / walls['local']:.2f}, identical figures: {bool(a) and a == b}", flush=True)
        print(f"one empty Ray task: {task_overhead_ms(args.tasks):.2f} ms ({args.tasks} tasks, local instance)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            walls: dict[str, float] = {}
            order = [("local", ["--workers", str(args.workers)]), ("ray", ["--ray", "local"])]
            for name, how in order if r % 2 == 0 else order[::-1]:
                walls[name] = evaluate(args, Path(tmp) / f"{name}.json", how)
            a, b = (json.loads((Path(tmp) / f"{n}.json").read_text()) for n in ("local", "ray"))
            a.pop("wall_s", None)
            b.pop("wall_s", None)
            print(f"round {r + 1}: --workers {args.workers} {walls['local']:.1f} s, --ray local {walls['ray']:.1f} s, "
                  f"ray / local {walls['ray'] / walls['local']:.2f}, identical results: {a == b}", flush=True)
    print(f"one empty Ray task: {task_overhead_ms(args.tasks):.2f} ms ({args.tasks} tasks, local instance)")


if __name__ == "__main__":
    main()
