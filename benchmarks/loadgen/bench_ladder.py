"""Side-by-side load-generator benchmark: the mock server on one core, the generator on the other.

For each rate of the ladder this runs one stage of ``admit loadgen run`` (and, when given a peer
command template, the peer) against ``admit.loadgen.mockserver`` with a fixed TTFT and inter-token
delay, and prints per rate: achieved rate and ratio, send-lag p50/p99, the latency bias against the
server's known delays (measured p50 minus configured) and generator CPU-seconds per 1,000 requests
(user + system time of the generator process tree, from ``getrusage(RUSAGE_CHILDREN)``).

Usage (from the repository root)::

    python benchmarks/loadgen/bench_ladder.py --rates 100,500,1000,2000,4000,8000 --duration 10 \\
        --server-cpu 0 --client-cpu 1 --out runs/bench_loadgen
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

PROMPT, OUTPUT = 32, 16


def start_server(cpu: str | None, ttft_ms: float, itl_ms: float) -> tuple[subprocess.Popen, str]:
    cmd = [
        sys.executable,
        "-m",
        "admit.loadgen.mockserver",
        "--port",
        "0",
        "--ttft-ms",
        str(ttft_ms),
        "--itl-ms",
        str(itl_ms),
    ]
    if cpu is not None and shutil.which("taskset"):
        cmd = ["taskset", "-c", cpu, *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # the server prints one line once it listens
    if not line.startswith("listening on "):
        proc.kill()
        raise SystemExit(f"server did not start: {line!r}")
    return proc, "http://" + line.split()[-1]


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_admit(url: str, rate: float, duration: float, cpu: str | None, workers: int, out: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "admit.cli",
        "loadgen",
        "run",
        "--url",
        url,
        "--model",
        "mock",
        "--duration",
        str(duration),
        "--workers",
        str(workers),
        "--no-plot",
        "--out",
        str(out),
        "--tenant",
        f"name=a,rate={rate / 2},arrival=poisson,prompt={PROMPT},output={OUTPUT}",
        "--tenant",
        f"name=b,rate={rate / 2},arrival=poisson,prompt={PROMPT},output={OUTPUT}",
    ]
    if cpu is not None and shutil.which("taskset"):
        cmd = ["taskset", "-c", cpu, *cmd]
    before, t = children_cpu(), time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall, cpu_s = time.monotonic() - t, children_cpu() - before
    s = json.loads((out / "stage_0.json").read_text())
    lat = s["latency"]
    return {
        "tool": "admit",
        "asked": rate,
        "achieved": s["load_summary"]["achieved_rate"],
        "ratio": s["load_summary"]["achieved_ratio"],
        "lag_p50_ms": s["load_summary"]["send_lag"]["p50"],
        "lag_p99_ms": s["load_summary"]["send_lag"]["p99"],
        "ttft_p50_ms": lat["time_to_first_token"]["p50"],
        "ttft_p99_ms": lat["time_to_first_token"]["p99"],
        "itl_p50_ms": lat["inter_token_latency"]["p50"],
        "sched_ttft_p99_ms": lat["scheduled_time_to_first_token"]["p99"],
        "errors": s["requests"]["failed"],
        "cpu_s_per_1k": round(cpu_s / max(s["load_summary"]["sent"], 1) * 1000, 3),
        "wall_s": round(wall, 1),
        "valid": s["valid"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="100,500,1000,2000,4000,8000")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--ttft-ms", type=float, default=10.0)
    ap.add_argument("--itl-ms", type=float, default=1.0)
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    ap.add_argument("--workers", type=int, default=1, help="generator processes (one per client core)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench_loadgen"))
    args = ap.parse_args()
    server, url = start_server(args.server_cpu, args.ttft_ms, args.itl_ms)
    rows = []
    try:
        for rate in (float(r) for r in args.rates.split(",")):
            row = run_admit(url, rate, args.duration, args.client_cpu, args.workers, args.out / f"admit_{rate:g}")
            row["ttft_bias_ms"] = round(row["ttft_p50_ms"] - args.ttft_ms, 3)
            row["itl_bias_ms"] = round(row["itl_p50_ms"] - args.itl_ms, 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        server.terminate()
        server.wait()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=2))
    ok = [r["asked"] for r in rows if r["ratio"] >= 0.99 and r["lag_p99_ms"] <= 5.0 and r["errors"] == 0]
    print(f"highest rate on schedule (achieved >= 99 %, lag p99 <= 5 ms, no errors): {max(ok) if ok else None}")


if __name__ == "__main__":
    main()
