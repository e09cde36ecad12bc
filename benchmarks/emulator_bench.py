"""Emulator benchmark: many concurrent streams, client-measured TTFT/TPOT against the engine model's own.

Starts ``python -m admit.emulator`` in a subprocess, then for each concurrency level runs that many
closed-loop clients (one keep-alive connection each, a new streamed completion as soon as the previous
one ends, ``ignore_eos`` so the answer length is known), spread over ``--client-procs`` uvloop processes. Every token
event is stamped with CLOCK_MONOTONIC when its bytes arrive. Afterwards ``GET /debug/requests`` gives
the engine model's timestamps of every request (on the same monotonic clock, Linux), matched by id:

* TTFT: client = first token event received − request sent; model = first token − request received.
* TPOT: (last token − first token) / (tokens − 1), on both sides.

Ratios client/model are printed per level, side by side, from one run; requests started in the first
``--warmup`` seconds of a level are left out (the ramp). Pin the server and the client to different cores
with ``--server-cpu``/``--client-cpu`` to keep them from competing.

    python benchmarks/emulator_bench.py --levels 100,500,1000 --duration 30 --warmup 6 --client-procs 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import re
import resource
import selectors
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import uvloop
from admit.core.percentiles import linear_np_many

_ID = re.compile(rb'"id":"cmpl-(\d+)"')


@dataclass
class Sample:
    rid: int
    level: int
    sent: float
    first: float
    last: float
    tokens: int
    prompt_words: int
    worker: int


class StreamClient(asyncio.Protocol):
    """One connection; sends one streamed completion at a time and stamps its token events."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiter: asyncio.Future[None] | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # uvloop sends a small write at the end of the loop turn, which in a client busy reading hundreds
        # of streams is long after the request was stamped as sent; above the high-water mark it sends at
        # once, so a mark of 0 makes every request leave when it is stamped
        transport.set_write_buffer_limits(high=0)  # type: ignore[attr-defined]
        self.ready.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("server closed the connection"))

    def start(self, payload: bytes, max_tokens: int) -> asyncio.Future[None]:
        self.head = True
        self.buf = b""
        self.events = 0
        self.prev_nl = False
        self.tail = b""
        self.rid = -1
        self.first = self.last = float("nan")
        self.max_tokens = max_tokens
        self.waiter = asyncio.get_running_loop().create_future()
        self.sent = time.monotonic()
        assert self.transport is not None
        self.transport.write(payload)
        return self.waiter

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        if self.head:
            self.buf += data
            i = self.buf.find(b"\r\n\r\n")
            if i < 0:
                return
            if not self.buf.startswith(b"HTTP/1.1 200"):
                self.waiter.set_exception(RuntimeError(self.buf[:200].decode("latin-1")))  # type: ignore[union-attr]
                return
            self.head = False
            data = self.buf[i + 4 :]
            self.buf = b""
            if not data:
                return
        if self.rid < 0:
            m = _ID.search(data)
            if m:
                self.rid = int(m.group(1))
        n = data.count(b"\n\n") + (1 if self.prev_nl and data[:1] == b"\n" else 0)
        self.prev_nl = data[-1:] == b"\n"
        before = self.events
        self.events += n
        if before == 0 and self.events > 0:
            self.first = now
        if before < self.max_tokens <= self.events:
            self.last = now
        self.tail = (self.tail + data)[-5:]
        if self.tail == b"0\r\n\r\n" and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


def _payload(model: str, prompt_words: int, max_tokens: int, seq: int) -> bytes:
    body = json.dumps({
        "model": model, "prompt": f"{seq}" + " hello" * prompt_words, "max_tokens": max_tokens,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }).encode()  # fmt: skip
    head = "POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
    return head.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body


async def _worker(worker: int, host: str, port: int, model: str, level: int, start_at: float, stop_at: float,
                  args: argparse.Namespace, rng: random.Random, out: list[Sample]) -> None:  # fmt: skip
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    transport, proto = await loop.create_connection(StreamClient, host, port)
    await proto.ready
    seq = 0
    while time.monotonic() < stop_at:
        pw = rng.randint(args.prompt_min, args.prompt_max)
        ot = rng.randint(args.output_min, args.output_max)
        seq += 1
        await proto.start(_payload(model, pw, ot, seq), ot)
        out.append(Sample(proto.rid, level, proto.sent, proto.first, proto.last, ot, pw, worker))
    transport.close()


