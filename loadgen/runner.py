"""The parent side of a stage: draw the schedule, start the workers together, merge what they measured.

Achieved rate and the self-check. With ``S`` requests scheduled over a stage of ``D`` seconds, ``A``
actually sent, the first stage clock reading ``t0`` and the last actual send ``t_last``:

* ``requested_rate = S / D`` (the schedule's own rate; the configured rate is reported beside it);
* ``achieved_rate = A / max(D, t_last - t0)`` — sending late stretches the denominator;
* the stage is **valid** when ``achieved_rate ≥ min_achieved · requested_rate`` and the send-lag p99
  ``≤ lag_bound_ms``; otherwise the report says which check failed, because then the latencies describe
  the generator as much as the server.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection as Pipe
from time import monotonic_ns
from typing import Any

from admit.loadgen.config import ConfigError, RunConfig
from admit.loadgen.encode import Target, TenantTemplate, tenant_headers
from admit.loadgen.metrics import TenantMetrics, request_limits_ns, slo_limits_ns
from admit.loadgen.schedule import Schedule, build_schedule
from admit.loadgen.worker import NS, WorkerJob, WorkerResult

READY_TIMEOUT_S = 60.0
START_DELAY_S = 0.2


class StageError(RuntimeError):
    """A stage could not run at all (a worker failed to start or crashed)."""


@dataclass
class StageResult:
    stage: int
    target_rate: float
    duration_s: float
    scheduled: int
    sent: int
    tenants: dict[str, TenantMetrics]
    t0: int
    last_send: int
    end: int
    workers: int
    cpu_s: float
    connections_opened: int
    max_in_flight: int
    lag_bound_ms: float
    min_achieved: float
    per_tenant_scheduled: dict[str, int] = field(default_factory=dict)
    per_tenant_slo: dict[str, dict[str, float]] = field(default_factory=dict)  # the objectives that are set
    warmup_s: float = 0.0
    started_unix: float = 0.0  # t0 on the wall clock (time.time()), to line the stage up with other logs
    # one entry per agent when the stage ran on several hosts (loadgen/coordinator.py); empty on one host
    hosts: list[dict] = field(default_factory=list)

    @property
    def total(self) -> TenantMetrics:
        out = TenantMetrics()
        for m in self.tenants.values():
            out.merge(m)
        return out

    @property
    def requested_rate(self) -> float:
        return self.scheduled / self.duration_s

    @property
    def send_span_s(self) -> float:
        span = (self.last_send - self.t0) / NS if self.last_send else 0.0
        return max(self.duration_s, span)

    @property
    def achieved_rate(self) -> float:
        return self.sent / self.send_span_s

    @property
    def achieved_ratio(self) -> float:
        return self.achieved_rate / self.requested_rate if self.scheduled else 1.0

    @property
    def lag_p99_ms(self) -> float:
        return self.total.hist["send_lag"].percentile(99) / 1e6

    def invalid_reasons(self) -> list[str]:
        reasons = []
        if self.achieved_ratio < self.min_achieved:
            reasons.append(f"achieved {self.achieved_ratio:.1%} of the requested rate (< {self.min_achieved:.0%})")
        lag = self.lag_p99_ms
        if not math.isnan(lag) and lag > self.lag_bound_ms:
            reasons.append(f"send-lag p99 {lag:.2f} ms > {self.lag_bound_ms:g} ms")
        for h in self.hosts:
            if h["late"]:
                reasons.append(f"host {h['host']} was late: send-lag p99 {h['send_lag_p99_ms']:.2f} ms "
                               f"> {self.lag_bound_ms:g} ms")
        return reasons

    @property
    def valid(self) -> bool:
        return not self.invalid_reasons()


def templates_for(cfg: RunConfig, model: str) -> list[TenantTemplate]:
    out = []
    for t in cfg.tenants:
        try:
            headers = tenant_headers(t.api_key, cfg.tenant_header, t.name, t.headers)
        except ValueError as exc:
            raise ConfigError(f"tenant {t.name!r}: {exc}") from None
        out.append(
            TenantTemplate(
                t.name, t.model or model, cfg.api, headers, dict(t.extra), cfg.ignore_eos, cfg.unique_prompts,
                cfg.stream,
            )
        )
    return out


def discover_model(cfg: RunConfig, timeout_s: float = 10.0) -> str:
    """The first model id from ``GET /v1/models`` (used when no model is configured)."""
    target = Target.from_url(cfg.url, cfg.api)
    conn_cls = http.client.HTTPSConnection if target.tls else http.client.HTTPConnection
    path = target.path.rsplit("/", 2)[0] + "/models" if cfg.api == "chat" else target.path.rsplit("/", 1)[0] + "/models"
    headers = {}
    first = cfg.tenants[0] if cfg.tenants else None
    if first is not None:
        headers = tenant_headers(first.api_key, cfg.tenant_header, first.name, first.headers)
    try:
        conn = conn_cls(target.host, target.port, timeout=timeout_s)
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
    except OSError as exc:
        raise ConfigError(f"no --model given and {cfg.url} could not be asked for its models: {exc}") from None
    if resp.status != 200:
        raise ConfigError(f"no --model given and GET {path} answered {resp.status}; pass --model")
    try:
        return str(json.loads(body)["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise ConfigError(f"no --model given and GET {path} returned no model id; pass --model") from None


def _warm_count(rate_per_worker: float, cap: int) -> int:
    """Connections opened before t0: enough for 50 ms of requests in flight per worker (up to 512).

    A request that finds no idle connection waits for a new one, and that wait is send lag; a slow
    moment of the server (or of a shared core) should not make the generator open connections mid-run.
    """
    return max(1, min(cap, 512, 4 + math.ceil(rate_per_worker * 0.05)))


def job_settings(cfg: RunConfig, stage: int = 0) -> dict:
    """The :class:`WorkerJob` fields that every worker of a stage shares (JSON-ready: agents get them too)."""
    return dict(
        timeout_s=cfg.timeout,
        max_connections=cfg.max_connections,
        max_retries=cfg.max_retries,
        retry_budget=cfg.retry_budget,
        throttle=cfg.throttle,
        throttle_k=cfg.throttle_k,
        slo_ns=slo_limits_ns(cfg.slo),
        tenant_slo_ns=[request_limits_ns(t.slo) for t in cfg.tenants],
        seed=cfg.seed + 7919 * stage,
        warmup_ns=int(cfg.warmup * NS),
    )


class WorkerGroup:
    """The worker processes of one host for one stage: spawn, wait until ready, start at ``t0``, collect.

    ``schedule`` is this host's part; with ``host``/``hosts`` (agents, loadgen/agent.py) it is the
    strided share ``host, host+hosts, …`` of the stage's schedule, and worker ``k`` is numbered
    ``host + hosts*k`` of ``hosts*n_workers`` so that every request keeps its index in the whole schedule.
    """

    def __init__(self, target: Target, templates: list[TenantTemplate], schedule: Schedule, n_workers: int,
                 settings: dict, duration_s: float, host: int = 0, hosts: int = 1) -> None:
        self.n_workers = max(1, min(n_workers, len(schedule) or 1))
        self.duration_s = duration_s
        self.timeout_s = float(settings.get("timeout_s", 60.0)) * (int(settings.get("max_retries", 0)) + 1)
        rate = len(schedule) / duration_s
        cap = int(settings.get("max_connections", 20000))
        self.pipes: list[Pipe] = []
        self.procs: list[subprocess.Popen] = []
        for k in range(self.n_workers):
            parent_end, proc = _spawn_worker()
            self.pipes.append(parent_end)
            self.procs.append(proc)
            job = WorkerJob(
                worker=host + hosts * k,
                workers=hosts * self.n_workers,
                target=target,
                templates=templates,
                schedule=schedule.share(k, self.n_workers),
                warm_connections=_warm_count(rate / self.n_workers, cap),
                **settings,
            )
            parent_end.send(job)

    def wait_ready(self) -> None:
        try:
            for pipe in self.pipes:
                msg = _recv(pipe, time.monotonic() + READY_TIMEOUT_S, "start")
                if msg[0] != "ready":
                    raise StageError(msg[1])
        except EOFError:
            raise StageError("a worker process exited unexpectedly") from None

    def start(self, t0: int) -> None:
        for pipe in self.pipes:
            pipe.send(("start", t0))

    def collect(self, t0: int, on_tick: Callable[[float], None] | None = None) -> list[WorkerResult]:
        deadline = time.monotonic() + max(0.0, (t0 - monotonic_ns()) / NS) + self.duration_s + self.timeout_s + 30.0
        results: list[WorkerResult] = []
        try:
            for pipe in self.pipes:
                while not pipe.poll(0.1):
                    if on_tick is not None:
                        on_tick(min(1.0, max(0.0, (monotonic_ns() - t0) / NS / self.duration_s)))
                    if time.monotonic() > deadline:
                        raise StageError("workers did not finish within duration + timeout + 30 s")
                msg = pipe.recv()
                if msg[0] != "result":
                    raise StageError(msg[1])
                results.append(msg[1])
        except EOFError:
            raise StageError("a worker process exited unexpectedly") from None
        return results

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.close()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def merge_tenants(names: list[str], per_worker: list[list[dict]]) -> dict[str, TenantMetrics]:
    """Per tenant, the merge of every worker's (or host's) ``TenantMetrics.to_dict()`` list."""
    merged = {n: TenantMetrics() for n in names}
    for tenants in per_worker:
        for name, data in zip(names, tenants, strict=True):
            merged[name].merge(TenantMetrics.from_dict(data))
    return merged


def run_stage(
    cfg: RunConfig,
    model: str,
    scale: float = 1.0,
    stage: int = 0,
    on_tick: Callable[[float], None] | None = None,
) -> StageResult:
    """Run one stage with every tenant's rate multiplied by ``scale``; see the module docstring."""
    schedule = build_schedule(cfg, scale, stage)
    target = Target.from_url(cfg.url, cfg.api)
    templates = templates_for(cfg, model)
    group = WorkerGroup(target, templates, schedule, cfg.workers, job_settings(cfg, stage), cfg.duration)
    try:
        group.wait_ready()
        t0 = monotonic_ns() + int(START_DELAY_S * NS)
        started_unix = time.time() + (t0 - monotonic_ns()) / NS
        group.start(t0)
        results = group.collect(t0, on_tick)
    finally:
        group.close()
    merged = merge_tenants([t.name for t in cfg.tenants], [r.tenants for r in results])
    return stage_result(
        cfg, stage, scale, schedule, merged,
        t0=t0,
        last_send=max((r.last_send for r in results), default=0),
        end=max((r.end for r in results), default=t0),
        workers=group.n_workers,
        cpu_s=sum(r.cpu_s for r in results),
        connections_opened=sum(r.connections_opened for r in results),
        max_in_flight=sum(r.max_in_flight for r in results),
        started_unix=started_unix,
    )


