"""Gateway memory under a soak: RSS of `admit gateway` (in-process admission) over a long run with faults.

The run, all on 127.0.0.1:

* the project's mock backend (``python -m admit.loadgen.mockserver``; 10 ms TTFT and ITL by default, 8-token
  streams, so a stream lasts about 90 ms) as a child process, killed with SIGKILL ``--kills`` times spread
  over the run and restarted on the same port at once;
* the gateway (``python -m admit.gateway``, run through a small driver, below) with two tenants at limit 8
  and a request log, as a deployment has one;
* an asyncio client in a process of its own (``gateway_soak.py load``): open-loop Poisson arrivals at
  ``--rate`` req/s of streamed completions, the tenant drawn at random, keep-alive connections; a fraction
  ``--disconnect`` of the clients close their connection after the stream's first event. Each request
  carries a step id (``x-admit-step-id: soak-N``) that the request log records.

Every ``--sample-s`` seconds the gateway's RSS (``VmRSS`` of /proc/PID/status) and the client's progress are
sampled. At the end the run checks the gateway's promises: every request terminal at the client (an answer
read to its end, or the connection closed; none still waiting after ``--request-timeout-s``), every request
the gateway received logged exactly once (its step id), and in flight back to 0 (``GET /admin/state``). Then
it asks the driver for a full ``gc.collect()`` and reports what that freed: garbage the cyclic collector had
not reached yet comes back there, memory held by live objects does not.

The verdict: over the samples after minute ``--warmup-min`` (5), the RSS's max − min, its greatest distance
from the first of those samples (``within ±5 MB`` means at most ``--band-mb``) and its slope in MB/min by
least squares.

The driver runs ``admit.gateway``'s own entry point (``runpy``) in the gateway's process, after installing a
SIGUSR2 handler that writes what the benchmark asks for into the working directory: the RSS, traced memory,
GC counts, a full collection's yield, or (with ``--tracemalloc FRAMES``, which starts tracing at start-up as
``PYTHONTRACEMALLOC`` would) a tracemalloc snapshot. With tracing on, snapshots are taken at minute
``--snap-min`` and at the end of the load, and the lines that grew most between them are printed. Tracing
costs CPU and memory of its own: its RSS figures are not the product's.

    python benchmarks/gateway_soak.py --minutes 30 [--rate 100] [--kills 3] [--json out.json] \
        [--tracemalloc 25] [--baseline REV] [--workdir DIR]

``--baseline REV`` runs the gateway of another git revision (its packages taken with ``git archive``, as
benchmarks/gateway_bench.py does), e.g. the commit before a fix, for a before/after pair.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

from admit.live.stack import Stack, StackError, http_json, poll

KEYS = {"alpha": "sk-soak-alpha-key-0123456789", "beta": "sk-soak-beta-key-0123456789"}

# The gateway's process: a SIGUSR2 handler that answers the benchmark's requests, then admit.gateway's own
# entry point. argv: [driver dir, package dir of another revision or "", gateway args...].
DRIVER = r"""
import gc, json, os, runpy, signal, sys, tracemalloc
where = sys.argv.pop(1)
code = sys.argv.pop(1)
if code:
    sys.path.insert(0, code)

def rss():
    with open('/proc/self/status') as fh:
        for line in fh:
            if line.startswith('VmRSS:'):
                return int(line.split()[1]) * 1024
    return 0

def types():
    got = {}
    for o in gc.get_objects():
        k = type(o).__module__ + '.' + type(o).__qualname__
        got[k] = got.get(k, 0) + 1
    return sorted(got.items(), key=lambda kv: -kv[1])[:25]

def answer(signum, frame):
    with open(os.path.join(where, 'ask')) as fh:
        tag, what = fh.read().split()
    out = {'tag': tag, 'rss': rss(), 'gc_count': gc.get_count(), 'gc_frozen': gc.get_freeze_count(),
           'gc_threshold': gc.get_threshold(), 'gc_stats': gc.get_stats()}
    if tracemalloc.is_tracing():
        out['traced'] = tracemalloc.get_traced_memory()[0]
    if what == 'collect':
        out['types'] = types()
        out['collected'] = gc.collect()
        out['rss_after'] = rss()
        out['types_after'] = types()
        if tracemalloc.is_tracing():
            out['traced_after'] = tracemalloc.get_traced_memory()[0]
    elif what == 'snapshot' and tracemalloc.is_tracing():
        out['collected'] = gc.collect()  # live memory only: garbage comes and goes with the collector's timing
        path = os.path.join(where, 'snap-' + tag + '.pickle')
        tracemalloc.take_snapshot().dump(path)
        out['snapshot'] = path
    tmp = os.path.join(where, 'answer-' + tag + '.tmp')
    with open(tmp, 'w') as fh:
        json.dump(out, fh)
    os.replace(tmp, os.path.join(where, 'answer-' + tag + '.json'))

