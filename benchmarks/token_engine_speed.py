"""Speed of the token engine on the Azure LLM 2023 code + conversation hour.

Replays both traces merged on their real timestamps (28,185 requests; every request submitted to the engine
at its arrival, no admission limits) through ``TokenEngine`` on a preset, once with macro-steps (the
default) and once step by step, and prints simulated time / CPU time of the process (one core) for each,
side by side; wall time is shown too.

    python benchmarks/token_engine_speed.py [--preset h200-llama3-8b] [--skip-step-mode]
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from datetime import datetime
from importlib import resources

from admit.engine.request import Request
from admit.engine.token_engine import TokenEngine

FILES = ("AzureLLMInferenceTrace_code.csv", "AzureLLMInferenceTrace_conv.csv")


def _seconds(stamp: str) -> float:
    head, _, frac = stamp.partition(".")
    return datetime.strptime(head, "%Y-%m-%d %H:%M:%S").timestamp() + float("0." + (frac or "0"))


def load_azure_hour() -> list[tuple[float, int, int, int]]:
    """(arrival s from the first request, tenant 0=code 1=conv, prompt, output), sorted by arrival."""
    rows = []
    base = resources.files("admit.envs").joinpath("data", "azure_llm_2023")
    for tenant, name in enumerate(FILES):
        for rec in csv.DictReader(base.joinpath(name).read_text().splitlines()):
            rows.append((_seconds(rec["TIMESTAMP"]), tenant, int(rec["ContextTokens"]), int(rec["GeneratedTokens"])))
    rows.sort()
    t0 = rows[0][0]
    return [(t - t0, k, p, o) for t, k, p, o in rows]


def replay(
    rows: list[tuple[float, int, int, int]], preset: str, macro_steps: bool
) -> tuple[TokenEngine, list[Request], float, float, float]:
    """Run the trace to the end; returns (engine, requests, simulated s, CPU s, wall s)."""
    reqs = [Request(i, k, t, p, o, 0.5) for i, (t, k, p, o) in enumerate(rows)]
    eng = TokenEngine(preset, macro_steps=macro_steps)
    inf = math.inf
    n = len(reqs)
    i = 0
    now = 0.0
    start = time.process_time()
    wall0 = time.perf_counter()
    while True:
        ta = reqs[i].arrival if i < n else inf
        te = eng.next_event_time()
        if te <= ta:
            if te == inf:
                break
            now = te
            eng.process_event(te)
        else:
            now = ta
            eng.submit(reqs[i], ta)
            i += 1
    cpu = time.process_time() - start
    wall = time.perf_counter() - wall0
    assert all(not math.isnan(r.finished) for r in reqs)
    return eng, reqs, now, cpu, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="h200-llama3-8b")
    ap.add_argument("--skip-step-mode", action="store_true", help="only the macro-step run")
    args = ap.parse_args()
    rows = load_azure_hour()
    modes = [True] if args.skip_step_mode else [True, False]
    print(f"{len(rows)} requests, preset {args.preset}, one process")
    head = ("mode", "simulated s", "CPU s", "wall s", "× real time", "steps", "preempt.", "TTFT p50/p99 ms")
    print(f"{head[0]:<14}{head[1]:>12}{head[2]:>8}{head[3]:>8}{head[4]:>13}{head[5]:>9}{head[6]:>10}{head[7]:>17}")
    for macro in modes:
        eng, reqs, sim, cpu, wall = replay(rows, args.preset, macro)
        ttft = sorted(r.first_token - r.arrival for r in reqs)
        p50, p99 = 1e3 * ttft[len(ttft) // 2], 1e3 * ttft[int(0.99 * (len(ttft) - 1))]
        name = "macro-steps" if macro else "step-by-step"
        print(
            f"{name:<14}{sim:>12.1f}{cpu:>8.2f}{wall:>8.2f}{sim / cpu:>13.0f}{eng.num_steps:>9}"
            f"{eng.num_preemptions:>10}{f'{p50:.0f}/{p99:.0f}':>17}"
        )


if __name__ == "__main__":
    main()
