"""Profile one load-generator worker in-process: CPU per request and where it goes.

Starts ``admit.loadgen.mockserver`` pinned to ``--server-cpu``, pins this process to ``--client-cpu``,
runs one :class:`~admit.loadgen.worker.Worker` over a Poisson schedule (32 prompt / 16 output tokens,
streamed) and prints CPU-ms per request (``getrusage`` around the run, start-up excluded), the send-lag
p50/p99 and, with ``--profile``, the functions with the most own time (cProfile).

Usage (repository root)::

    python benchmarks/loadgen/profile_worker.py --rate 2000 --duration 5 --profile
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import pstats
import resource
import shutil
import subprocess
import sys
from time import monotonic_ns

from admit.loadgen.config import RunConfig, parse_tenant_flag
from admit.loadgen.encode import Target, TenantTemplate
from admit.loadgen.schedule import build_schedule
from admit.loadgen.worker import NS, Worker, WorkerJob, new_loop


def start_server(cpu: str | None, ttft_ms: float, itl_ms: float) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "admit.loadgen.mockserver", "--port", "0", "--ttft-ms", str(ttft_ms)]
    cmd += ["--itl-ms", str(itl_ms)]
    if cpu is not None and shutil.which("taskset"):
        cmd = ["taskset", "-c", cpu, *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("listening on "):
        proc.kill()
        raise SystemExit(f"server did not start: {line!r}")
    return proc, "http://" + line.split()[-1]


def cpu_s() -> tuple[float, float]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime, ru.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--ttft-ms", type=float, default=5.0)
    ap.add_argument("--itl-ms", type=float, default=0.0)
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    ap.add_argument("--profile", action="store_true", help="run under cProfile and print the top functions")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--spin-us", type=float, default=None, help="override WorkerJob.spin_ns (microseconds)")
    args = ap.parse_args()
    if args.client_cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(c) for c in args.client_cpu.split(",")})
    server, url = start_server(args.server_cpu, args.ttft_ms, args.itl_ms)
    try:
        tenant = parse_tenant_flag(f"name=a,rate={args.rate},arrival=poisson,prompt=32,output=16")
        cfg = RunConfig(url=url, duration=args.duration, seed=1, workers=1, tenants=[tenant])
        sch = build_schedule(cfg)
        target = Target.from_url(url, "completions")
        warm = 4 + int(args.rate * 0.05)
        job = WorkerJob(0, 1, target, [TenantTemplate("a", "mock", "completions")], sch, warm_connections=warm)
        if args.spin_us is not None:
            job.spin_ns = int(args.spin_us * 1000)
        loop = new_loop()
        asyncio.set_event_loop(loop)
        w = Worker(job, loop)
        w.encode()
        loop.run_until_complete(w.warm())
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 50, 100)  # as worker_main does
        ticks = [0]
        tick = w._tick

        def counted_tick() -> None:
            ticks[0] += 1
            tick()

        w._tick = counted_tick  # type: ignore[method-assign]
        prof = cProfile.Profile() if args.profile else None
        c0 = cpu_s()
        if prof is not None:
            prof.enable()
        loop.run_until_complete(w.run(monotonic_ns() + NS // 10))
        if prof is not None:
            prof.disable()
        c1 = cpu_s()
        user, system = c1[0] - c0[0], c1[1] - c0[1]
        used = user + system
        loop.close()
        m = w.metrics[0]
        lag = m.hist["send_lag"]
        print(
            f"rate {args.rate:g}/s  sent {m.sent}/{len(sch)}  ok {m.ok}  errors {m.errors}  "
            f"cpu {used:.2f} s (user {user:.2f}, sys {system:.2f}) = {used / max(m.sent, 1) * 1e3:.3f} ms/request  "
            f"lag p50 {lag.percentile(50) / 1e6:.3f} ms p99 {lag.percentile(99) / 1e6:.3f} ms  "
            f"ttft p50 {m.hist['ttft'].percentile(50) / 1e6:.3f} ms  conns {w.opened}  ticks {ticks[0]}"
        )
        if prof is not None:
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