async def _run_part(host: str, port: int, model: str, level: int, t0: float, part: int, parts: int,
                    args: argparse.Namespace) -> list[Sample]:  # fmt: skip
    """This process's share of a level: workers ``part, part + parts, ...``, all starting from ``t0``."""
    samples: list[Sample] = []
    rng = random.Random(args.seed * 1000 + level)
    rngs = [random.Random(rng.random()) for _ in range(level)]
    stop = t0 + args.duration
    await asyncio.gather(*[_worker(i, host, port, model, level, t0 + args.ramp * i / level, stop, args, rngs[i],
                                   samples) for i in range(part, level, parts)])  # fmt: skip
    return samples


def _part_process(host: str, port: int, model: str, level: int, t0: float, part: int, parts: int,
                  args: argparse.Namespace) -> list[Sample]:  # fmt: skip
    return uvloop.run(_run_part(host, port, model, level, t0, part, parts, args))


def run_level(host: str, port: int, model: str, level: int, args: argparse.Namespace) -> tuple[float, list[Sample]]:
    """``level`` closed-loop streams for ``args.duration`` s, spread over ``args.client_procs`` processes.

    Several client processes keep each loop's turns short, so token bytes are stamped soon after they
    arrive, and the client takes a fair share of a machine shared with other work.
    """
    t0 = time.monotonic() + 1.0  # CLOCK_MONOTONIC is shared by all processes
    with ProcessPoolExecutor(args.client_procs, mp_context=multiprocessing.get_context("fork")) as pool:
        futs = [pool.submit(_part_process, host, port, model, level, t0, k, args.client_procs, args)
                for k in range(args.client_procs)]  # fmt: skip
        samples = [s for f in futs for s in f.result()]
    return t0, samples


