"""What a rate-envelope check costs per request with Redis (several replicas) against in process (one).

One event loop, one tenant with a requests and a tokens bucket (rates no call exhausts), and per round, side
by side: the in-process `EnvelopeBook.charge` (what a gateway without Redis runs), the shared
`SharedEnvelopeBook.charge_shared` (one GCRA Lua script, EVALSHA over redis.asyncio to a redis-server on
127.0.0.1 — what a gateway with Redis runs), and a bare PING on the same connection (the client's and the
loopback's share of it). Calls are sequential, one in flight, so each is one request's added latency with
nothing queued in front of it. Prints wall-clock p50/p99/mean in microseconds, and the mean CPU time of
this (the gateway's) thread per call, which the machine's load inflates less, and writes them as JSON.

In the same rounds, what one admitted request costs in Redis calls, both ways the gateway can do it: the
two-call path (the ``GCRA`` charge script, then the ``ACQUIRE`` lease script, then the release) against the
combined one (``SharedEnvelopeBook.charge_and_acquire``: one ``CHARGE_ACQUIRE`` script, then the release).
The release is awaited in both, so each figure is the request's whole Redis bill.

    python benchmarks/redis_envelope_bench.py --rounds 5000 --warmup 500

Needs Debian's redis-server (started here on a free port, no persistence) unless --redis-url is given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from admit.core.percentiles import linear_np
from admit.gateway.admission import Lease
from admit.gateway.config import EnvelopeConfig, RedisConfig, TenantConfig
from admit.gateway.envelopes import Charge, EnvelopeBook
from admit.gateway.redis.admission import RedisAdmission
from admit.gateway.redis.envelopes import SharedEnvelopeBook

ENVELOPE = EnvelopeConfig(target="*", requests_per_s=1e9, request_burst=10**9, tokens_per_s=1e12, token_burst=10**12)


def start_redis(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    exe = shutil.which("redis-server")
    if exe is None:
        sys.exit("redis-server is not installed (apt-get install redis-server), or pass --redis-url")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(folder),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
                c.sendall(b"PING\r\n")
                if c.recv(16).startswith(b"+PONG"):
                    return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.02)
    proc.kill()
    sys.exit("redis-server did not start")


def summary(ns: list[int]) -> dict[str, float]:
    us = np.asarray(ns, dtype=float) / 1000
    return {  # percentiles.LINEAR
        "p50_us": round(linear_np(us, 50), 1),
        "p99_us": round(linear_np(us, 99), 1),
        "mean_us": round(float(us.mean()), 1),
    }


async def run(url: str, rounds: int, warmup: int) -> dict[str, Any]:
    tenants = [TenantConfig(name="t", limit=4)]
    adm = RedisAdmission(tenants, RedisConfig(url=url, prefix=f"bench{os.getpid()}"), "bench")
    await adm.start()
    shared = SharedEnvelopeBook(adm.cfg, time.monotonic)
    shared.configure("t", ENVELOPE, time.monotonic())
    await shared.attach(adm)
    local = EnvelopeBook()
    local.configure("t", ENVELOPE, time.monotonic())
    out: dict[str, list[int]] = {"local": [], "redis": [], "ping": [], "two_calls": [], "one_call": []}
    cpu = dict.fromkeys(out, 0)
    clock, cpu_clock = time.perf_counter_ns, time.thread_time_ns

    async def release(lease: Lease) -> None:
        adm.release(lease)  # sends the release in a background task: wait for it, it is part of the bill
        while adm._bg:
            await asyncio.wait(set(adm._bg))

    try:
        for i in range(warmup + rounds):
            c0, t0 = cpu_clock(), clock()
            a = local.charge("t", "m", 100, time.monotonic())
            c1, t1 = cpu_clock(), clock()
            b = await shared.charge_shared("t", "m", 100)
            c2, t2 = cpu_clock(), clock()
            await adm.r.ping()
            c3, t3 = cpu_clock(), clock()
            assert isinstance(a, Charge) and isinstance(b, Charge), (a, b)
            # one admitted request, the two-call way: charge, lease, release
            c4, t4 = cpu_clock(), clock()
            b = await shared.charge_shared("t", "m", 100)
            lease = await adm.acquire(0)
            await release(lease)
            c5, t5 = cpu_clock(), clock()
            # and the combined way: charge and lease in one script, release
            b, got, asked = await shared.charge_and_acquire(0, "m", 100)
            assert isinstance(b, Charge) and got is not None and not asked, (b, got, asked)
            await release(got)
            c6, t6 = cpu_clock(), clock()
            if i >= warmup:
                for k, w, c in (
                    ("local", t1 - t0, c1 - c0),
                    ("redis", t2 - t1, c2 - c1),
                    ("ping", t3 - t2, c3 - c2),
                    ("two_calls", t5 - t4, c5 - c4),
                    ("one_call", t6 - t5, c6 - c5),
                ):
                    out[k].append(w)
                    cpu[k] += c
        assert adm.up, "Redis went away during the run"
    finally:
        await adm.close()
    res: dict[str, Any] = {k: {**summary(v), "cpu_us": round(cpu[k] / rounds / 1000, 1)} for k, v in out.items()}
    res["added_p50_us"] = round(res["redis"]["p50_us"] - res["local"]["p50_us"], 1)
    res["added_p99_us"] = round(res["redis"]["p99_us"] - res["local"]["p99_us"], 1)
    for k in ("p50_us", "p99_us", "cpu_us"):
        res[f"combined_saves_{k}"] = round(res["two_calls"][k] - res["one_call"][k], 1)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5000,
                    help="measured rounds (each: local, Redis, PING, two-call and combined request)")
    ap.add_argument("--warmup", type=int, default=500, help="rounds run first and not measured")
    ap.add_argument("--redis-url", help="an existing server instead of starting one")
    ap.add_argument("--out", type=Path, default=Path("results/redis_envelope_bench.json"))
    args = ap.parse_args()
    if args.rounds < 100 or args.warmup < 0:
        ap.error(f"--rounds must be >= 100 and --warmup >= 0 (got {args.rounds}, {args.warmup})")
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = (None, args.redis_url) if args.redis_url else start_redis(Path(tmp))
        try:
            res = asyncio.run(run(url, args.rounds, args.warmup))
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(10)
    res.update(rounds=args.rounds, load_average=os.getloadavg(), python=sys.version.split()[0])
    print(f"envelope check, {args.rounds} sequential rounds, load average {os.getloadavg()[0]:.2f}")
    print(f"{'':>28} {'p50 us':>8} {'p99 us':>8} {'mean us':>8} {'CPU us':>8}")
    for k, label in (
        ("local", "in process (EnvelopeBook)"),
        ("redis", "Redis GCRA script"),
        ("ping", "Redis PING (same client)"),
    ):
        r = res[k]
        print(f"{label:>28} {r['p50_us']:>8} {r['p99_us']:>8} {r['mean_us']:>8} {r['cpu_us']:>8}")
    print(f"added by Redis: p50 +{res['added_p50_us']} us, p99 +{res['added_p99_us']} us")
    print("one admitted request's Redis calls (release awaited):")
    for k, label in (
        ("two_calls", "charge + lease + release"),
        ("one_call", "charge&lease + release"),
    ):
        r = res[k]
        print(f"{label:>28} {r['p50_us']:>8} {r['p99_us']:>8} {r['mean_us']:>8} {r['cpu_us']:>8}")
    print(
        f"combined script saves: p50 {res['combined_saves_p50_us']} us, p99 {res['combined_saves_p99_us']} us,"
        f" CPU {res['combined_saves_cpu_us']} us per request"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
