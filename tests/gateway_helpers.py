"""Real servers on loopback for the gateway tests: the mock backend (counting in flight) and the gateway.

* `CountingMock` runs the project's mock OpenAI server (admit.loadgen.mockserver) in a thread of this
  process; its connections count how many streamed requests are being answered at once, so a test can
  check a limit where it matters, at the backend.
* `MockProcess` runs the same mock server as a child process that a test can kill and restart.
* `GatewayProcess` runs ``python -m admit.gateway --port 0`` on a config written for the test and waits
  until ``/health`` answers (polling with a deadline, never a fixed sleep). With ``wait=False`` it only
  starts the process, so that a test can start several and then wait for each (`ready`): they start side
  by side, which on a loaded machine is many seconds each.

The start-up deadlines are generous (a minute): they only bound a process that never starts, and a loaded
2-core machine can take tens of seconds to import and start one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from admit.live.stack import StackError, poll
from admit.loadgen.mockserver import ServerProtocol, Stats
from proc_helpers import read_listening

ADMIN_TOKEN = "test-admin-token-0123456789"
# An admin call's bound, which only catches a gateway that hangs. CI once left the gateway beside real vLLM
# unanswered for over 30 s while its process was runnable and had used about 1 s of CPU in 138 s (and its SIGUSR1
# dump did not come within 5 s more): vLLM ran in a session of its own, which Linux's autogroup scheduler weighs
# as much as the whole test session (scripts/server_common.sh no longer does that). `stacks` says how long the
# gateway ran and waited for a CPU.
ADMIN_TIMEOUT_S = 120.0


def wait_for(pred: Callable[[], Any], timeout: float = 10.0, what: str = "condition", every: float = 0.01) -> Any:
    """gateway.stack.poll, failing the test (AssertionError) instead of raising StackError."""
    try:
        return poll(pred, timeout, what, every)
    except StackError as e:
        raise AssertionError(str(e)) from None


class InFlight:
    """Streamed requests being answered by the mock right now, and the most ever at once."""

    def __init__(self) -> None:
        self.now = 0
        self.max = 0
        self.started = 0
        self.lost = 0  # connections closed by the client while a stream was running (upstream cancelled)

    def reset_max(self) -> None:
        self.max = self.now


def _counting_protocol(counter: InFlight, live: set[ServerProtocol]) -> type[ServerProtocol]:
    class Counting(ServerProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            live.add(self)
            super().connection_made(transport)

        @property  # type: ignore[override]
        def busy(self) -> bool:
            return getattr(self, "_busy", False)

        @busy.setter
        def busy(self, value: bool) -> None:
            old = getattr(self, "_busy", False)
            self._busy = value
            if value and not old:
                counter.now += 1
                counter.started += 1
                counter.max = max(counter.max, counter.now)
            elif old and not value:
                counter.now -= 1

        def connection_lost(self, exc: Exception | None) -> None:
            live.discard(self)
            if self.busy:
                counter.lost += 1
                self.busy = False
            super().connection_lost(exc)

    return Counting


class CountingMock:
    """The mock server in a background thread; ``url`` once started."""

    def __init__(self, ttft_ms: float = 0.0, itl_ms: float = 10.0) -> None:
        self.counter = InFlight()
        self.stats = Stats()
        self._ttft = ttft_ms / 1000
        self._itl = itl_ms / 1000
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self.url = ""
        self.port = 0
        self._live: set[ServerProtocol] = set()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("mock server did not start")

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._proto = _counting_protocol(self.counter, self._live)

        async def main() -> None:
            await self._listen()
            host, self.port = self._server.sockets[0].getsockname()[:2]  # type: ignore[union-attr]
            self.url = f"http://{host}:{self.port}"
            self._ready.set()
            await asyncio.Event().wait()

        try:
            loop.run_until_complete(main())
        except asyncio.CancelledError:
            pass
        finally:
            loop.close()

    async def _listen(self) -> None:
        assert self._loop is not None
        self._server = await self._loop.create_server(
            lambda: self._proto(self._ttft, self._itl, 1.0, self.stats), "127.0.0.1", self.port
        )

    def _call(self, fn: Callable[[], Any]) -> None:
        assert self._loop is not None
        done = threading.Event()

        def run() -> None:
            try:
                fn()
            finally:
                done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(5)

    def crash(self) -> None:
        """Like a killed process: stop listening and reset every open connection."""

        def go() -> None:
            assert self._server is not None
            self._server.close()
            for p in list(self._live):
                if p.transport is not None:
                    p.transport.abort()

        self._call(go)

    def restart(self) -> None:
        """Listen again on the same port."""
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(5)

    def stop(self) -> None:
        if self._loop is not None and self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
            for task in asyncio.all_tasks(self._loop):
                self._loop.call_soon_threadsafe(task.cancel)
        self._thread.join(5)


def http(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None,
         timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json",
                                                                         **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()


class MockProcess:
    """The mock server as a child process (``python -m admit.loadgen.mockserver``) that can be killed."""

    def __init__(self, port: int = 0, ttft_ms: float = 0.0, itl_ms: float = 10.0) -> None:
        self.args = ["--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms)]
        self.proc = self._start(port)

    def _start(self, port: int) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "admit.loadgen.mockserver", "--port", str(port), *self.args],
            stdout=subprocess.PIPE, text=True,
        )
        self.url = read_listening(proc, 60, "mock server")
        self.port = int(self.url.rsplit(":", 1)[1])
        return proc

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def restart(self) -> None:
        self.proc = self._start(self.port)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.kill()


class GatewayProcess:
    def __init__(self, tmp: Path, backend: str, config: dict[str, Any], wait: bool = True,
                 max_open_files: int | None = None, args: Sequence[str] = ()) -> None:
        cfg = {"admin": {"token_env": "ADMIT_TEST_ADMIN_TOKEN"}, "request_log": str(tmp / "requests.jsonl"),
               "audit_log": str(tmp / "audit.jsonl"), **config}
        self.request_log_path = Path(cfg["request_log"])
        self.audit_log_path = Path(cfg["audit_log"])
        path = tmp / "tenants.yaml"
        path.write_text(yaml.safe_dump(cfg))
        env = {**os.environ, "ADMIT_TEST_ADMIN_TOKEN": ADMIN_TOKEN}
        self.stderr_path = tmp / "gateway.stderr"
        self._stderr = self.stderr_path.open("w")
        def limit_files() -> None:  # in the child, before exec: soft and hard, so the gateway cannot raise it
            resource.setrlimit(resource.RLIMIT_NOFILE, (max_open_files, max_open_files))

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "admit.gateway", "--backend", backend, "--config", str(path), "--port", "0",
             *args],
            stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=env,
            preexec_fn=limit_files if max_open_files is not None else None,
        )
        self.url = ""
        if wait:
            self.ready()

    def ready(self) -> GatewayProcess:
        """Wait until the gateway listens and ``/health`` answers."""
        if not self.url:
            self.url = read_listening(self.proc, 60, "gateway")
        wait_for(lambda: self._healthy(), 30, "gateway /health")
        return self

    def _healthy(self) -> bool:
        try:
            return http("GET", self.url + "/health", timeout=2)[0] == 200
        except OSError:
            return False

    def admin(self, method: str, path: str, body: Any = None, token: str = ADMIN_TOKEN,
              actor: str | None = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"}
        if actor:
            headers["x-admit-actor"] = actor
        asked = schedstat(self.proc.pid)
        try:  # the bound only catches a hang: a loaded 2-core machine can take seconds to answer
            status, _, data = http(method, self.url + path, body, headers, timeout=ADMIN_TIMEOUT_S)
        except TimeoutError:
            waited = sched_verdict(asked, schedstat(self.proc.pid))
            raise AssertionError(f"the gateway did not answer {method} {path} within {ADMIN_TIMEOUT_S:g} s; "
                                 f"{self.stacks()}\nits main thread from the call to its timeout: {waited}") from None
        return status, json.loads(data) if data else None

    def stacks(self) -> str:
        """What the gateway is doing now, for a failure message: the kernel's view, its threads' stacks (SIGUSR1,
        gateway/cli.py; py-spy's reading of its memory when no dump comes), stderr's tail, and last — where a
        truncated report still shows it — whether its main thread ran, waited for a CPU or slept meanwhile."""
        if self.proc.poll() is not None:
            return f"it exited with status {self.proc.returncode}; its stderr ends:\n{self.stderr()[-4000:]}"
        pid = self.proc.pid
        kernel = kernel_view(pid)  # before the signal: how the process stood when it did not answer
        sched_before = schedstat(pid)
        before = len(self.stderr())
        self.proc.send_signal(signal.SIGUSR1)
        dumped = True
        try:
            poll(lambda: "most recent call first" in self.stderr()[before:], 5, "the gateway's stacks")
        except StackError:
            dumped = False
        spy = "" if dumped else py_spy_dump(pid)
        sched_after = schedstat(pid)
        tail = self.stderr()[-4000:]
        verdict = sched_verdict(sched_before, sched_after)
        return (f"{kernel}\nits stderr's tail (a SIGUSR1 dump {'came' if dumped else 'did NOT come'} within 5 s):\n"
                f"{tail}\n{spy}\nthe main thread while this was read: {verdict}; {main_thread_line(pid)}")

    def state(self) -> dict[str, Any]:
        status, body = self.admin("GET", "/admin/state")
        assert status == 200, body
        return body

    def metrics(self, token: str | None = None) -> str:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        return http("GET", self.url + "/metrics", headers=headers)[2].decode()

    def rss_bytes(self) -> int:
        """The gateway process's resident memory now (Linux /proc)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS in /proc status")

    def request_log(self) -> list[dict[str, Any]]:
        if not self.request_log_path.exists():
            return []
        # only complete lines: the gateway may be writing the last one while we read
        return [json.loads(x) for x in self.request_log_path.read_text().split("\n")[:-1] if x.strip()]

    def audit_log(self) -> list[dict[str, Any]]:
        if not self.audit_log_path.exists():
            return []
        # only complete lines, as for the request log
        return [json.loads(x) for x in self.audit_log_path.read_text().split("\n")[:-1] if x.strip()]

    def stderr(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()


def kernel_view(pid: int) -> str:
    """What the kernel says of a process that stopped answering, for a failure message: each thread's state and
    where in the kernel it waits (a thread in D waits on I/O, where even its stack dump cannot be written), and
    the machine's load, pressure and memory, and its busiest processes. Best effort: what cannot be read is
    said so."""
    def read(path: str) -> str:
        try:
            return Path(path).read_text().strip()
        except OSError as e:
            return f"({path}: {e.strerror})"

    lines = [f"the kernel's view of process {pid}:"]
    with contextlib.suppress(OSError):
        for task in sorted(Path(f"/proc/{pid}/task").iterdir()):
            stat = read(f"{task}/stat")
            state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
            lines.append(f"  thread {task.name} ({read(f'{task}/comm')}): state {state}, waits in "
                         f"{read(f'{task}/wchan') or '-'}")
    lines.append(f"loadavg {read('/proc/loadavg')}")
    for kind in ("cpu", "io", "memory"):
        lines.append(f"pressure {kind}: {read(f'/proc/pressure/{kind}').splitlines()[0]}")
    mem = dict(x.split(":", 1) for x in read("/proc/meminfo").splitlines() if ":" in x)
    lines.append("meminfo " + ", ".join(f"{k} {mem[k].strip()}" for k in ("MemAvailable", "Dirty", "Writeback")
                                        if k in mem))
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        ps = subprocess.run(["ps", "-eo", "pid,stat,pcpu,rss,etime,args", "--sort=-pcpu"], capture_output=True,
                            text=True, timeout=10).stdout.splitlines()
        lines += ["busiest processes:", *(f"  {x[:160]}" for x in ps[:10])]
    return "\n".join(lines)


def schedstat(pid: int) -> tuple[int, int, float] | None:
    """The main thread's ``/proc/PID/schedstat``: ns on a CPU, ns runnable but waiting for one, and when read."""
    try:
        run, wait, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    except (OSError, ValueError):
        return None
    return int(run), int(wait), time.monotonic()


def sched_verdict(a: tuple[int, int, float] | None, b: tuple[int, int, float] | None) -> str:
    """Between two `schedstat` readings: how long the main thread ran and waited in a run queue."""
    if a is None or b is None:
        return "(no schedstat)"
    ran, waited, span = (b[0] - a[0]) / 1e9, (b[1] - a[1]) / 1e9, b[2] - a[2]
    slept = " (the rest: it slept or was stopped)" if ran + waited < 0.5 * span else ""
    return f"ran {ran:.3f} s and waited for a CPU {waited:.3f} s of {span:.1f} s{slept}"


def main_thread_line(pid: int) -> str:
    """The main thread's state, kernel wait channel and (as root) kernel stack, on one line."""
    def read(path: str) -> str:
        try:
            return Path(path).read_text().strip()
        except OSError as e:
            return f"({e.strerror})"

    stat = read(f"/proc/{pid}/stat")
    state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
    stack = " <- ".join(x.split()[-1] for x in read(f"/proc/{pid}/stack").splitlines()[:8])
    return f"state {state}, waits in {read(f'/proc/{pid}/wchan') or '-'}, kernel stack: {stack or '-'}"


def py_spy_dump(pid: int) -> str:
    """py-spy's dump of every thread (Python and native frames), read from the process's memory: it works where
    the process does not run its signal handler. Best effort."""
    exe = Path(sys.executable).parent / "py-spy"
    if not exe.exists():
        return "(py-spy is not installed)"
    try:
        out = subprocess.run([str(exe), "dump", "--pid", str(pid), "--native"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return f"(py-spy dump failed: {e})"
    return f"py-spy dump:\n{(out.stdout + out.stderr)[-5000:]}"


def tenant_cfg(name: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "api_keys": [f"sk-{name}-secret-key"], **kw}


def key(name: str) -> str:
    return f"sk-{name}-secret-key"


class Watch:
    """A thread of this process that samples, every ``every`` s while a test waits on a server: the machine's
    CPU time (/proc/stat: idle, iowait, steal), its major page faults and pressure stall totals, and one
    process's main thread (`schedstat`). `report` says, for a failure message, whether a stall was the
    machine's (this thread woke late too: the VM paused or lost its CPUs) or the process's own (it waited for a
    CPU, or slept), and in which second it was worst. Best effort: what cannot be read is left out."""

    def __init__(self, pid: int, every: float = 0.25) -> None:
        self.pid, self.every = pid, every
        self.samples: list[tuple[float, list[int], int, dict[str, int], tuple[int, int, float] | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watch", daemon=True)

    def __enter__(self) -> Watch:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def _sample(self) -> None:
        cpu, faults, stalls = [], 0, {}
        with contextlib.suppress(OSError, ValueError, IndexError):
            cpu = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        with contextlib.suppress(OSError, ValueError):
            for line in Path("/proc/vmstat").read_text().splitlines():
                if line.startswith("pgmajfault "):
                    faults = int(line.split()[1])
        for kind in ("cpu", "memory", "io"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                some = Path(f"/proc/pressure/{kind}").read_text().split("\n", 1)[0]
                stalls[kind] = int(some.rsplit("total=", 1)[1])
        self.samples.append((time.monotonic(), cpu, faults, stalls, schedstat(self.pid)))

    def report(self) -> str:
        s = list(self.samples)
        if len(s) < 2:
            return "the watch took fewer than two samples"
        span = s[-1][0] - s[0][0]
        gaps = [(b[0] - a[0], a[0] - s[0][0]) for a, b in itertools.pairwise(s)]
        gap, at = max(gaps)
        hz = os.sysconf("SC_CLK_TCK")
        lines = [f"the watch over {span:.1f} s ({len(s)} samples, one every {self.every:g} s): its own longest wait "
                 f"between samples {gap:.2f} s, from {at:.1f} s on"
                 + (" (this process stalled too: the machine, not only the server)" if gap > 10 * self.every else "")]
        if s[0][1] and s[-1][1]:
            d = [(b - a) / hz for a, b in zip(s[0][1], s[-1][1], strict=False)]
            lines.append(f"CPU seconds, all cores: user {d[0]:.1f}, system {d[2]:.1f}, idle {d[3]:.1f}, "
                         f"iowait {d[4]:.1f}, steal {d[7]:.1f}")
        lines.append(f"major page faults {s[-1][2] - s[0][2]}; pressure stall (some) seconds: " + ", ".join(
            f"{k} {(s[-1][3][k] - s[0][3].get(k, s[-1][3][k])) / 1e6:.1f}" for k in s[-1][3]))
        runs = [(x[0], x[4]) for x in s if x[4] is not None]
        if len(runs) >= 2:
            first, last = runs[0][1], runs[-1][1]
            assert first is not None and last is not None
            lines.append(f"process {self.pid}'s main thread: {sched_verdict(first, last)}")
            # its worst second: the least it ran over any window of about a second
            worst: tuple[float, float, float, float] | None = None
            j = 0
            for i in range(len(runs)):
                while j < len(runs) and runs[j][0] - runs[i][0] < 1.0:
                    j += 1
                if j >= len(runs):
                    break
                a, b = runs[i][1], runs[j][1]
                assert a is not None and b is not None
                ran, waited, w = (b[0] - a[0]) / 1e9, (b[1] - a[1]) / 1e9, b[2] - a[2]
                if worst is None or ran / w < worst[0] / worst[2]:
                    worst = (ran, waited, w, runs[i][0] - s[0][0])
            if worst is not None:
                lines.append(f"its worst window: from {worst[3]:.1f} s, {worst[2]:.1f} s long, it ran {worst[0]:.3f} s "
                             f"and waited for a CPU {worst[1]:.3f} s")
        return "\n".join(lines)


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """A /metrics page's samples of metric ``name``, by their sorted labels (a label set never counted is absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {tuple(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name}