def _start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[str], str, int]:
    cmd = [sys.executable, "-m", "admit.emulator", "--port", "0", "--preset", args.preset, "--seed", str(args.seed)]
    if args.server_cpu is not None:
        cmd = ["taskset", "-c", str(args.server_cpu), *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if sel.select(timeout=0.2):
            line = proc.stdout.readline()  # type: ignore[union-attr]
            if line.startswith("listening on "):
                host, port = line.split()[-1].rsplit(":", 1)
                return proc, host, int(port)
        if proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit("the emulator did not start")


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read()


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
    """CPU seconds of this process's finished children (the client processes; the server still runs)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _runqueue_wait(pid: int) -> float:
    """Seconds the process's threads have waited for a CPU while runnable (/proc/PID/schedstat)."""
    total = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            total += int(f.read().split()[1]) / 1e9
    return total


def _stats(x: np.ndarray) -> dict[str, float]:
    """Mean and percentiles (core/percentiles.py's LINEAR) of one measurement."""
    p50, p90, p99 = linear_np_many(x, [50, 90, 99])
    return {"mean": float(x.mean()), "p50": p50, "p90": p90, "p99": p99}


def summarize(
    level: int,
    t0: float,
    samples: list[Sample],
    model_rows: dict[int, dict[str, float]],
    args: argparse.Namespace,
    server_cpu: float,
    client_cpu: float,
    wait: float,
) -> dict[str, Any]:
    """One level's figures; ``wait`` is the server's run-queue wait over the level."""
    pairs = [(s, model_rows[s.rid]) for s in samples if s.sent >= t0 + args.warmup and s.rid in model_rows]
    c_ttft = np.array([s.first - s.sent for s, _ in pairs])
    m_ttft = np.array([m["first_token"] - m["arrival"] for _, m in pairs])
    c_tpot = np.array([(s.last - s.first) / (s.tokens - 1) for s, _ in pairs])
    m_tpot = np.array([(m["finished"] - m["first_token"]) / (m["output_tokens"] - 1) for _, m in pairs])
    return {
        "streams": level, "requests": len(pairs), "tokens_per_s": sum(s.tokens for s in samples) / args.duration,
        "ttft_client_s": _stats(c_ttft), "ttft_model_s": _stats(m_ttft),
        "tpot_client_s": _stats(c_tpot), "tpot_model_s": _stats(m_tpot),
        "ttft_ratio_mean": float(c_ttft.mean() / m_ttft.mean()),
        "ttft_ratio_p50": float(np.median(c_ttft) / np.median(m_ttft)),
        "tpot_ratio_mean": float(c_tpot.mean() / m_tpot.mean()),
        "tpot_ratio_p50": float(np.median(c_tpot) / np.median(m_tpot)),
        # where the client's extra TTFT goes: request bytes to the server, first token to the client
        "send_lag_ms": _stats(np.array([m["arrival"] - s.sent for s, m in pairs]) * 1e3),
        "delivery_lag_ms": _stats(np.array([s.first - m["first_token"] for s, m in pairs]) * 1e3),
        "server_cpu_s_per_s": server_cpu / args.duration, "client_cpu_s_per_s": client_cpu / args.duration,
        # time the server was runnable but had no CPU (other processes on the core): the starvation signal
        "server_runqueue_wait_s_per_s": wait / args.duration,
    }  # fmt: skip


def _print(rows: list[dict[str, Any]]) -> None:
    print(
        "streams  reqs  tok/s | TTFT client/model ms, ratio mean p50 | TPOT client/model ms, ratio mean p50 "
        "| send lag p50/p99 ms | delivery lag p50/p99 ms | CPU s/s server client"
    )
    for r in rows:
        ct, mt, cp, mp = r["ttft_client_s"], r["ttft_model_s"], r["tpot_client_s"], r["tpot_model_s"]
        sl, dl = r["send_lag_ms"], r["delivery_lag_ms"]
        ttft = f"{ct['mean'] * 1e3:6.1f} / {mt['mean'] * 1e3:6.1f},{r['ttft_ratio_mean']:.3f} {r['ttft_ratio_p50']:.3f}"
        tpot = f"{cp['mean'] * 1e3:6.2f} / {mp['mean'] * 1e3:6.2f},{r['tpot_ratio_mean']:.3f} {r['tpot_ratio_p50']:.3f}"
        print(f"{r['streams']:>7} {r['requests']:>5} {r['tokens_per_s']:>6.0f} | {ttft} | {tpot} | "
              f"{sl['p50']:5.2f} / {sl['p99']:6.2f} | {dl['p50']:5.2f} / {dl['p99']:6.2f} | "
              f"{r['server_cpu_s_per_s']:.2f} {r['client_cpu_s_per_s']:.2f} | "
              f"{r['server_runqueue_wait_s_per_s']:.2f}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="h200-llama3-8b")
    ap.add_argument("--levels", default="100,500", help="concurrent streams per level, comma-separated")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per level")
    ap.add_argument("--ramp", type=float, default=2.0, help="seconds over which a level's clients start")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds at a level's start left out")
    ap.add_argument("--prompt-min", type=int, default=100, help="prompt words (tokens = words + 2)")
    ap.add_argument("--prompt-max", type=int, default=1000)
    ap.add_argument("--output-min", type=int, default=50)
    ap.add_argument("--output-max", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--server-cpu", type=int, default=None, help="pin the emulator to this core")
    ap.add_argument("--client-cpu", type=int, default=None, help="pin the client processes to this core")
    ap.add_argument("--client-procs", type=int, default=4, help="client processes sharing the streams")
    ap.add_argument("--out", default=None, help="write the summary JSON here")
    args = ap.parse_args()
    levels = [int(v) for v in args.levels.split(",")]
    if args.client_cpu is not None:
        os.sched_setaffinity(0, {args.client_cpu})
    proc, host, port = _start_server(args)
    runs = []
    try:
        base = f"http://{host}:{port}"
        model = json.loads(_get(base + "/v1/models"))["data"][0]["id"]
        for level in levels:
            s0, c0, w0 = _cpu_seconds(proc.pid), _children_cpu(), _runqueue_wait(proc.pid)
            t0, samples = run_level(host, port, model, level, args)
            runs.append((level, t0, samples, _cpu_seconds(proc.pid) - s0, _children_cpu() - c0,
                         _runqueue_wait(proc.pid) - w0))  # fmt: skip
        dbg = json.loads(_get(base + "/debug/requests"))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    model_rows = {row[0]: dict(zip(dbg["fields"], row, strict=True)) for row in dbg["rows"]}
    rows = [summarize(*run[:3], model_rows, args, *run[3:]) for run in runs]
    _print(rows)
    print("engine-loop event lateness (s):", dbg["event_lateness_s"])
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "load_average": os.getloadavg(), "levels": rows,
                       "event_lateness_s": dbg["event_lateness_s"]}, f, indent=2)  # fmt: skip


if __name__ == "__main__":
    main()
