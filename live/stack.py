"""The live stack as child processes on loopback: emulator, gateway, control loop and load generator.

`Stack` starts each part as ``python -m ...`` in its own process group, with its output in a log file of
a working directory, waits for it by polling (the ``listening on HOST:PORT`` line, ``/health``, a file)
under a deadline, and on exit — normal, an exception, Ctrl-C or SIGTERM — stops every group it started
(SIGTERM, then SIGKILL after a grace period). Used by ``admit demo`` and ``admit sim2live``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import yaml
from admit.core import metrics_page

ADMIN_ENV = "ADMIT_STACK_ADMIN_TOKEN"


class StackError(RuntimeError):
    """A part did not start, or ended badly."""


@contextlib.contextmanager
def cli_exit() -> Iterator[None]:
    """Around a command that runs a Stack: a start or run that fails is one red line and exit status 1,
    Ctrl-C is exit status 130 (the Stack has stopped every process it started by then)."""
    import typer

    try:
        yield
    except RuntimeError as exc:  # StackError included
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        typer.secho("interrupted; every process was stopped", fg=typer.colors.YELLOW, err=True)
        raise typer.Exit(130) from None


def poll(pred: Callable[[], Any], timeout: float, what: str, every: float = 0.05) -> Any:
    """``pred()`` until it is truthy; StackError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise StackError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


def wait_idle(base_url: str, timeout_s: float = 300.0) -> None:
    """Until the vLLM-compatible server at ``base_url`` has no request running or waiting (a previous load's
    stragglers, or someone else's traffic), read from its metrics page; StackError after ``timeout_s``."""
    def idle() -> bool:
        with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=10) as r:
            return metrics_page.in_engine(r.read().decode()) == 0

    poll(idle, timeout_s, f"the server at {base_url} to be idle", every=0.5)


def http_json(method: str, url: str, token: str | None = None, body: Any = None, timeout: float = 5) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"null")


class Stack:
    """Child processes of one live run; a context manager that always stops them all."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.admin_token = secrets.token_hex(24)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._old_term: Any = None
        self._spawning = False  # a SIGTERM now waits until the child being started is recorded
        self._term_pending = False

    # ------------------------------------------------------------------ lifetime
    def __enter__(self) -> Stack:
        self._old_term = signal.signal(signal.SIGTERM, self._on_term)
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop_all()
        signal.signal(signal.SIGTERM, self._old_term)

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        if self._spawning:  # raised once spawn() has recorded the child, or __exit__ could not stop it
            self._term_pending = True
            return
        raise KeyboardInterrupt  # unwinds to __exit__, which stops the children

    def log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def spawn(self, name: str, args: Sequence[str], env: dict[str, str] | None = None,
              program: str | None = None) -> subprocess.Popen[bytes]:
        """``python ARGS`` (or ``program ARGS``) in a new process group, stdout and stderr to ``<name>.log``. The
        group lets `stop` end the part's workers with it; it stays in this session, so that Linux's autogroup
        scheduler weighs it with the command that started the stack (a new session would give each part a
        whole session's CPU share, whatever the caller's priority)."""
        if name in self.procs and self.procs[name].poll() is None:
            raise StackError(f"{name} is already running")
        self._spawning = True
        try:
            with self.log(name).open("wb") as fh:
                proc = subprocess.Popen(
                    [program or sys.executable, *args], stdout=fh, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, env={**os.environ, ADMIN_ENV: self.admin_token, **(env or {})},
                    process_group=0,  # not a new session: see spawn's docstring
                )
            self.procs[name] = proc
            with (self.workdir / "pids.txt").open("a") as fh:  # for whoever checks that nothing was left behind
                fh.write(f"{name} {proc.pid}\n")
        finally:
            self._spawning = False
        if self._term_pending:
            self._term_pending = False
            raise KeyboardInterrupt  # the SIGTERM that came while the child started
        return proc

    def stop(self, name: str, grace_s: float = 10.0) -> int | None:
        """SIGTERM the part's process group, SIGKILL it after ``grace_s``; returns its exit status."""
        proc = self.procs.pop(name, None)
        if proc is None:
            return None
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):  # workers the part left behind in its group
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.returncode

    def stop_all(self) -> None:
        for name in reversed(list(self.procs)):  # load and loop before the servers they talk to
            self.stop(name)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values()]

    # ------------------------------------------------------------------ waiting
    def _alive(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            tail = self.log(name).read_text(errors="replace")[-2000:]
            raise StackError(f"{name} exited with status {proc.returncode}:\n{tail}")

    def wait_line(self, name: str, prefix: str, timeout: float) -> str:
        """The first line of the part's log that starts with ``prefix``."""

        def find() -> str | None:
            for line in self.log(name).read_text(errors="replace").splitlines():
                if line.startswith(prefix):
                    return line
            self._alive(name)
            return None

        return poll(find, timeout, f"{name} to print {prefix!r}")

    def wait_listening(self, name: str, timeout: float = 60) -> str:
        return "http://" + self.wait_line(name, "listening on ", timeout).split()[-1]

    def wait_exit(self, name: str, timeout: float) -> int:
        proc = self.procs[name]
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise StackError(f"{name} still running after {timeout:g} s") from None

    # ------------------------------------------------------------------ the parts
    def emulator(self, *args: str) -> str:
        self.spawn("emulator", ["-m", "admit.emulator", "--host", "127.0.0.1", "--port", "0", *args])
        url = self.wait_listening("emulator")
        poll(lambda: _healthy(url), 30, "emulator /health")
        return url

    def gateway(self, backend: str, config: dict[str, Any], name: str = "gateway") -> str:
        cfg = {"admin": {"token_env": ADMIN_ENV}, **config}
        path = self.workdir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.spawn(name, ["-m", "admit.gateway", "--backend", backend, "--config", str(path),
                          "--host", "127.0.0.1", "--port", "0"])
        url = self.wait_listening(name)
        poll(lambda: _healthy(url), 30, f"{name} /health")
        return url

    def control(self, gateway: str, policy: str, interval_s: float, log: Path, scenario: str | None = None,
                name: str = "control", timeout: float = 120, start_on_traffic: bool = False,
                calibration: Path | None = None) -> None:
        """``admit control``; returns once the policy is loaded and the loop runs.

        ``start_on_traffic``: the loop decides once at once, then every interval from the first request's
        arrival at the gateway (``--start-on-traffic``), so its decisions sit where the simulator's do.
        """
        args = ["-m", "admit.cli", "control", "--gateway", gateway, "--admin-token-env", ADMIN_ENV,
                "--policy", policy, "--interval", f"{interval_s:g}s", "--log", str(log)]
        if scenario is not None:
            args += ["--scenario", scenario]
        if start_on_traffic:
            args.append("--start-on-traffic")
        if calibration is not None:
            args += ["--calibration", str(calibration)]
        self.spawn(name, args)
        self.wait_line(name, "controlling ", timeout)

    def admin(self, gateway: str, path: str, body: Any = None, method: str = "GET", timeout: float = 5) -> Any:
        return http_json(method, gateway + path, self.admin_token, body, timeout)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def alive(pid: int) -> bool:
    """Whether a process with this id still exists (and is not a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (OSError, IndexError):
        return True
