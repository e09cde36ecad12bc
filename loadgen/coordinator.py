"""``admit loadgen run --agents H:P,H:P``: one stage on several hosts, one report.

1. connect to every agent (loadgen/agent.py) and measure its clock offset NTP-style: ``ROUNDS`` rounds of
   coordinator send ``t0``, agent receive ``t1``, agent answer ``t2``, coordinator receive ``t3`` (all
   ``time.time()``); ``offset = ((t1 - t0) + (t2 - t3)) / 2``, round trip ``(t3 - t0) - (t2 - t1)``; the
   round with the smallest round trip is kept. An offset above ``max_clock_offset_ms`` refuses the stage;
2. draw the stage's schedule once (exactly as on one host) and deal it by striding: agent ``a`` of ``A``
   takes requests ``a, a+A, a+2A, …`` — the union is the single-host schedule, and every request keeps its
   index (its prompt is the one a single host would send);
3. send every agent its share, wait until all their workers are ready, then send one start time, an
   absolute ``time.time()`` ``START_DELAY_S`` ahead; each agent converts it to its own monotonic clock;
4. merge the agents' per-tenant metrics (histograms merge exactly) into one :class:`StageResult` with a
   ``hosts`` section: per host its requests, send-lag p50/p99, clock offset, and whether it was late
   (send-lag p99 above ``lag_bound_ms``: the stage is then invalid and the reasons name the host).
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Callable
from time import monotonic_ns
from typing import Any

from admit.loadgen.agent import encode_msg, job_message, parse_hostport
from admit.loadgen.config import RunConfig
from admit.loadgen.encode import Target
from admit.loadgen.metrics import TenantMetrics
from admit.loadgen.runner import (
    NS,
    READY_TIMEOUT_S,
    StageError,
    StageResult,
    job_settings,
    merge_tenants,
    stage_result,
    templates_for,
)
from admit.loadgen.schedule import build_schedule

ROUNDS = 8
START_DELAY_S = 0.5
CONNECT_TIMEOUT_S = 10.0


class AgentLink:
    """One coordinator-to-agent connection: newline-delimited JSON, reads bounded by a deadline."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        host, port = parse_hostport(addr)
        try:
            self.sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
        except OSError as exc:
            raise StageError(f"agent {addr}: cannot connect: {exc}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.buf = bytearray()

    def send(self, obj: dict[str, Any]) -> None:
        self.sock.setblocking(True)
        try:
            self.sock.sendall(encode_msg(obj))
        except OSError as exc:
            raise StageError(f"agent {self.addr}: connection lost: {exc}") from None
        finally:
            self.sock.setblocking(False)

    def poll(self, timeout: float) -> dict[str, Any] | None:
        """The next message if a whole one arrives within ``timeout`` s, else None."""
        while b"\n" not in self.buf:
            if not select.select([self.sock], [], [], timeout)[0]:
                return None
            try:
                chunk = self.sock.recv(1 << 20)
            except BlockingIOError:
                continue
            except OSError as exc:
                raise StageError(f"agent {self.addr}: connection lost: {exc}") from None
            if not chunk:
                raise StageError(f"agent {self.addr}: closed the connection")
            self.buf += chunk
        line, _, rest = self.buf.partition(b"\n")
        self.buf = bytearray(rest)
        msg = json.loads(line)
        if msg.get("op") == "error":
            raise StageError(f"agent {self.addr}: {msg.get('message')}")
        return msg

    def recv(self, timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            msg = self.poll(max(0.0, min(0.5, deadline - time.monotonic())))
            if msg is not None:
                return msg
            if time.monotonic() >= deadline:
                raise StageError(f"agent {self.addr}: no {what} within {timeout:g} s")

    def close(self) -> None:
        self.sock.close()


def measure_offset(link: AgentLink, rounds: int = ROUNDS) -> tuple[float, float]:
    """(offset, round trip) in seconds of the agent's wall clock against ours; see the module docstring."""
    best: tuple[float, float] | None = None
    for _ in range(rounds):
        t0 = time.time()
        link.send({"op": "clock"})
        reply = link.recv(CONNECT_TIMEOUT_S, "clock reading")
        t3 = time.time()
        t1, t2 = float(reply["t1"]), float(reply["t2"])
        rtt = (t3 - t0) - (t2 - t1)
        offset = ((t1 - t0) + (t2 - t3)) / 2
        if best is None or rtt < best[1]:
            best = (offset, rtt)
    assert best is not None
    return best


def parse_agents(text: str) -> list[str]:
    agents = [a.strip() for a in text.split(",") if a.strip()]
    if not agents:
        raise ValueError("--agents needs HOST:PORT[,HOST:PORT...]")
    for addr in agents:
        parse_hostport(addr)
    if len(set(agents)) != len(agents):
        raise ValueError(f"--agents names a host twice: {text!r}")
    return agents


def run_stage_on_agents(
    cfg: RunConfig,
    model: str,
    agents: list[str],
    max_clock_offset_ms: float = 50.0,
    scale: float = 1.0,
    stage: int = 0,
    on_tick: Callable[[float], None] | None = None,
) -> StageResult:
    """Run one stage split across ``agents`` and merge their measurements; see the module docstring."""
    links: list[AgentLink] = []
    try:
        for addr in agents:
            links.append(AgentLink(addr))
        clocks = [measure_offset(link) for link in links]
        for link, (offset, rtt) in zip(links, clocks, strict=True):
            if abs(offset) * 1000 > max_clock_offset_ms:
                raise StageError(
                    f"agent {link.addr}: clock offset {offset * 1000:+.1f} ms (round trip {rtt * 1000:.1f} ms) "
                    f"exceeds --max-clock-offset-ms {max_clock_offset_ms:g}; synchronise its clock (NTP/chrony)"
                )
        schedule = build_schedule(cfg, scale, stage)
        target = Target.from_url(cfg.url, cfg.api)
        templates = templates_for(cfg, model)
        settings = job_settings(cfg, stage)
        n = len(links)
        shares = [schedule.share(a, n) for a in range(n)]
        for a, link in enumerate(links):
            link.send(job_message(target, templates, settings, shares[a], a, n, cfg.workers, cfg.duration))
        for link in links:
            link.recv(READY_TIMEOUT_S + 30.0, "ready message")
        start_at = time.time() + START_DELAY_S
        t0 = monotonic_ns() + int((start_at - time.time()) * NS)
        for link in links:
            link.send({"op": "start", "at": start_at})
        wait_s = START_DELAY_S + cfg.duration + cfg.timeout * (cfg.max_retries + 1) + 60.0
        deadline = time.monotonic() + wait_s
        replies: list[dict[str, Any] | None] = [None] * n
        while any(r is None for r in replies):
            for a, link in enumerate(links):
                if replies[a] is None:
                    replies[a] = link.poll(0.05)
            if on_tick is not None:
                on_tick(min(1.0, max(0.0, (monotonic_ns() - t0) / NS / cfg.duration)))
            if time.monotonic() > deadline:
                late = ", ".join(link.addr for link, r in zip(links, replies, strict=True) if r is None)
                raise StageError(f"agents {late} did not report within {wait_s:.0f} s")
    finally:
        for link in links:
            link.close()
    results: list[dict[str, Any]] = [r for r in replies if r is not None]
    names = [t.name for t in cfg.tenants]
    merged = merge_tenants(names, [r["tenants"] for r in results])
    hosts = []
    for link, share, (offset, rtt), r in zip(links, shares, clocks, results, strict=True):
        total = TenantMetrics()
        for data in r["tenants"]:
            total.merge(TenantMetrics.from_dict(data))
        lag = total.hist["send_lag"]
        p50, p99 = lag.percentile(50) / 1e6, lag.percentile(99) / 1e6
        hosts.append({
            "host": link.addr,
            "scheduled": len(share),
            "sent": total.sent,
            "send_lag_p50_ms": None if lag.count == 0 else round(p50, 4),
            "send_lag_p99_ms": None if lag.count == 0 else round(p99, 4),
            "late": lag.count > 0 and p99 > cfg.lag_bound_ms,
            "clock_offset_ms": round(offset * 1000, 4),
            "clock_rtt_ms": round(rtt * 1000, 4),
            "start_lead_ms": round(float(r["clock"]["start_lead_ms"]), 4),
            "workers": int(r["workers"]),
            "tenants": {name: TenantMetrics.from_dict(d).sent for name, d in zip(names, r["tenants"], strict=True)},
            "histograms_ns": {"send_lag": lag.to_dict()},
        })
    return stage_result(
        cfg, stage, scale, schedule, merged,
        t0=t0,
        last_send=t0 + max(int(r["last_send"]) for r in results) if any(r["last_send"] for r in results) else 0,
        end=t0 + max(int(r["end"]) for r in results),
        workers=sum(int(r["workers"]) for r in results),
        cpu_s=sum(float(r["cpu_s"]) for r in results),
        connections_opened=sum(int(r["connections_opened"]) for r in results),
        max_in_flight=sum(int(r["max_in_flight"]) for r in results),
        started_unix=start_at,
        hosts=hosts,
    )