signal.signal(signal.SIGUSR2, answer)
runpy.run_module('admit.gateway', run_name='__main__', alter_sys=True)
"""


# ----------------------------------------------------------------------------------------------- the load
class Client:
    """Open-loop streamed completions through keep-alive connections; the outcome of each request counted."""

    def __init__(self, host: str, port: int, rate: float, duration_s: float, disconnect: float, tokens: int,
                 timeout_s: float, seed: int) -> None:
        self.host, self.port = host, port
        self.rate, self.duration_s, self.disconnect, self.tokens = rate, duration_s, disconnect, tokens
        self.timeout_s = timeout_s
        self.rng = random.Random(seed)
        self.idle: list[tuple[float, asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.sent = 0
        self.done = 0
        self.outcomes: Counter[str] = Counter()
        self.unsent = 0  # never reached the gateway (no connection): not expected in its request log
        self.max_lag_s = 0.0
        self.tasks: set[asyncio.Task[None]] = set()

    async def run(self, progress_s: float) -> None:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        reporter = asyncio.ensure_future(self._report(t0, progress_s))
        t = t0
        end = t0 + self.duration_s
        while True:
            t += self.rng.expovariate(self.rate)
            if t >= end:
                break
            delay = t - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                self.max_lag_s = max(self.max_lag_s, -delay)
            tenant = self.rng.choice(("alpha", "beta"))
            leave = self.rng.random() < self.disconnect
            task = asyncio.ensure_future(self._one(self.sent, tenant, leave))
            self.sent += 1
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        while self.tasks:
            await asyncio.gather(*list(self.tasks))
        reporter.cancel()
        self._print(loop.time() - t0, final=True)
        for _, _, w in self.idle:
            w.close()

    async def _report(self, t0: float, every: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(every)
            self._print(loop.time() - t0)

    def _print(self, t: float, final: bool = False) -> None:
        print(json.dumps({"t": round(t, 3), "sent": self.sent, "done": self.done, "unsent": self.unsent,
                          "outcomes": dict(self.outcomes), "max_lag_s": round(self.max_lag_s, 3),
                          "final": final}), flush=True)

    async def _conn(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        now = time.monotonic()
        while self.idle:
            since, r, w = self.idle.pop()
            if now - since < 10.0 and not w.is_closing() and not r.at_eof():
                return r, w
            w.close()
        return await asyncio.open_connection(self.host, self.port)

    async def _one(self, n: int, tenant: str, leave: bool) -> None:
        try:
            outcome = await asyncio.wait_for(self._request(n, tenant, leave), self.timeout_s)
        except TimeoutError:
            outcome = "TIMEOUT"  # not terminal: the promise is broken
        self.outcomes[outcome] += 1
        self.done += 1

    async def _request(self, n: int, tenant: str, leave: bool) -> str:
        try:
            r, w = await self._conn()
        except OSError:
            self.unsent += 1
            return "connect-error"
        body = json.dumps({"model": "mock", "prompt": "soak", "max_tokens": self.tokens, "stream": True}).encode()
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"Authorization: Bearer {KEYS[tenant]}\r\nx-admit-step-id: soak-{n}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        keep = False
        try:
            w.write(head + body)
            status_line = await r.readuntil(b"\r\n")
            status = int(status_line.split()[1])
            length, chunked, close = 0, False, False
            while (line := await r.readuntil(b"\r\n")) != b"\r\n":
                k, _, v = line.decode("latin-1").partition(":")
                k, v = k.strip().lower(), v.strip().lower()
                if k == "content-length":
                    length = int(v)
                elif k == "transfer-encoding":
                    chunked = "chunked" in v
                elif k == "connection":
                    close = v == "close"
            if not chunked:
                await r.readexactly(length)
                keep = not close
                return "ok-plain" if status == 200 else f"http_{status}"
            events = 0
            seen_done = False
            while True:
                size = int((await r.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    while await r.readuntil(b"\r\n") != b"\r\n":  # trailers
                        pass
                    break
                data = await r.readexactly(size + 2)
                events += data.count(b"data:")
                seen_done = seen_done or b"[DONE]" in data
                if leave and events:
                    return "left"  # closed below: the gateway sees the client go mid-stream
            keep = not close
            if status != 200:
                return f"http_{status}"
            return "ok" if seen_done else "incomplete-stream"
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError, IndexError):
            return "closed"  # the gateway closed the connection: an end the client sees
        finally:
            if keep:
                self.idle.append((time.monotonic(), r, w))
            else:
                w.close()


def load_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="gateway_soak.py load")
    ap.add_argument("--url", required=True)
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--duration-s", type=float, required=True)
    ap.add_argument("--disconnect", type=float, required=True)
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--timeout-s", type=float, required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    host, port = a.url.removeprefix("http://").rsplit(":", 1)
    client = Client(host, int(port), a.rate, a.duration_s, a.disconnect, a.tokens, a.timeout_s, a.seed)
    import uvloop

    uvloop.run(client.run(progress_s=1.0))


# ----------------------------------------------------------------------------------------------- the run
def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def last_progress(path: Path) -> dict[str, Any] | None:
    lines = [x for x in path.read_text(errors="replace").splitlines() if x.startswith("{")] if path.exists() else []
    return json.loads(lines[-1]) if lines else None


def ask(pid: int, where: Path, tag: str, what: str, timeout: float = 120.0) -> dict[str, Any]:
    """Ask the gateway's driver for ``what`` (state, collect, snapshot); its answer."""
    out = where / f"answer-{tag}.json"
    out.unlink(missing_ok=True)
    (where / "ask").write_text(f"{tag} {what}")
    os.kill(pid, signal.SIGUSR2)
    poll(out.exists, timeout, f"the gateway's answer to {what}", 0.05)
    answer: dict[str, Any] = json.loads(out.read_text())
    return answer


