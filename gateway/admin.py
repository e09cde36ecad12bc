"""The admin API: read state, set limits and envelopes at run time; every change goes to the audit log.

All routes need ``Authorization: Bearer <admin token>`` (compared in constant time with
``hmac.compare_digest``; without a configured token the admin API answers 403). The caller may name itself
in ``x-admit-actor`` (the control loop does); bodies may carry a ``reason``.

=======  ====================================================  ==============================================
method   path                                                  body / answer
=======  ====================================================  ==============================================
GET      /admin/state                                          every tenant: limits, in flight, queue, envelopes
GET      /admin/tenants/{name}                                 one tenant
GET      /admin/observation                                    the live Observation (gateway/telemetry.py)
GET      /admin/spec                                           the ControlSpec the configuration implies
PUT      /admin/limits                                         ``{"limits": {"a": 3, "b": 5}, "reason": ...}``
PUT      /admin/tenants/{name}/limit                           ``{"limit": 3, "reason": ...}``
PUT      /admin/tenants/{name}/borrow                          ``{"borrow": 2, "reason": ...}``
PUT      /admin/tenants/{name}/envelopes/{target}              envelope fields (``requests_per_s`` ...)
DELETE   /admin/tenants/{name}/envelopes/{target}              remove the envelope
=======  ====================================================  ==============================================

With Redis (several replicas) a limit or envelope changed here is written to Redis and every other replica
takes it within one refresh; envelope state read here is the shared budget (gateway/redis/envelopes.py).

A batch of limits is checked as a whole before any is applied; a limit above its tenant's ``max_limit``
(the ceiling Kueue's quota sets, gateway/kueue.py) refuses the batch with 400 ``above-max-limit``. Each
change (a value that differs from the old one) bumps the configuration version and writes one audit line:
time, version, actor, what, tenant, old, new, reason.
"""

from __future__ import annotations

import hmac
import logging
import re
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from admit.core.wire import observation_json, spec_json
from admit.gateway.asgi import HttpError, Receive, Scope, Send, bearer, header, read_body, send_error, send_json
from admit.gateway.body import BadBody, parse_json
from admit.gateway.config import LIMIT_MAX, EnvelopeConfig
from admit.gateway.guard import SCOPE_CLOSED
from pydantic import ValidationError

if TYPE_CHECKING:
    from admit.gateway.app import Gateway

log = logging.getLogger("admit.gateway.admin")
_ACTOR_OK = re.compile(r"[^A-Za-z0-9_.:@-]")
_MAX_ADMIN_BODY = 64 * 1024


def _int_field(body: dict[str, Any], key: str) -> int:
    v = body.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0 or v > LIMIT_MAX:
        raise HttpError(400, "bad-request", f"'{key}' must be an integer between 0 and {LIMIT_MAX}")
    return v


