"""The gateway as a raw ASGI app: tenant identity, admission, rate envelopes and the proxy to the backend.

Routes: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (admitted, streamed through chunk by
chunk), ``GET /v1/models`` (authenticated, not admitted), ``GET /health``, ``GET /metrics`` and the admin
API under ``/admin/`` (see `admin.py`).

A completion request goes: identify the tenant (401) → read the body within ``max_body_bytes`` (413) →
validate it (400) → charge the rate envelopes (429 ``envelope-empty``) → take a concurrency lease, maybe
after waiting in the tenant's queue (429 ``queue-full`` / ``ttl-expired``; with Redis the charge and the
first try for the lease are one script, one round trip) → forward (503 ``no-backend``
when nothing answers) → stream the answer back. A task watches the client connection meanwhile; if the
client goes away the request task is cancelled, which gives the lease back (or leaves the queue) and closes
the upstream connection, so the backend stops working for nobody. Every request ends with one request-log
line and one count in ``admit_gateway_requests_total`` — error paths included, each answered with a JSON
body (a bug of ours is a JSON 500 ``gateway-error`` if the answer had not started). Lines of requests that
name no tenant (401s, 404s) are rate-limited (``unauthenticated_log_per_s``); what is left out is counted.

Below the app, gateway/guard.py bounds every connection (head size, head and body deadlines, idle time,
count); its answers reach ``on_connection_event``, which counts and logs them like the app's own.

**Token envelopes charge what the backend delivers.** A request is charged up front the most the backend
may produce for it (the prompt and the output limit the backend honours, per choice, or the backend's
context when the body names none: gateway/body.py), so it can only start when the envelope has room for
all of it. When it ends, however it ends, the charge is settled (``EnvelopeBook.settle``) to what the
backend delivered: its ``usage`` when it sent one, else the stream's token events the gateway received,
those not yet passed on to a client that left included (gateway/answers.py). A request that never reached
the backend (``no-backend``, ``backend-busy``) is refunded. The backend's context length is the
configuration's ``max_model_len``, else what its ``GET /v1/models`` reports, asked at start-up and until it
answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from admit.core.contract import ContractMeter, lending, nominal_concurrency
from admit.core.gcra import Gcra
from admit.core.telemetry import TenantTokens
from admit.gateway.admin import AdminApi
from admit.gateway.admission import ENVELOPE_EMPTY, AdmissionBackend, Deferred, Lease
from admit.gateway.answers import (
    ERROR_EVENT,
    STREAM_END,
    USAGE_KEY,
    StreamTokens,
    body_usage,
    context_tokens,
    error_message,
    event_code,
    stream_usage,
)
from admit.gateway.asgi import HttpError, Receive, Scope, Send, bearer, header, read_body, send_error, send_json
from admit.gateway.body import BadBody, RequestInfo, parse_request
from admit.gateway.config import GatewayConfig
from admit.gateway.envelopes import Charge, Deferral, EnvelopeBook
from admit.gateway.guard import SCOPE_CLOSED, Bounds
from admit.gateway.jsonl import JsonlWriter
from admit.gateway.local_admission import LocalAdmission
from admit.gateway.metrics import GatewayMetrics
from admit.gateway.state import SavedState, load_state, save_state
from admit.gateway.telemetry import LiveTelemetry, gateway_spec
from admit.gateway.upstream import BackendBroken, BackendTimeout, NoBackend, Response, Upstream

if TYPE_CHECKING:
    from admit.gateway.redis.admission import RedisAdmission
    from admit.gateway.redis.contracts import SharedContracts
    from admit.gateway.redis.envelopes import SharedEnvelopeBook

log = logging.getLogger("admit.gateway")

STEP_HEADER = b"x-admit-step-id"
_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"server", b"date"})
_COMPLETIONS = {"/v1/completions": False, "/v1/chat/completions": True}
_MAX_KEEP = 1 << 20  # bytes of a non-streamed answer kept to read its usage


@dataclass(slots=True)
class Record:
    """One request as the request log will show it."""

    arrival: float
    t0: float
    path: str
    tenant: str | None = None
    model: str | None = None
    stream: bool = False
    step_id: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    queue_wait_s: float | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    up_t0: float = 0.0  # when the request went to the backend
    backend_ttft_s: float | None = None  # from then to the backend's first body bytes (a whole body if unstreamed)
    status: int = 0
    outcome: str = ""
    started: bool = False  # the answer's status line has been sent
    finished: bool = False  # the last byte is being sent: a disconnect now is not the client's fault
    offered: bool = False  # counted as an arrival in the telemetry windows
    n_tenant: int = -1  # the tenant's index, once known
    left: bool = False  # the client went away and the request's task was cancelled for it
    logged: bool = False  # its metrics, telemetry and request-log line are written (once, before the last byte)
    in_contract: bool | None = None  # classified at arrival where the tenant has a contract (core/contract.py)
    contract_at: float | None = None  # the Unix time its contract meter saw it: once its body was read
    contract_seq: int | None = None  # with Redis, the shared envelope's number of its classification

    def overhead_s(self) -> float | None:
        """The gateway's own time in the request's TTFT: reading and parsing it, charging its envelopes,
        sending it upstream and its first bytes on (TTFT less the queue wait and the backend's TTFT)."""
        if self.ttft_s is None or self.backend_ttft_s is None:
            return None
        return max(0.0, self.ttft_s - (self.queue_wait_s or 0.0) - self.backend_ttft_s)

    def line(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "arrival": round(self.arrival, 6),
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "queue_wait_s": _r(self.queue_wait_s),
            "ttft_s": _r(self.ttft_s),
            "e2e_s": _r(self.e2e_s),
            "backend_ttft_s": _r(self.backend_ttft_s),
            "overhead_s": _r(self.overhead_s()),
            "outcome": self.outcome,
            "status": self.status,
            "model": self.model,
            "stream": self.stream,
            "path": self.path,
            "step_id": self.step_id,
            "in_contract": self.in_contract,
            "contract_at": self.contract_at,
            "contract_seq": self.contract_seq,
        }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


async def _watch(receive: Receive, task: asyncio.Task[Any], rec: Record) -> None:
    """Cancel the request's task when its client goes away (unless the answer's last byte is on its way)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    if not rec.finished:
        rec.left = True
        task.cancel()


class Gateway:
    def __init__(self, cfg: GatewayConfig, backend_url: str, backend_api_key: str | None = None) -> None:
        self.cfg = cfg
        self.names = [t.name for t in cfg.tenants]
        self.contracts = [None if t.contract is None else ContractMeter(t.contract) for t in cfg.tenants]
        self.index = {n: i for i, n in enumerate(self.names)}
        self._keys = cfg.key_index()
        self._trusted = cfg.auth.header.lower().encode() if cfg.auth.mode == "trusted_header" else None
        self.clock = time.monotonic
        self.book = EnvelopeBook(on_alert=self._on_alert)
        self.shared_book: SharedEnvelopeBook | None = None
        self.shared_admission: RedisAdmission | None = None  # the admission backend, when it is Redis
        self.shared_contracts: SharedContracts | None = None  # with Redis: the contract envelopes, one for all
        if cfg.redis is not None:  # the envelopes' budget is one for all replicas, kept in Redis
            from admit.gateway.redis.envelopes import SharedEnvelopeBook

            self.book = self.shared_book = SharedEnvelopeBook(cfg.redis, self.clock, on_alert=self._on_alert)
        for t in cfg.tenants:
            for env in t.envelopes:
                self.book.configure(t.name, env, self.clock())
        self.upstream = Upstream(backend_url, cfg.backend_timeout_s, backend_api_key)
        self.request_log = JsonlWriter(cfg.request_log)
        self.audit_log = JsonlWriter(cfg.audit_log)
        self._admission: AdmissionBackend | None = None
        self.metrics = GatewayMetrics(lambda: self.admission.snapshot(), self.book, self.clock)
        self.admin = AdminApi(self, cfg.admin.resolve())
        self.telemetry = LiveTelemetry(cfg, backend_url)
        self.in_flight_requests = 0  # requests inside the proxy path right now (tests check it drains to 0)
        # the backend's context length: what a request that names no output limit may cost (module docstring)
        self.context_tokens: int | None = cfg.max_model_len
        self._context_task: asyncio.Task[None] | None = None
        # the requests offered to admission and not yet admitted, and those admitted and not finished, by id:
        # their prompts and streamed tokens are the token footprints of the live Observation
        self.waiting_admission: dict[int, Record] = {}
        self.admitted: dict[int, Record] = {}
        self._metrics_token = cfg.metrics.resolve()
        admin_token = cfg.admin.resolve()
        self._metrics_tokens = [t.encode() for t in (self._metrics_token, admin_token) if t]
        # request-log lines of requests that name no tenant: a bucket, so that nobody without a key can grow
        # the log without bound; suppressed lines are counted, and the next line written says how many
        rate = cfg.unauthenticated_log_per_s
        self._anon_log = Gcra(rate, max(1, math.ceil(10 * rate)), self.clock()) if rate > 0 else None
        self.anon_log_suppressed = 0  # since the last unauthenticated line written
        self._errors_seen: set[str] = set()  # bugs whose traceback was logged once already
        self.connection_bounds: Bounds | None = None  # set by the server (gateway/server.py)
        self.open_connections: Callable[[], int] = lambda: 0  # the server's count, once it runs
        self.metrics.gauge("connections", "client connections open", lambda: self.open_connections())
        self.metrics.token_gauges(self.names, self.token_footprints)
        if any(t.contract is not None for t in cfg.tenants):  # without contracts the page is as before
            self.metrics.lending_gauges(self.names, self.lending)
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set at start-up

    @property
    def admission(self) -> AdmissionBackend:
        assert self._admission is not None, "the gateway has not started (no ASGI lifespan startup yet)"
        return self._admission

    # ----------------------------------------------------------------- lifecycle
    async def startup(self) -> None:
        if self._admission is None and self.cfg.redis is not None:
            from admit.gateway.redis.admission import RedisAdmission  # imported on use: it needs redis-py
            from admit.gateway.redis.metrics import RedisCollector

            shared = RedisAdmission(self.cfg.tenants, self.cfg.redis)
            await shared.start()
            assert self.shared_book is not None
            await self.shared_book.attach(shared)
            if any(c is not None for c in self.contracts):
                from admit.gateway.redis.contracts import SharedContracts

                contracts = [t.contract for t in self.cfg.tenants]
                self.shared_contracts = SharedContracts(self.cfg.redis, self.names, contracts)
                await self.shared_contracts.attach(shared)
            self.metrics.registry.register(RedisCollector(shared, self.shared_contracts))
            self._admission = self.shared_admission = shared
        if self._admission is None:
            self._admission = LocalAdmission(self.cfg.tenants, self.cfg.capacity)
            if self.cfg.state_file is not None:
                self._restore_state(self.cfg.state_file)
        self._loop = asyncio.get_running_loop()
        await self.upstream.start()
        await self.telemetry.start()
        if self.context_tokens is None:
            self._context_task = self._loop.create_task(self._learn_context())

    async def _learn_context(self) -> None:
        """Ask the backend's ``GET /v1/models`` for its context length until it answers (backing off from 1 s to a
        minute while it does not); an answer without ``max_model_len`` leaves ``default_output_tokens`` in use."""
        wait = 1.0
        while True:
            try:
                resp = await asyncio.wait_for(self.upstream.request("GET", "/v1/models", None), 10)
                try:
                    body = await asyncio.wait_for(resp.read(), 10)
                except BaseException:
                    resp.close()
                    raise
                resp.release()
            except (NoBackend, BackendTimeout, BackendBroken, TimeoutError):
                await asyncio.sleep(wait)
                wait = min(60.0, 2 * wait)
                continue
            self.context_tokens = context_tokens(body) if resp.status == 200 else None
            if self.context_tokens is None:
                log.warning("the backend's GET /v1/models (status %d) gives no max_model_len: a chat request that "
                            "names no output limit is charged default_output_tokens (%d) up front; set "
                            "max_model_len in the configuration to charge the context", resp.status,
                            self.cfg.default_output_tokens)
            else:
                log.info("the backend's context length: %d tokens (GET /v1/models)", self.context_tokens)
            return

    def _restore_state(self, path: Path) -> None:
        """Apply what the state file kept over the configuration (gateway/state.py)."""
        saved = load_state(path)
        if saved is None:
            return
        adm, now = self.admission, self.clock()
        for kind, values in (("limits", saved.limits), ("borrow", saved.borrow)):
            for name, v in values.items():
                i = self.index.get(name)
                if i is None:
                    log.warning("state file %s: tenant %r is not configured any more; its %s is skipped",
                                path, name, kind)
                elif kind == "limits":
                    ceiling, floor = self.cfg.tenants[i].max_limit, self.cfg.tenants[i].min_limit
                    if ceiling is not None and v > ceiling:  # the quota shrank since it was saved
                        log.warning("state file %s: tenant %r's saved limit %d is above its max_limit %d; %d is "
                                    "used", path, name, v, ceiling, ceiling)
                        v = ceiling
                    if floor is not None and v < floor:  # the guaranteed share grew since it was saved
                        log.warning("state file %s: tenant %r's saved limit %d is below its min_limit %d; %d is "
                                    "used", path, name, v, floor, floor)
                        v = floor
                    adm.set_limit(i, v)
                else:
                    set_borrow = getattr(adm, "set_borrow", None)
                    if set_borrow is not None and (v == 0 or self.cfg.capacity is not None):
                        set_borrow(i, v)
        for name, envs in saved.envelopes.items():
            if name not in self.index:
                log.warning("state file %s: tenant %r is not configured any more; its envelopes are skipped",
                            path, name)
                continue
            keep = {e.target for e in envs}
            for env in self.book.envelopes(name):
                if env.cfg.target not in keep:
                    self.book.remove(name, env.cfg.target)
            for e in envs:
                self.book.configure(name, e, now)
        self.admin.restore_versions(saved)
        log.info("state file %s: restored version %d", path, saved.version)

    def save_state(self) -> None:
        """Write the run-time state to the state file, if there is one (after every admin change)."""
        path = self.cfg.state_file
        if path is None:
            return
        snap = self.admission.snapshot()["tenants"]
        state = SavedState(
            version=self.admin.version,
            tenant_versions=self.admin.tenant_versions(),
            limits={n: int(st["limit"]) for n, st in snap.items()},
            borrow={n: int(st.get("borrow", 0)) for n, st in snap.items()},
            envelopes={n: [e.cfg for e in self.book.envelopes(n)] for n in self.names},
        )
        try:
            save_state(path, state)
        except OSError as exc:  # the change is in force; only its survival of a restart is at risk
            self.metrics.errors.inc("StateFileError")
            log.error("state file %s could not be written: %s", path, exc)

    async def shutdown(self) -> None:
        if self._context_task is not None:
            self._context_task.cancel()
        await self.telemetry.close()
        close = getattr(self._admission, "close", None)
        if close is not None:
            await close()
        await self.upstream.close()
        self.request_log.close()
        self.audit_log.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    try:
                        await self.startup()
                    except Exception as exc:  # pragma: no cover - reported by the server
                        await send({"type": "lifespan.startup.failed", "message": str(exc)})
                        return
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await self.shutdown()
                    await send({"type": "lifespan.shutdown.complete"})
                    return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        chat = _COMPLETIONS.get(path)
        if chat is not None:  # the hot path: its own handler answers every error of its own
            await self._completion(scope, receive, send, chat)
            return
        rec = Record(time.time(), self.clock(), path[:200])
        try:
            await self._other(scope, receive, send, rec)
        except HttpError as err:
            await self._fail(send, rec, err)
        except ConnectionResetError:
            closed = scope.get(SCOPE_CLOSED)
            self._finish(rec, 408 if closed else 499, closed or "client-disconnect")
        except Exception as exc:  # a bug of ours: a JSON 500 if nothing was sent yet, a log line either way
            self._bug(exc, path)
            if rec.started:
                self._finish(rec, rec.status or 500, "gateway-error")
            else:
                await self._fail(send, rec, HttpError(500, "gateway-error", "the gateway failed on this request"))

    async def _other(self, scope: Scope, receive: Receive, send: Send, rec: Record) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        if path == "/health" and method in ("GET", "HEAD"):
            rec.started = True
            await send_json(send, 200, {"status": "ok"})
        elif path == "/metrics" and method == "GET":
            self._authorize_metrics(scope)
            body = self.metrics.render()
            rec.started = True
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]})
            await send({"type": "http.response.body", "body": body})
        elif path.startswith("/admin/") or path == "/admin":
            rec.started = True  # the admin API answers for itself (JSON errors included)
            status, reason = await self.admin.handle(scope, receive, send)
            if status >= 400:  # a failed admin call gets a request-log line; the audit log has the changes
                self._finish(rec, status, reason)
        elif path == "/v1/models":
            await self._models(scope, send, rec)
        else:
            raise HttpError(404, "not-found", "no such route")

    def _authorize_metrics(self, scope: Scope) -> None:
        if self._metrics_token is None:
            return  # the documented default: open, like most Prometheus endpoints (docs/gateway.md)
        given = bearer(scope) or b""
        if not any(hmac.compare_digest(given, t) for t in self._metrics_tokens):
            raise HttpError(401, "unauthorized", "a metrics or admin token is required (Authorization: Bearer ...)")

    def _bug(self, exc: BaseException, where: str) -> None:
        """Log a bug of ours: the traceback once per kind, a one-line warning afterwards."""
        kind = f"{type(exc).__name__}: {str(exc)[:120]}"
        self.metrics.errors.inc(type(exc).__name__)
        if kind in self._errors_seen or len(self._errors_seen) >= 256:
            log.warning("request on %s failed again: %s", where, kind)
            return
        self._errors_seen.add(kind)
        log.error("request on %s failed", where, exc_info=exc)

    def on_connection_event(self, event: str, status: int | None) -> None:
        """A connection guard's event (gateway/guard.py): counted; one that answered a request is also a
        request-log line and a count in ``admit_gateway_requests_total``, like the app's own answers."""
        self.metrics.connection_events.inc(event)
        if status is not None:
            rec = Record(time.time(), self.clock(), "")
            rec.started = rec.finished = True
            self._finish(rec, status, event)

    # ----------------------------------------------------------------- identity
    def _identify(self, scope: Scope) -> int:
        if self._trusted is not None:
            name = header(scope, self._trusted)
            i = self.index.get(name.decode("latin-1")) if name else None
            if i is None:
                raise HttpError(401, "unknown-tenant", f"header {self._trusted.decode()} names no configured tenant")
            return i
        key = bearer(scope)
        i = self._keys.get(hashlib.sha256(key).digest()) if key else None
        if i is None:
            raise HttpError(401, "unauthorized", "a valid API key is required (Authorization: Bearer ...)")
        return i

    # ----------------------------------------------------------------- completions
    async def _completion(self, scope: Scope, receive: Receive, send: Send, chat: bool) -> None:
        rec = Record(time.time(), self.clock(), scope["path"])
        step = header(scope, STEP_HEADER)
        if step:
            rec.step_id = step[:128].decode("latin-1")
        try:
            if scope["method"] != "POST":
                raise HttpError(405, "method-not-allowed", "use POST")
            tenant = self._identify(scope)
            rec.tenant = self.names[tenant]
            raw = await read_body(receive, scope, self.cfg.max_body_bytes)
            try:
                info = parse_request(raw, chat)
            except BadBody as exc:
                raise HttpError(400, "bad-request", str(exc)) from None
        except HttpError as err:
            await self._fail(send, rec, err)
            return
        except ConnectionResetError:  # the client left while sending the body, or the guard's deadline closed it
            closed = scope.get(SCOPE_CLOSED)
            self._finish(rec, 408 if closed else 499, closed or "client-disconnect")
            return
        rec.model, rec.stream, rec.prompt_tokens = info.model, info.stream, info.prompt_tokens
        self.in_flight_requests += 1
        rec.offered = True
        rec.n_tenant = tenant
        self.telemetry.arrival(tenant)
        meter = self.contracts[tenant]
        if meter is not None and self.cfg.redis is None:  # with Redis: the shared envelope's, in _serve
            # on the time it is classified, which the log keeps (contract_at): requests read concurrently reach
            # this line in another order than they arrived, and the meter must see its times in its own order
            rec.contract_at = round(time.time(), 6)
            rec.in_contract = meter.arrive(rec.contract_at, info.prompt_tokens, self._asked(info))
            self.metrics.contract_requests.inc(rec.tenant, "in" if rec.in_contract else "excess")
        self.waiting_admission[id(rec)] = rec
        # the request runs in this (the server's) task; a watcher cancels it if the client goes away, which
        # gives the lease back or leaves the queue, and drops the upstream connection
        task = asyncio.current_task()
        assert task is not None
        watch = self._loop.create_task(_watch(receive, task, rec))
        try:
            await self._serve(scope, send, tenant, info, raw, rec)
        except asyncio.CancelledError:
            if not rec.left:  # cancelled by the server (shutdown), not by our watcher
                rec.outcome, rec.status = rec.outcome or "client-disconnect", rec.status or 499
                raise
            task.uncancel()
            if not rec.outcome:
                rec.outcome, rec.status = "client-disconnect", 499
        except Exception as exc:  # a bug of ours: a JSON 500 if the answer had not started, a log line either way
            self._bug(exc, scope["path"])
            if not rec.started and not rec.logged:
                with contextlib.suppress(Exception):
                    await self._fail(send, rec, HttpError(500, "gateway-error", "the gateway failed on this request"))
            rec.outcome, rec.status = rec.outcome or "gateway-error", rec.status or 500
        finally:
            watch.cancel()
            self.in_flight_requests -= 1
            self.waiting_admission.pop(id(rec), None)
            self.admitted.pop(id(rec), None)
            self._finish(rec, rec.status, rec.outcome)

    def _asked(self, info: RequestInfo) -> int:
        """The output tokens a request asks for, as its contract counts them (core/contract.py's cost)."""
        return info.cost_tokens(self.context_tokens, self.cfg.default_output_tokens) - info.prompt_tokens

    async def _serve(self, scope: Scope, send: Send, tenant: int, info: RequestInfo, raw: bytes, rec: Record) -> None:
        name = self.names[tenant]
        charge: Charge | None = None
        cost = info.cost_tokens(self.context_tokens, self.cfg.default_output_tokens)
        try:
            lease: Lease | None = None
            asked = False
            if self.shared_book is None:
                got = self.book.charge(name, info.model, cost, self.clock())
            elif self.shared_contracts is not None and self.contracts[tenant] is not None:
                # the class on the shared envelope (on Redis's clock; gateway/redis/contracts.py), the charge and
                # the lease in one script, or the failure mode's answer: 503 when closed, the mirror when open
                got_class, got, lease, asked = await self.shared_book.classify_and_acquire(
                    tenant, info.model, cost, self.shared_contracts, info.prompt_tokens, self._asked(info))
                rec.in_contract, rec.contract_at, rec.contract_seq = got_class.in_contract, got_class.at, got_class.seq
                self.metrics.contract_requests.inc(name, "in" if rec.in_contract else "excess")
            else:  # with Redis, one script charges the envelopes and, if they allow it, takes the lease
                got, lease, asked = await self.shared_book.charge_and_acquire(tenant, info.model, cost)
            if isinstance(got, Deferral):
                why = f"rate envelope '{got.target}' has no {got.unit} left"
                raise Deferred(ENVELOPE_EMPTY, got.retry_after_s, why)
            charge = got
            first = rec.in_contract is not False  # the in-contract queue, ahead of the tenant's excess
            if asked:  # that script found no free slot: wait in the queue without asking Redis again
                assert self.shared_admission is not None
                lease = await self.shared_admission.acquire(tenant, asked=True, in_contract=first)
            elif lease is None:
                lease = await self.admission.acquire(tenant, in_contract=first)
        except Deferred as d:
            if charge is not None:
                self.book.refund(charge, self.clock())
            self.metrics.deferred.inc(name, d.reason)
            await self._fail(send, rec, HttpError(d.status, d.reason, d.detail or d.reason, d.retry_after_s))
            return
        except asyncio.CancelledError:
            if charge is not None:
                self.book.refund(charge, self.clock())
            raise
        rec.queue_wait_s = lease.waited_s
        self.metrics.admitted.inc(name)
        self.waiting_admission.pop(id(rec), None)
        self.admitted[id(rec)] = rec
        ran: bool | None = None  # stays None when the client left or the task failed: it may have reached it
        try:
            ran = await self._forward(scope, send, raw, rec)
        finally:
            self.admission.release(lease)
            if charge is not None and charge.items:
                if ran is False:  # it never ran: nothing to pay
                    self.book.refund(charge, self.clock())
                else:  # whatever ended it: what the backend delivered (its usage, or the stream's events counted)
                    self.book.settle(charge, rec.prompt_tokens + rec.output_tokens, self.clock())

    async def _forward(self, scope: Scope, send: Send, raw: bytes, rec: Record) -> bool:
        """Proxy one admitted request; False when it never reached the backend."""
        path = scope["path"] + ("?" + scope["query_string"].decode("latin-1") if scope.get("query_string") else "")
        rec.up_t0 = self.clock()
        try:
            resp = await self.upstream.request("POST", path, raw)
        except NoBackend as exc:
            err = HttpError(503, "no-backend", str(exc), self.cfg.no_backend_retry_after_s)
            await self._fail(send, rec, err)
            return False
        except BackendTimeout as exc:
            await self._fail(send, rec, HttpError(504, "backend-timeout", str(exc)))
            return True
        rec.status = resp.status
        if resp.status == 503:  # the engine's own admission refused it (vLLM's --max-num-queued-reqs/-tokens)
            return await self._busy(send, resp, rec)
        ok = True
        counted = StreamTokens() if rec.stream else None
        try:
            headers = [(k, v) for k, v in resp.headers if k not in _HOP]
            if not rec.stream and resp.length is not None and resp.length <= _MAX_KEEP:
                ok = await self._whole(send, resp, headers, rec)  # one write instead of a chunked stream
                return True
            chunk = await resp.next_chunk()
            rec.backend_ttft_s = self.clock() - rec.up_t0
            if rec.stream and resp.status == 200 and chunk.startswith(ERROR_EVENT) and event_code(chunk) == 503:
                # vLLM checks its admission cap again once the stream's 200 is written and then streams the
                # refusal as the only event; the status line waited for it, so the client gets a real 503
                ok = False
                return await self._busy(send, resp, rec, chunk)
            rec.started = True
            await send({"type": "http.response.start", "status": resp.status, "headers": headers})
            usage: dict[str, Any] | None = None
            kept: list[bytes] | None = None if rec.stream else []
            kept_n = 0
            last = b""
            # a stream's events so far, kept on the record: its footprint in the live Observation meanwhile, and
            # what it is charged if it ends early
            rec.output_tokens = 0
            while chunk:
                if rec.ttft_s is None:
                    rec.ttft_s = self.clock() - rec.t0
                if counted is not None:
                    if not rec.finished:  # once [DONE] has come, _end_stream has the stream's figures
                        rec.output_tokens = counted.feed(chunk)
                        if USAGE_KEY in chunk:
                            usage = stream_usage(chunk) or usage
                elif kept is not None and kept_n < _MAX_KEEP:
                    kept.append(chunk)
                    kept_n += len(chunk)
                if resp.done:  # the backend's last bytes: they go out with the end of the answer, one write
                    last = chunk
                    break
                if kept is None and not rec.finished and STREAM_END in chunk:
                    # the client stops reading at [DONE] and may hang up before the backend's last bytes
                    # (a chunked stream's terminator can come in a later read): the request is done here
                    self._end_stream(rec, resp.status, usage)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                chunk = await resp.next_chunk()
            if kept:
                usage = body_usage(kept[0] if len(kept) == 1 else b"".join(kept))
                self._end_stream(rec, resp.status, usage)
            elif not rec.finished:
                self._end_stream(rec, resp.status, usage)
            await send({"type": "http.response.body", "body": last, "more_body": False})
        except BackendBroken as exc:
            ok = False
            if not rec.started:  # broke off before its first byte: nothing was sent, the client gets a 502
                log.warning("backend answer of tenant %s broke: %s", rec.tenant, exc)
                await self._fail(send, rec, HttpError(502, "backend-broken", "the backend broke off its answer"))
                return True
            rec.outcome = "backend-broken"
            rec.finished = True
            log.warning("backend stream of tenant %s broke: %s", rec.tenant, exc)
            self._finish(rec, rec.status, rec.outcome)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            if ok and rec.finished:
                resp.release()
            else:  # broken, or cancelled because the client left: drop the connection, the backend stops
                if counted is not None and not rec.finished:  # what the backend sent that was not passed on yet
                    rec.output_tokens = counted.feed(resp.take_buffered())
                resp.close()
        return True

    async def _busy(self, send: Send, resp: Response, rec: Record, event: bytes = b"") -> bool:
        """The backend refused the request with 503, its own admission full (vLLM: "The engine is currently
        busy...", no Retry-After), as a status or as a stream's only ``event``. The client gets the gateway's
        503 ``backend-busy`` with the backend's message and a Retry-After, the request counts as a rejection in
        the live telemetry, and its envelope charge is refunded (False: nothing ran)."""
        if event:  # the rest is "data: [DONE]"; _forward closes the connection
            body = event.removeprefix(b"data: ").split(b"\n", 1)[0]
        else:
            try:
                body = await resp.read()
                resp.release()
            except BackendBroken:
                resp.close()
                body = b""
        message = error_message(body) or "the backend answered 503"
        await self._fail(send, rec, HttpError(503, "backend-busy", f"the backend is busy: {message}",
                                              self.cfg.backend_busy_retry_after_s))
        return False

    def _end_stream(self, rec: Record, status: int, usage: dict[str, Any] | None) -> None:
        """A proxied answer is complete: its token figures (the backend's usage, else the events counted:
        [DONE] and a usage-only event carry no token), outcome and log line, before its last byte is sent."""
        if rec.stream:
            rec.output_tokens = max(0, rec.output_tokens - 1 - (usage is not None))
        if usage:
            rec.prompt_tokens = int(usage.get("prompt_tokens") or rec.prompt_tokens)
            rec.output_tokens = int(usage.get("completion_tokens") or rec.output_tokens)
        rec.outcome = "ok" if status < 400 else "backend-status"
        rec.finished = True
        self._finish(rec, rec.status, rec.outcome)

    async def _whole(self, send: Send, resp: Response, headers: list[tuple[bytes, bytes]], rec: Record) -> bool:
        """A non-streamed answer of known length: read it whole, then send it with its length in one piece.

        Its first byte reaches the client when its last one does either way (the backend sends a
        non-streamed answer when it is complete), so TTFT is the time the whole body was read. If the
        backend breaks off before the end, nothing has been sent yet: the client gets 502 ``backend-broken``.
        """
        try:
            body = await resp.read()
        except BackendBroken as exc:
            log.warning("backend answer of tenant %s broke: %s", rec.tenant, exc)
            await self._fail(send, rec, HttpError(502, "backend-broken", "the backend broke off its answer"))
            return False
        now = self.clock()
        rec.ttft_s = now - rec.t0
        rec.backend_ttft_s = now - rec.up_t0
        usage = body_usage(body)
        rec.output_tokens = 0
        if usage:
            rec.prompt_tokens = int(usage.get("prompt_tokens") or rec.prompt_tokens)
            rec.output_tokens = int(usage.get("completion_tokens") or 0)
        rec.outcome = "ok" if resp.status < 400 else "backend-status"
        rec.finished = True
        self._finish(rec, rec.status, rec.outcome)
        headers.append((b"content-length", b"%d" % len(body)))
        rec.started = True
        await send({"type": "http.response.start", "status": resp.status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})
        return True

    async def _models(self, scope: Scope, send: Send, rec: Record) -> None:
        try:
            if scope["method"] != "GET":
                raise HttpError(405, "method-not-allowed", "use GET")
            rec.tenant = self.names[self._identify(scope)]
            resp = await self.upstream.request("GET", "/v1/models", None)
        except HttpError as err:
            await self._fail(send, rec, err)
            return
        except NoBackend as exc:
            await self._fail(send, rec, HttpError(503, "no-backend", str(exc), self.cfg.no_backend_retry_after_s))
            return
        except BackendTimeout as exc:
            await self._fail(send, rec, HttpError(504, "backend-timeout", str(exc)))
            return
        try:
            body = await resp.read()
        except BackendBroken:
            resp.close()
            await self._fail(send, rec, HttpError(503, "no-backend", "the backend broke off", 1.0))
            return
        except BaseException:
            resp.close()
            raise
        resp.release()
        headers = [(k, v) for k, v in resp.headers if k not in _HOP]
        headers.append((b"content-length", str(len(body)).encode()))
        self._finish(rec, resp.status, "ok" if resp.status < 400 else "backend-status")
        rec.started = True
        await send({"type": "http.response.start", "status": resp.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    # ----------------------------------------------------------------- endings
    async def _fail(self, send: Send, rec: Record, err: HttpError) -> None:
        """Answer an error, its request-log line written first."""
        rec.status, rec.outcome, rec.finished = err.status, err.reason, True
        self._finish(rec, err.status, err.reason)
        rec.started = True
        await send_error(send, err)

    def _finish(self, rec: Record, status: int, outcome: str) -> None:
        """Count a request's end and write its log line — once, and before its last byte is sent, so whoever
        has the whole answer can already read the line (a request that ends without an answer is logged when
        its task ends)."""
        if rec.logged:
            return
        rec.logged = True
        rec.status, rec.outcome = status, outcome
        rec.e2e_s = self.clock() - rec.t0
        tenant = rec.tenant or "-"
        m = self.metrics
        m.requests.inc(tenant, outcome)
        if outcome == "ok" and rec.tenant is not None:
            if rec.queue_wait_s is not None:
                m.queue_wait.observe(tenant, rec.queue_wait_s)
            if rec.ttft_s is not None:
                m.ttft.observe(tenant, rec.ttft_s)
            m.e2e.observe(tenant, rec.e2e_s)
            if rec.output_tokens > 0:
                m.ntpot.observe(tenant, rec.e2e_s / rec.output_tokens)
                m.output_tokens.add(rec.output_tokens, tenant)
        if rec.offered and rec.tenant is not None and self.telemetry.finished(
                self.index[rec.tenant], outcome, rec.e2e_s, rec.ttft_s, rec.queue_wait_s, rec.output_tokens):
            m.good.inc(tenant)
            if rec.in_contract:
                m.contract_good.inc(tenant)
            elif rec.in_contract is False:
                m.contract_excess_good.inc(tenant)
        if self.request_log.path is not None:
            if rec.tenant is not None:
                self.request_log.write(rec.line())
            else:
                self._log_anonymous(rec)

    def lending(self) -> tuple[list[float], list[float]]:
        """Per tenant, the concurrency it borrows beyond its contract's nominal share and the part of its idle
        share that borrowers use (core/contract.py's ``nominal_concurrency`` of this configuration's ControlSpec
        and ``lending`` on the tenants' requests in flight now): what /metrics shows. With Redis the limits are
        all replicas' together, and so are the requests in flight (the shared leases as last read): every
        replica shows the same gauges."""
        snap = self.admission.snapshot()["tenants"]
        key = "in_flight" if self.shared_admission is None else "shared_in_flight"
        borrowed, lent = lending([snap[n][key] for n in self.names],
                                 nominal_concurrency(gateway_spec(self.cfg)))
        return borrowed.tolist(), lent.tolist()

    def token_footprints(self) -> TenantTokens:
        """Per tenant: prompt tokens waiting for admission, prompt tokens admitted with no first byte yet, and
        prompt + streamed tokens admitted (core/observation.py's prompt_tokens_queued, prefill_tokens,
        tokens_in_flight, from the gateway's own view of its requests)."""
        n = len(self.names)
        tok = TenantTokens.zeros(n)
        for rec in self.waiting_admission.values():
            tok.queued[rec.n_tenant] += rec.prompt_tokens
        for rec in self.admitted.values():
            t = rec.n_tenant
            tok.in_flight[t] += rec.prompt_tokens + rec.output_tokens
            if rec.ttft_s is None:
                tok.prefill[t] += rec.prompt_tokens
        return tok

    def _log_anonymous(self, rec: Record) -> None:
        """The line of a request that named no tenant, if the bucket allows it (module docstring)."""
        if self._anon_log is not None and self._anon_log.spend(1, self.clock()).allowed:
            line = rec.line()
            if self.anon_log_suppressed:
                line["suppressed_before"] = self.anon_log_suppressed
                self.anon_log_suppressed = 0
            self.request_log.write(line)
        else:
            self.anon_log_suppressed += 1
            self.metrics.log_suppressed.inc()

    def _on_alert(self, tenant: str, target: str, unit: str, frac: float) -> None:
        self.metrics.alerts.inc(tenant, target, unit)
        log.warning("envelope near exhaustion: tenant=%s target=%s unit=%s remaining=%.0f%%",
                    tenant, target, unit, 100 * frac)
