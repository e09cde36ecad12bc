"""The emulator's HTTP surface: routes, readiness, fault injection, and the answers' sinks.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``,
``GET /metrics``, ``GET /version``, ``GET|POST /admin/faults``, ``GET /debug/requests`` (the engine
model's per-request times, for benchmarks). A known path with the wrong method is a 405, any other path
a 404, both as OpenAI-style JSON errors.

With an admin token configured (``--admin-token-env``), ``/admin/faults`` (reading them too: they show how
a test is rigging the server) and ``/debug/requests`` (every client's request sizes and times) need
``Authorization: Bearer <token>``, compared in constant time; anything else is a 401 JSON error and changes
nothing. Without a token they are open only while every address the server listens on is a loopback one
(`loopback_only`; tests and ``admit demo`` run it on 127.0.0.1): a fault changes every client's answers, a
write that must not be open to a network. Bound anywhere else without a token, they answer 403 (a JSON
error naming ``--admin-token-env``) and change nothing. The OpenAI routes, ``/health``, ``/metrics`` and
``/version`` stay open either way, as vLLM's are. Until `EmulatorApp.listening` is told the addresses, the
two are closed as for a non-loopback one.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import math
import time
from collections.abc import Iterable

import numpy as np
from admit.emulator.clock import VirtualClock
from admit.emulator.config import EmulatorConfig
from admit.emulator.engine_loop import EngineLoop
from admit.emulator.faults import FaultError, Faults
from admit.emulator.http import Connection, HttpRequest
from admit.emulator.metrics import VllmMetrics, cache_config_labels
from admit.emulator.openai_request import ApiError, GenParams, parse_generation, parse_json
from admit.emulator.responses import AnswerFormat
from prometheus_client import CONTENT_TYPE_LATEST

from admit import __version__

log = logging.getLogger(__name__)

_ROUTES = {
    "/v1/completions": ("POST",),
    "/v1/chat/completions": ("POST",),
    "/v1/models": ("GET",),
    "/health": ("GET",),
    "/metrics": ("GET",),
    "/version": ("GET",),
    "/admin/faults": ("GET", "POST"),
    "/debug/requests": ("GET",),
}
_PROTECTED = frozenset({"/admin/faults", "/debug/requests"})  # need the admin token when one is configured


def loopback_only(addresses: Iterable[str]) -> bool:
    """Whether the server listens on loopback addresses alone (127.0.0.0/8, ::1): only then are the fault and
    debug routes open without a token. An empty list, a wildcard (0.0.0.0, ::) or anything not an IP is not."""
    found = False
    for a in addresses:
        try:
            if not ipaddress.ip_address(a.split("%", 1)[0]).is_loopback:
                return False
        except ValueError:
            return False
        found = True
    return found


class StreamSink:
    __slots__ = ("conn", "fmt")

    def __init__(self, conn: Connection, fmt: AnswerFormat) -> None:
        self.conn = conn
        self.fmt = fmt

    def on_tokens(self, first: int, n: int) -> None:
        self.conn.write(self.fmt.token_events(first, n))

    def on_finish(self, reason: str, completion_tokens: int) -> None:
        self.conn.end_stream(self.fmt.final_events(reason, completion_tokens))


class WholeSink(StreamSink):
    __slots__ = ()

    def on_tokens(self, first: int, n: int) -> None:
        pass

    def on_finish(self, reason: str, completion_tokens: int) -> None:
        self.conn.respond(200, self.fmt.whole_body(reason, completion_tokens))


class EmulatorApp:
    """Answers HTTP requests; owns the engine loop, the metrics and the faults of one server."""

    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        self._token = config.admin_token.encode() if config.admin_token else None
        self._admin_checked = True  # the fault and debug routes need the token, or answer 403 without one
        # CLOCK_MONOTONIC at full resolution (uvloop's loop.time() has millisecond steps); on Linux the same
        # clock in every process, so a client's timestamps compare directly with /debug/requests.
        self.wall = time.monotonic
        self.engine = config.build_engine()
        self.model = config.served_model()
        self.max_model_len = self.engine.max_model_len
        self.clock = VirtualClock(self.wall)
        self.faults = Faults()
        self.rng = np.random.default_rng(config.seed)
        e = self.engine
        cache_info = cache_config_labels(e.block_size, e.num_gpu_blocks, e.preset.gpu_memory_utilization,
                                         self.max_model_len, config.num_gpu_blocks)
        self.metrics = VllmMetrics(self.model, self.max_model_len, cache_info)
        self.loop = EngineLoop(e, self.clock, self.metrics, self.wall)
        self._ready_at = self.wall()
        self._apply({"latency_multiplier": config.latency_multiplier, "startup_delay_s": config.startup_delay_s})
        self.created = int(time.time())

    def start(self) -> None:
        self.loop.start()

    def listening(self, addresses: Iterable[str]) -> None:
        """Tell the app where the server listens: on loopback addresses alone, the fault and debug routes are
        open without a token (module docstring)."""
        self._admin_checked = self._token is not None or not loopback_only(addresses)

    @property
    def admin_open(self) -> bool:
        """Whether ``/admin/faults`` and ``/debug/requests`` answer without a token."""
        return not self._admin_checked

    @property
    def ready(self) -> bool:
        return self.loop.alive and self.wall() >= self._ready_at

    # ---------------------------------------------------------------- dispatch
    def handle(self, req: HttpRequest, conn: Connection) -> None:
        try:
            methods = _ROUTES.get(req.path)
            if methods is None:
                raise ApiError(404, f"no route for {req.path}")
            if req.method not in methods:
                raise ApiError(405, f"{req.path} accepts {', '.join(methods)}, not {req.method}")
            if self._admin_checked and req.path in _PROTECTED:
                self._authorize(req)
            if req.path == "/v1/completions":
                self._generate(req, conn, chat=False)
            elif req.path == "/v1/chat/completions":
                self._generate(req, conn, chat=True)
            elif req.path == "/metrics":
                self.loop.refresh_metrics()
                conn.respond(200, self.metrics.render(), CONTENT_TYPE_LATEST)
            elif req.path == "/health":
                if not self.ready:
                    raise ApiError(503, "not ready" if self.loop.alive else "the engine loop has stopped")
                conn.respond(200, b"")
            elif req.path == "/v1/models":
                conn.respond(200, self._models())
            elif req.path == "/version":
                conn.respond(200, json.dumps({"version": f"admit-emulator {__version__}"}).encode())
            elif req.path == "/admin/faults":
                if req.method == "POST":
                    try:
                        self._apply(self.faults.validated_update(parse_json(req.body)))
                    except FaultError as e:
                        raise ApiError(400, str(e), e.param) from None
                conn.respond(200, json.dumps(self.faults.as_dict()).encode())
            else:
                conn.respond(200, self._debug_requests())
        except ApiError as e:
            conn.respond(e.status, e.body(), extra_headers=("WWW-Authenticate: Bearer",) if e.status == 401 else ())
        except Exception:  # a bug must cost one request a 500, not the connection or the server
            log.exception("internal error answering %s %s", req.method, req.path)
            if conn.on_close is None:  # nothing was streamed yet
                conn.respond(500, ApiError(500, "internal error in the emulator").body())

    def _authorize(self, req: HttpRequest) -> None:
        if self._token is None:
            raise ApiError(403, f"{req.path} is off: the emulator listens on a non-loopback address and has no "
                           "admin token; start it with --admin-token-env VAR (a token of 16+ characters in VAR) "
                           "to enable it, or listen on 127.0.0.1")
        value = req.headers.get("authorization", "")
        given = value[7:].strip() if value[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(given.encode("latin-1"), self._token):  # the head was decoded as latin-1
            raise ApiError(401, f"{req.path} needs the admin token (Authorization: Bearer ...)")

    # ---------------------------------------------------------------- generation
    def _generate(self, req: HttpRequest, conn: Connection, chat: bool) -> None:
        if not self.ready:
            raise ApiError(503, "the server is starting up" if self.loop.alive else "the engine loop has stopped")
        params = parse_generation(req.body, chat=chat, served_model=self.model, max_model_len=self.max_model_len)
        f = self.faults
        if f.error_rate > 0 and self.rng.random() < f.error_rate:
            raise ApiError(f.error_status, f"injected fault: HTTP {f.error_status}")
        out, reason = self._output_length(params)
        rid = self.loop.next_id()
        fmt = AnswerFormat(params, rid, int(time.time()), out, reason)
        sink = StreamSink(conn, fmt) if params.stream else WholeSink(conn, fmt)
        try:
            engine_req = self.loop.submit(rid, params.prompt_tokens, out, reason, params.max_tokens, sink)
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        if params.stream:
            conn.start_stream()
        conn.on_close = lambda: self.loop.abort(engine_req)

    def _output_length(self, p: GenParams) -> tuple[int, str]:
        if p.ignore_eos:
            return p.max_tokens, "length"
        c = self.config
        draw = max(1, round(c.output_median * math.exp(c.output_sigma * self.rng.standard_normal())))
        if draw >= p.max_tokens:
            return p.max_tokens, "length"
        return draw, "stop"

    # ---------------------------------------------------------------- faults
    def _apply(self, changes: dict[str, object]) -> None:
        for k, v in changes.items():
            setattr(self.faults, k, v)
        f = self.faults
        if "startup_delay_s" in changes:
            self._ready_at = self.wall() + f.startup_delay_s
        self.loop.refresh_metrics()  # settle the engine on the old clock rate first
        self.clock.set_rate(0.0 if f.paused else 1.0 / f.latency_multiplier)
        self.loop.poke(force=True)

    # ---------------------------------------------------------------- bodies
    def _models(self) -> bytes:
        card = {"id": self.model, "object": "model", "created": self.created, "owned_by": "admit-emulator",
                "root": self.model, "parent": None, "max_model_len": self.max_model_len}  # fmt: skip
        return json.dumps({"object": "list", "data": [card]}).encode()

    def _debug_requests(self) -> bytes:
        fields = ("id", "prompt_tokens", "output_tokens", "preemptions", "arrival", "first_scheduled",
                  "first_token", "finished")  # fmt: skip
        rows = [[getattr(r, k) for k in fields] for r in self.loop.records]
        late = sorted(self.loop.lateness)
        q = {f"p{p}": late[min(len(late) - 1, len(late) * p // 100)] if late else 0.0 for p in (50, 90, 99)}
        body = {"fields": fields, "rows": rows, "in_engine": self.loop.in_engine, "event_lateness_s": q}
        return json.dumps(body).encode()
