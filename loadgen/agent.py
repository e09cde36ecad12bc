"""``admit loadgen agent``: run a coordinator's share of a stage on this host.

Protocol: one TCP connection per stage, newline-delimited JSON messages (no pickle: an agent never
executes what the network sends it, it only reads numbers and strings).

* ``{"op": "clock"}`` → ``{"t1": .., "t2": ..}``: the agent's ``time.time()`` when the request arrived and
  when the answer left (the coordinator's NTP-style offset check, loadgen/coordinator.py);
* ``{"op": "job", ...}`` (target, tenant templates, the shared WorkerJob settings, this host's strided
  share of the schedule, ``host``/``hosts``/``workers``) → the agent spawns its worker processes (the same
  :class:`~admit.loadgen.runner.WorkerGroup` as a local stage), waits until they are ready → ``{"op": "ready"}``;
* ``{"op": "start", "at": EPOCH}``: the start as an absolute ``time.time()``; at receipt the agent turns it
  into its own monotonic clock (``t0 = monotonic_ns() + (at - time.time())``) and starts its workers at
  ``t0``; when they are done → ``{"op": "result", "tenants": [...], ...}``: per tenant the merged
  :class:`TenantMetrics` of its workers (histograms serialised exactly), ``last_send``/``end`` in ns after
  ``t0``, worker counters and its clock readings;
* any failure → ``{"op": "error", "message": ..}``.

One stage at a time: a second job while one runs is answered ``busy``.

Test-only knobs (they make a healthy host look broken, for tests of the checks): ``clock_skew_ms`` adds to
every wall-clock reading of the agent; ``delay_start_ms`` hands the start to the workers that much after
the agreed ``t0`` (the sends are due at ``t0`` still, so they are late: a late host).
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import socketserver
import threading
import time
from dataclasses import asdict
from time import monotonic_ns
from typing import Any

import numpy as np
from admit.loadgen.encode import Target, TenantTemplate
from admit.loadgen.schedule import Schedule

NS = 1_000_000_000
MAX_LINE = 1 << 30


# -- wire helpers (shared with the coordinator) ---------------------------------------------------------
def encode_msg(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def _array(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype="<i8").tobytes()).decode()


def _unarray(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<i8").astype(np.int64)


def schedule_to_wire(s: Schedule) -> dict[str, Any]:
    return {
        "offset_ns": _array(s.offset_ns),
        "tenant": _array(s.tenant),
        "prompt_tokens": _array(s.prompt_tokens),
        "output_tokens": _array(s.output_tokens),
        "duration_s": s.duration_s,
    }


def schedule_from_wire(d: dict[str, Any]) -> Schedule:
    return Schedule(
        _unarray(d["offset_ns"]),
        _unarray(d["tenant"]).astype(np.int32),
        _unarray(d["prompt_tokens"]),
        _unarray(d["output_tokens"]),
        float(d["duration_s"]),
    )


def job_message(target: Target, templates: list[TenantTemplate], settings: dict, share: Schedule,
                host: int, hosts: int, workers: int, duration_s: float) -> dict[str, Any]:
    return {
        "op": "job",
        "target": asdict(target),
        "templates": [asdict(t) for t in templates],
        "settings": settings,
        "schedule": schedule_to_wire(share),
        "host": host,
        "hosts": hosts,
        "workers": workers,
        "duration_s": duration_s,
    }


# -- the server -----------------------------------------------------------------------------------------
class Agent:
    """State of one agent process: the one-stage-at-a-time lock and the test-only knobs."""

    def __init__(self, clock_skew_ms: float = 0.0, delay_start_ms: float = 0.0) -> None:
        self.clock_skew_s = clock_skew_ms / 1000.0
        self.delay_start_ns = int(delay_start_ms * 1e6)
        self.busy = threading.Lock()

    def now(self) -> float:
        return time.time() + self.clock_skew_s

    def run_job(self, msg: dict[str, Any], recv, send) -> None:
        from admit.loadgen.runner import WorkerGroup, merge_tenants

        target = Target(**msg["target"])
        templates = [TenantTemplate(**t) for t in msg["templates"]]
        settings = dict(msg["settings"])
        schedule = schedule_from_wire(msg["schedule"])
        group = WorkerGroup(target, templates, schedule, int(msg["workers"]), settings, float(msg["duration_s"]),
                            host=int(msg["host"]), hosts=int(msg["hosts"]))
        try:
            group.wait_ready()
            send({"op": "ready", "workers": group.n_workers})
            start = recv()
            if start is None or start.get("op") != "start":
                return
            received_unix, received_mono = self.now(), monotonic_ns()
            lead_s = float(start["at"]) - received_unix
            t0 = received_mono + int(lead_s * NS)
            if self.delay_start_ns:  # test-only: start the workers late, the sends stay due at t0
                time.sleep(max(0.0, (t0 + self.delay_start_ns - monotonic_ns()) / NS))
            group.start(t0)
            results = group.collect(t0)
        finally:
            group.close()
        merged = merge_tenants([t.name for t in templates], [r.tenants for r in results])
        send({
            "op": "result",
            "tenants": [m.to_dict() for m in merged.values()],
            "last_send": max((r.last_send - t0 for r in results if r.last_send), default=0),
            "end": max((r.end - t0 for r in results), default=0),
            "workers": group.n_workers,
            "cpu_s": sum(r.cpu_s for r in results),
            "connections_opened": sum(r.connections_opened for r in results),
            "max_in_flight": sum(r.max_in_flight for r in results),
            "clock": {"start_at_unix": float(start["at"]), "start_received_unix": received_unix,
                      "start_lead_ms": lead_s * 1000.0},
        })


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        agent = self.server.agent
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def recv() -> dict[str, Any] | None:
            line = self.rfile.readline(MAX_LINE)
            return json.loads(line) if line else None

        def send(obj: dict[str, Any]) -> None:
            self.wfile.write(encode_msg(obj))
            self.wfile.flush()

        while True:
            try:
                msg = recv()
            except (OSError, ValueError):
                return
            if msg is None:
                return
            op = msg.get("op")
            if op == "clock":
                t1 = agent.now()
                send({"t1": t1, "t2": agent.now()})
            elif op == "job":
                if not agent.busy.acquire(blocking=False):
                    send({"op": "error", "message": "busy: this agent is running another stage"})
                    continue
                try:
                    agent.run_job(msg, recv, send)
                except Exception as exc:  # the coordinator reports it, naming this host
                    with contextlib.suppress(OSError):
                        send({"op": "error", "message": f"{type(exc).__name__}: {exc}"})
                finally:
                    agent.busy.release()
            else:
                send({"op": "error", "message": f"unknown op {op!r}"})


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, addr: tuple[str, int], agent: Agent) -> None:
        super().__init__(addr, _Handler)
        self.agent = agent


def parse_hostport(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def serve(listen: str, clock_skew_ms: float = 0.0, delay_start_ms: float = 0.0) -> None:
    """Serve until interrupted; prints ``listening on HOST:PORT`` once it accepts connections."""
    host, port = parse_hostport(listen)
    with _Server((host, port), Agent(clock_skew_ms, delay_start_ms)) as srv:
        h, p = str(srv.server_address[0]), srv.server_address[1]
        print(f"listening on {h}:{p}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            srv.serve_forever()