def slope_mb_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) points, in MB per minute."""
    n = len(points)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return 60 * sum((t - mt) * (v - mv) for t, v in points) / var if var else 0.0


def kill_backend(stack: Stack) -> None:
    proc = stack.procs.pop("mock")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def start_backend(stack: Stack, port: int, ttft_ms: float, itl_ms: float) -> str:
    stack.spawn("mock", ["-m", "admit.loadgen.mockserver", "--host", "127.0.0.1", "--port", str(port),
                         "--ttft-ms", f"{ttft_ms:g}", "--itl-ms", f"{itl_ms:g}"])
    return stack.wait_listening("mock")


def top_growth(old: Path, new: Path, limit: int = 12) -> list[dict[str, Any]]:
    """The allocation sites that grew most between two tracemalloc snapshots (by line, and the whole
    traceback of the first few)."""
    keep = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib*>"),
            tracemalloc.Filter(False, "<string>")]
    a = tracemalloc.Snapshot.load(str(old)).filter_traces(keep)
    b = tracemalloc.Snapshot.load(str(new)).filter_traces(keep)
    rows = []
    grew = sorted(b.compare_to(a, "traceback"), key=lambda s: -s.size_diff)[:50]
    by_tb = {str(s.traceback): s for s in grew}
    for s in sorted(b.compare_to(a, "lineno"), key=lambda s: -s.size_diff)[:limit]:
        frame = s.traceback[0]
        row = {"where": f"{frame.filename}:{frame.lineno}", "size_diff_kb": round(s.size_diff / 1024, 1),
               "count_diff": s.count_diff, "size_kb": round(s.size / 1024, 1)}
        for t in by_tb.values():  # the biggest traceback that ends at this line (a Traceback is oldest first)
            if t.traceback[-1] == frame:
                row["traceback"] = [f"{f.filename}:{f.lineno}" for f in reversed(t.traceback)][:8]
                break
        rows.append(row)
    return rows


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "load":
        load_main(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0, help="length of the load")
    ap.add_argument("--rate", type=float, default=100.0, help="requests per second (Poisson arrivals)")
    ap.add_argument("--kills", type=int, default=3, help="times the backend is killed with SIGKILL and restarted")
    ap.add_argument("--disconnect", type=float, default=0.1, help="fraction of clients that leave mid-stream")
    ap.add_argument("--tokens", type=int, default=8, help="max_tokens of each streamed request")
    ap.add_argument("--ttft-ms", type=float, default=10.0, help="the mock backend's time to first token")
    ap.add_argument("--itl-ms", type=float, default=10.0, help="the mock backend's inter-token latency")
    ap.add_argument("--limit", type=int, default=8, help="each tenant's concurrency limit")
    ap.add_argument("--sample-s", type=float, default=5.0, help="seconds between RSS samples")
    ap.add_argument("--warmup-min", type=float, default=5.0, help="minutes left out of the verdict")
    ap.add_argument("--band-mb", type=float, default=5.0, help="the verdict's band: RSS within +-this after warm-up")
    ap.add_argument("--request-timeout-s", type=float, default=120.0, help="a request still open after this "
                    "is counted as not terminal")
    ap.add_argument("--tracemalloc", type=int, default=0, metavar="FRAMES",
                    help="trace the gateway's allocations (frames per traceback); 0: off")
    ap.add_argument("--snap-min", type=float, default=2.0, help="minute of the first tracemalloc snapshot")
    ap.add_argument("--baseline", metavar="REV", default=None,
                    help="run the gateway of this git revision instead of the checkout's (as gateway_bench.py does)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", type=Path, default=None, help="keep logs here (default: a temporary dir)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    a = ap.parse_args()
    duration = a.minutes * 60
    with contextlib.ExitStack() as es:
        workdir = a.workdir or Path(es.enter_context(tempfile.TemporaryDirectory(prefix="gateway-soak-")))
        workdir.mkdir(parents=True, exist_ok=True)
        code = None
        if a.baseline is not None:
            from gateway_bench import baseline_tree  # this folder: the script's own is first on the path

            code = baseline_tree(a.baseline, Path(tempfile.mkdtemp(prefix="baseline-", dir=workdir)))
        stack = es.enter_context(Stack(workdir))
        result = soak(a, stack, workdir, duration, code)
    report(a, result)
    if a.json is not None:
        a.json.write_text(json.dumps(result, indent=1))
    sys.exit(0 if result["promises_kept"] and result["verdict"]["flat"] else 1)


def soak(a: argparse.Namespace, stack: Stack, workdir: Path, duration: float, code: Path | None) -> dict[str, Any]:
    backend = start_backend(stack, 0, a.ttft_ms, a.itl_ms)
    port = int(backend.rsplit(":", 1)[1])
    request_log = workdir / "requests.jsonl"
    request_log.unlink(missing_ok=True)
    driver_dir = workdir / "driver"
    driver_dir.mkdir(exist_ok=True)
    cfg = {
        "admin": {"token_env": "ADMIT_STACK_ADMIN_TOKEN"},
        "request_log": str(request_log),
        "tenants": [{"name": n, "api_keys": [k], "limit": a.limit} for n, k in KEYS.items()],
    }
    import yaml

    cfg_path = workdir / "gateway.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    xargs = ["-X", f"tracemalloc={a.tracemalloc}"] if a.tracemalloc else []
    gw = stack.spawn("gateway", [*xargs, "-c", DRIVER, str(driver_dir), str(code or ""), "--backend", backend,
                                 "--config", str(cfg_path), "--host", "127.0.0.1", "--port", "0"])
    url = stack.wait_listening("gateway")
    poll(lambda: http_ok(url + "/health"), 30, "gateway /health")
    load_log = workdir / "load.log"
    stack.spawn("load", [__file__, "load", "--url", url, "--rate", f"{a.rate:g}", "--duration-s", f"{duration:g}",
                         "--disconnect", f"{a.disconnect:g}", "--tokens", str(a.tokens),
                         "--timeout-s", f"{a.request_timeout_s:g}", "--seed", str(a.seed)])
    t0 = time.monotonic()
    cpu0 = cpu_s(gw.pid)
    kill_at = [duration * (k + 1) / (a.kills + 1) for k in range(a.kills)]
    kills: list[dict[str, float]] = []
    samples: list[dict[str, Any]] = []
    loads: list[str] = [loadavg()]
    snaps: dict[str, Any] = {}
    next_sample = 0.0
    print(f"soak: {a.minutes:g} min at {a.rate:g} req/s, {a.kills} backend kills, load average {loads[0]}; "
          f"logs in {workdir}", flush=True)
    while stack.procs["load"].poll() is None:
        now = time.monotonic() - t0
        if kill_at and now >= kill_at[0]:
            kill_at.pop(0)
            kill_backend(stack)
            t_kill = time.monotonic() - t0
            start_backend(stack, port, a.ttft_ms, a.itl_ms)
            kills.append({"t_s": round(t_kill, 1), "down_s": round(time.monotonic() - t0 - t_kill, 2)})
            print(f"  {t_kill / 60:5.1f} min: backend killed (SIGKILL), back after {kills[-1]['down_s']:.1f} s",
                  flush=True)
        if a.tracemalloc and "first" not in snaps and now >= a.snap_min * 60:
            snaps["first"] = ask(gw.pid, driver_dir, "first", "snapshot")
        if now >= next_sample:
            prog = last_progress(load_log) or {}
            samples.append({"t_s": round(now, 1), "rss_mb": round(rss_mb(gw.pid), 2), "done": prog.get("done", 0),
                            "sent": prog.get("sent", 0), "outcomes": prog.get("outcomes", {})})
            if len(samples) % max(1, round(60 / a.sample_s)) == 0:
                loads.append(loadavg())
                s = samples[-1]
                print(f"  {now / 60:5.1f} min: RSS {s['rss_mb']:.1f} MB, {s['done']} requests done, load "
                      f"{loads[-1]}", flush=True)
            next_sample += a.sample_s
        time.sleep(0.2)
    t_end = time.monotonic() - t0
    cpu_used = cpu_s(gw.pid) - cpu0
    final = last_progress(load_log) or {}
    samples.append({"t_s": round(t_end, 1), "rss_mb": round(rss_mb(gw.pid), 2), "done": final.get("done", 0),
                    "sent": final.get("sent", 0), "outcomes": final.get("outcomes", {})})
    # the promises: in flight back to 0, every request logged once, every request terminal at the client
    token = stack.admin_token

    def drained() -> dict[str, Any] | None:
        st = http_json("GET", url + "/admin/state", token)
        busy = st["requests_in_progress"] or st["in_flight"] or any(t["queue_depth"] for t in st["tenants"].values())
        return None if busy else st

    try:
        state = poll(drained, 30, "in flight back to 0", 0.2)
        in_flight_zero = True
    except StackError:
        state = http_json("GET", url + "/admin/state", token)
        in_flight_zero = False
    if a.tracemalloc:
        snaps["last"] = ask(gw.pid, driver_dir, "last", "snapshot")
    collect = ask(gw.pid, driver_dir, "collect", "collect")
    lines = [json.loads(x) for x in request_log.read_text().splitlines() if x.strip()]
    per_id = Counter(x.get("step_id") for x in lines)
    sent = final.get("sent", 0)
    reached = sent - final.get("unsent", 0)
    ids = [f"soak-{n}" for n in range(sent)]
    logged_once = sum(1 for i in ids if per_id.get(i) == 1)
    logged_twice = sum(1 for i in ids if per_id.get(i, 0) > 1)
    not_logged = sum(1 for i in ids if i not in per_id)
    outcomes = final.get("outcomes", {})
    terminal = final.get("done", 0) - outcomes.get("TIMEOUT", 0)
    promises = {
        "sent": sent, "terminal_at_client": terminal, "not_terminal": sent - terminal,
        "reached_gateway": reached, "logged_once": logged_once, "logged_more_than_once": logged_twice,
        "not_logged": not_logged, "log_outcomes": dict(Counter(x["outcome"] for x in lines)),
        "in_flight_zero": in_flight_zero, "requests_in_progress": state["requests_in_progress"],
        "in_flight": state["in_flight"],
    }
    kept = (terminal == sent and logged_once == reached and logged_twice == 0 and in_flight_zero
            and sent == final.get("done", -1))
    after = [(s["t_s"], s["rss_mb"]) for s in samples if s["t_s"] >= a.warmup_min * 60]
    verdict: dict[str, Any] = {"samples": len(after)}
    if after:
        values = [v for _, v in after]
        verdict.update(max_minus_min_mb=round(max(values) - min(values), 2),
                       max_dev_from_first_mb=round(max(abs(v - values[0]) for v in values), 2),
                       slope_mb_per_min=round(slope_mb_per_min(after), 3), first_mb=values[0], last_mb=values[-1])
        verdict["flat"] = verdict["max_dev_from_first_mb"] <= a.band_mb
    else:
        verdict["flat"] = False
    growth = top_growth(Path(snaps["first"]["snapshot"]), Path(snaps["last"]["snapshot"])) if (
        "first" in snaps and "last" in snaps) else []
    done = final.get("done", 0)
    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "duration_s": round(t_end, 1), "loadavg_per_minute": loads, "max_client_lag_s": final.get("max_lag_s"),
        "kills": kills, "samples": samples, "verdict": verdict, "promises": promises, "promises_kept": kept,
        "gateway_cpu_ms_per_request": round(1000 * cpu_used / done, 3) if done else None,
        "collect": {k: collect.get(k) for k in ("rss", "rss_after", "collected", "traced", "traced_after",
                                                 "gc_count", "gc_frozen", "gc_threshold", "gc_stats", "types",
                                                 "types_after")},
        "tracemalloc": {"first": snaps.get("first", {}).get("traced"), "last": snaps.get("last", {}).get("traced"),
                        "growth": growth} if a.tracemalloc else None,
    }


def http_ok(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def report(a: argparse.Namespace, r: dict[str, Any]) -> None:
    print()
    print(f"{'minute':>6} {'RSS MB':>8} {'done':>8}  outcomes (cumulative)")
    per_min = max(1, round(60 / a.sample_s))
    rows = r["samples"][::per_min]
    if rows[-1] is not r["samples"][-1]:
        rows.append(r["samples"][-1])
    for s in rows:
        outs = ", ".join(f"{k} {v}" for k, v in sorted(s["outcomes"].items(), key=lambda kv: -kv[1]))
        print(f"{s['t_s'] / 60:6.1f} {s['rss_mb']:8.1f} {s['done']:8d}  {outs}")
    v, p = r["verdict"], r["promises"]
    print()
    print(f"load average per minute: {', '.join(r['loadavg_per_minute'])}")
    kills = ", ".join(f"{k['t_s'] / 60:.1f} min (down {k['down_s']:.1f} s)" for k in r["kills"])
    print(f"backend kills: {kills or 'none'}")
    print(f"gateway CPU: {r['gateway_cpu_ms_per_request']} ms/request; client's worst lag behind its schedule: "
          f"{r['max_client_lag_s']} s")
    print(f"promises: {p['terminal_at_client']}/{p['sent']} terminal at the client, {p['logged_once']}/"
          f"{p['reached_gateway']} logged exactly once ({p['logged_more_than_once']} more than once, "
          f"{p['not_logged']} not at all), in flight at the end {p['in_flight']} (requests in progress "
          f"{p['requests_in_progress']}): {'kept' if r['promises_kept'] else 'BROKEN'}")
    print(f"request-log outcomes: {p['log_outcomes']}")
    c = r["collect"]
    print(f"full gc.collect() at the end: {c['collected']} objects, RSS {c['rss'] / 2**20:.1f} -> "
          f"{c['rss_after'] / 2**20:.1f} MB (gc counts {c['gc_count']}, frozen {c['gc_frozen']}, threshold "
          f"{c['gc_threshold']})")
    after_n = dict(c["types_after"] or [])
    print("objects the collector tracks, most numerous types (before -> after the collection): " + ", ".join(
        f"{k} {n} -> {after_n.get(k, '?')}" for k, n in (c["types"] or [])[:12]))
    if r["tracemalloc"]:
        t = r["tracemalloc"]
        print(f"tracemalloc: traced {t['first'] / 2**20:.2f} MB at minute {a.snap_min:g}, {t['last'] / 2**20:.2f} MB "
              f"at the end; grew most:")
        for g in t["growth"]:
            print(f"  {g['size_diff_kb']:+9.1f} KiB {g['count_diff']:+8d} objects  {g['where']}")
            for f in g.get("traceback", [])[1:4]:
                print(f"  {'':>30} <- {f}")
    if v["samples"]:
        print(f"RSS after minute {a.warmup_min:g} ({v['samples']} samples): {v['first_mb']:.1f} -> {v['last_mb']:.1f} "
              f"MB, max - min {v['max_minus_min_mb']:.2f} MB, greatest distance from the first "
              f"{v['max_dev_from_first_mb']:.2f} MB, slope {v['slope_mb_per_min']:+.3f} MB/min: "
              f"{'FLAT' if v['flat'] else 'NOT FLAT'} (band +-{a.band_mb:g} MB)")
    else:
        print(f"no RSS samples after minute {a.warmup_min:g}: no verdict")


if __name__ == "__main__":
    main()