def stage_result(cfg: RunConfig, stage: int, scale: float, schedule: Schedule, merged: dict[str, TenantMetrics],
                 **measured: Any) -> StageResult:
    """A stage's result: what the configuration and the schedule say, and ``measured`` (t0, last_send, end,
    workers, cpu_s, connections_opened, max_in_flight, started_unix; hosts on several hosts) as given."""
    names = [t.name for t in cfg.tenants]
    return StageResult(
        stage=stage,
        target_rate=stage_target_rate(cfg, scale, len(schedule) / cfg.duration),
        duration_s=cfg.duration,
        scheduled=len(schedule),
        sent=sum(m.sent for m in merged.values()),
        tenants=merged,
        lag_bound_ms=cfg.lag_bound_ms,
        min_achieved=cfg.min_achieved,
        per_tenant_scheduled=dict(zip(names, schedule.count_by_tenant(len(names)), strict=True)),
        per_tenant_slo={t.name: t.slo.given() for t in cfg.tenants if t.slo.given()},
        warmup_s=cfg.warmup,
        **measured,
    )


def stage_target_rate(cfg: RunConfig, scale: float, schedule_rate: float) -> float:
    return cfg.total_rate * scale if all(t.arrival != "trace" for t in cfg.tenants) else schedule_rate


def _spawn_worker() -> tuple[Pipe, subprocess.Popen]:
    """Start ``python -m admit.loadgen.worker FD`` with one end of a socket pair as its channel.

    A fresh interpreter (rather than ``fork``) inherits no threads or locks from the caller, and (unlike
    ``multiprocessing``'s spawn) does not re-import the caller's ``__main__``.
    """
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-m", "admit.loadgen.worker", str(theirs.fileno())],
        pass_fds=[theirs.fileno()],
        stdin=subprocess.DEVNULL,
    )
    theirs.close()
    return Pipe(ours.detach()), proc


def _recv(pipe, deadline: float, what: str):
    while not pipe.poll(0.05):
        if time.monotonic() > deadline:
            raise StageError(f"a worker did not become ready to {what} in {READY_TIMEOUT_S:g} s")
    return pipe.recv()