class AdminApi:
    def __init__(self, gw: Gateway, token: str | None) -> None:
        self.gw = gw
        self._token = token.encode() if token else None
        self.version = 0
        self._saved_version = 0

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> tuple[int, str]:
        """Answer one admin request; returns its status and outcome (the gateway logs the failed ones)."""
        try:
            self._authorize(scope)
            body = await self._body(scope, receive)
            answer = self._route(scope, body)
        except HttpError as err:
            await send_error(send, err)
            return err.status, err.reason
        except ConnectionResetError:
            closed = scope.get(SCOPE_CLOSED)
            return (408, closed) if closed else (499, "client-disconnect")
        except Exception as exc:  # a bug of ours: a JSON 500, and nothing half-applied is left unaudited
            self.gw._bug(exc, scope["path"])
            await send_error(send, HttpError(500, "gateway-error", "the admin API failed on this request"))
            return 500, "gateway-error"
        await send_json(send, 200, answer)
        return 200, "ok"

    def _authorize(self, scope: Scope) -> None:
        if self._token is None:
            raise HttpError(403, "admin-disabled", "no admin token is configured")
        given = bearer(scope) or b""
        if not hmac.compare_digest(given, self._token):
            raise HttpError(401, "unauthorized", "a valid admin token is required (Authorization: Bearer ...)")

    async def _body(self, scope: Scope, receive: Receive) -> dict[str, Any]:
        if scope["method"] not in ("PUT", "POST"):
            return {}
        raw = await read_body(receive, scope, _MAX_ADMIN_BODY)
        try:
            body = parse_json(raw or b"{}")
        except BadBody as exc:
            raise HttpError(400, "bad-request", str(exc)) from None
        if not isinstance(body, dict):
            raise HttpError(400, "bad-request", "the body must be a JSON object")
        return body

    def _actor(self, scope: Scope) -> str:
        raw = header(scope, b"x-admit-actor")
        return _ACTOR_OK.sub("", raw.decode("latin-1"))[:64] if raw else "admin"

    def _tenant(self, name: str) -> int:
        i = self.gw.index.get(name)
        if i is None:
            known = ", ".join(self.gw.names)
            raise HttpError(404, "unknown-tenant", f"no tenant named {name[:64]!r}; tenants: {known}")
        return i

    def _route(self, scope: Scope, body: dict[str, Any]) -> Any:
        method = scope["method"]
        parts = [unquote(p) for p in scope["path"].strip("/").split("/")][1:]  # after "admin"
        if parts == ["state"] and method == "GET":
            return self.state()
        if parts == ["observation"] and method == "GET":
            return self.observation()
        if parts == ["spec"] and method == "GET":
            return spec_json(self.gw.telemetry.spec)
        if parts == ["limits"] and method == "PUT":
            return self._saved(self._set_limits(scope, body))
        if len(parts) >= 2 and parts[0] == "tenants":
            i = self._tenant(parts[1])
            rest = parts[2:]
            if not rest and method == "GET":
                return self.tenant_state(i)
            if rest == ["limit"] and method == "PUT":
                limits = {"limits": {parts[1]: body.get("limit")}, "reason": body.get("reason")}
                return self._saved(self._set_limits(scope, limits))
            if rest == ["borrow"] and method == "PUT":
                return self._saved(self._set_borrow(scope, i, body))
            if len(rest) == 2 and rest[0] == "envelopes" and method in ("PUT", "DELETE"):
                return self._saved(self._envelope(scope, i, rest[1], body, method == "DELETE"))
        raise HttpError(404, "not-found", "no such admin route")

    def _saved(self, answer: dict[str, Any]) -> dict[str, Any]:
        """After a change: the state file (if any) takes it before the answer goes out."""
        if self.version != self._saved_version:
            self._saved_version = self.version
            self.gw.save_state()
        return answer

    # ----------------------------------------------------------------- reads
    def tenant_state(self, i: int) -> dict[str, Any]:
        name = self.gw.names[i]
        st = dict(self.gw.admission.snapshot()["tenants"][name])
        now = self.gw.clock()
        st["envelopes"] = [e.state(now) for e in self.gw.book.envelopes(name)]
        return {"version": self.version, "tenant": name, **st}

    def state(self) -> dict[str, Any]:
        snap = self.gw.admission.snapshot()
        now = self.gw.clock()
        for name, st in snap["tenants"].items():
            st["envelopes"] = [e.state(now) for e in self.gw.book.envelopes(name)]
        return {"version": self.version, "requests_in_progress": self.gw.in_flight_requests, **snap}

    def observation(self) -> dict[str, Any]:
        """The live Observation (gateway/telemetry.py) with the configuration version it was taken under."""
        obs, info = self.gw.telemetry.observation(self.gw.admission.snapshot(), self.gw.token_footprints())
        return {"version": self.version, **observation_json(obs, self.gw.names, info)}

    # ----------------------------------------------------------------- changes
    def _audit(self, scope: Scope, what: str, tenant: str, old: Any, new: Any, reason: Any) -> None:
        rec = {
            "time": round(time.time(), 6),
            "version": self.version,
            "actor": self._actor(scope),
            "what": what,
            "tenant": tenant,
            "old": old,
            "new": new,
            "reason": str(reason)[:500] if reason is not None else None,
        }
        self.gw.audit_log.write(rec)
        log.info("v%d %s %s %s: %s -> %s", self.version, rec["actor"], what, tenant, old, new)

    def _set_limits(self, scope: Scope, body: dict[str, Any]) -> dict[str, Any]:
        limits = body.get("limits")
        if not isinstance(limits, dict) or not limits:
            raise HttpError(400, "bad-request", "'limits' must be an object of tenant name -> limit")
        todo = [(self._tenant(str(name)), _int_field({"limit": v}, "limit")) for name, v in limits.items()]
        over = [f"{self.gw.names[i]} {v} > {ceiling}" for i, v in todo
                if (ceiling := self.gw.cfg.tenants[i].max_limit) is not None and v > ceiling]
        if over:  # the whole batch is refused: nothing is applied
            raise HttpError(400, "above-max-limit", f"limit above the tenant's max_limit (its ceiling, e.g. "
                            f"Kueue's quota): {', '.join(over)}")
        adm = self.gw.admission
        changed = [(i, v) for i, v in todo if adm.limit(i) != v]
        if changed:
            self.version += 1
            for i, v in changed:
                old = adm.set_limit(i, v)
                self._audit(scope, "limit", self.gw.names[i], old, v, body.get("reason"))
        return self.state()

    def _set_borrow(self, scope: Scope, i: int, body: dict[str, Any]) -> dict[str, Any]:
        v = _int_field(body, "borrow")
        adm = self.gw.admission
        set_borrow = getattr(adm, "set_borrow", None)
        if set_borrow is None:
            raise HttpError(400, "bad-request", "this admission backend cannot borrow")
        if adm.snapshot()["tenants"][self.gw.names[i]]["borrow"] != v:
            try:
                self.version += 1
                old = set_borrow(i, v)
            except ValueError as exc:
                self.version -= 1
                raise HttpError(400, "bad-request", str(exc)) from None
            self._audit(scope, "borrow", self.gw.names[i], old, v, body.get("reason"))
        return self.tenant_state(i)

    def _envelope(self, scope: Scope, i: int, target: str, body: dict[str, Any], delete: bool) -> dict[str, Any]:
        name = self.gw.names[i]
        book = self.gw.book
        if delete:
            old = book.remove(name, target)
            if old is None:
                raise HttpError(404, "not-found", f"tenant {name} has no envelope for target {target[:64]!r}")
            self.version += 1
            self._audit(scope, "envelope", name, old.model_dump(), None, body.get("reason"))
            return self.tenant_state(i)
        fields = {k: v for k, v in body.items() if k != "reason"}
        fields["target"] = target
        try:
            cfg = EnvelopeConfig.model_validate(fields)
        except ValidationError as err:
            msg = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'envelope'}: {e['msg']}" for e in err.errors())
            allowed = ", ".join(k for k in EnvelopeConfig.model_fields if k != "target")
            raise HttpError(400, "bad-request", f"{msg} (envelope keys: {allowed})") from None
        self.version += 1
        old = book.configure(name, cfg, self.gw.clock())
        self._audit(scope, "envelope", name, None if old is None else old.model_dump(), cfg.model_dump(),
                    body.get("reason"))
        return self.tenant_state(i)
