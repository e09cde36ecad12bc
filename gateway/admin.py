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

Every write answers what it changed: ``"changed": true`` or ``false`` beside the state (all of it for the
limits, the tenant's for the others). A value equal to the one in force is no change: a PUT that changes
nothing answers ``"changed": false`` and writes no version and no audit line (an envelope PUT with the config
already stored, a batch whose limits all hold already). A batch of limits is checked as a whole before any
is applied; a limit above its tenant's ``max_limit`` or below its ``min_limit`` (the ceiling and the floor
Kueue's quota sets, gateway/kueue.py) refuses the batch with 400 ``above-max-limit`` or ``below-min-limit``,
saying each named tenant's allowed range. A change gets the next *configuration version* (``version``
in every answer; a batch is one change, one version) and each tenant it touches the next version of that
tenant (``version`` per tenant in /admin/state, ``tenant_version`` in /admin/tenants/{name}); it writes one
audit line per value changed: time, version, tenant_version, actor, what, tenant, old, new, reason.

With Redis (several replicas) a write is a compare-and-set in Redis, awaited here: each value is compared
with the one Redis holds (not this replica's copy), so the last write wins on every replica, and the versions
are counted in Redis, one sequence for all replicas (gateway/redis/admission.py); the answer and the audit
line carry Redis's old value and version. Every other replica takes the change within one refresh. While
Redis cannot store it the write is refused, 503 ``admission-unavailable``, and nothing is applied: a change
this replica applied alone would not win on the others. Envelope state read here is the shared budget
(gateway/redis/envelopes.py). In process the same versions live in memory and in the state file
(gateway/state.py).

**Paths** are percent-decoded once, by the server (uvicorn's ``scope["path"]``), and split on ``/``. The
envelope target is the rest of the path after ``envelopes/``, so a model name with ``/`` is given as it is
(``.../envelopes/meta-llama/Llama-3-8B``) or with ``%2F``; a ``%`` left after the one decoding is a literal
``%``, which no target may hold. Targets are checked by ``EnvelopeConfig`` (gateway/config.py), as in the
configuration file and in Redis: a target with anything else than its allowed characters is a 400 that
names them.
"""

from __future__ import annotations

import hmac
import logging
import re
import time
from typing import TYPE_CHECKING, Any

from admit.core.wire import observation_json, spec_json
from admit.gateway.admission import Change, WriteFailed, Written
from admit.gateway.asgi import HttpError, Receive, Scope, Send, bearer, header, read_body, send_error, send_json
from admit.gateway.body import BadBody, parse_json
from admit.gateway.config import EnvelopeConfig, check_count
from admit.gateway.guard import SCOPE_CLOSED
from pydantic import ValidationError

if TYPE_CHECKING:
    from admit.gateway.app import Gateway
    from admit.gateway.state import SavedState

log = logging.getLogger("admit.gateway.admin")
_ACTOR_OK = re.compile(r"[^A-Za-z0-9_.:@-]")
_MAX_ADMIN_BODY = 64 * 1024


def _int_field(body: dict[str, Any], key: str) -> int:
    try:
        return check_count(body.get(key), f"'{key}'")
    except ValueError as exc:
        raise HttpError(400, "bad-request", str(exc)) from None


class AdminApi:
    def __init__(self, gw: Gateway, token: str | None) -> None:
        self.gw = gw
        self._token = token.encode() if token else None
        self._saved_version = 0

    # The versions live in the admission backend (gateway/admission.py: counted there in process, read from
    # and written to Redis with Redis); these give the state file (gateway/app.py, gateway/state.py) its part.
    @property
    def version(self) -> int:
        """The configuration version: one per change made through this API, a batch being one."""
        return self.gw.admission.version

    @version.setter
    def version(self, value: int) -> None:
        self.gw.admission.version = value

    def tenant_versions(self) -> dict[str, int]:
        """Each tenant's version, by name (what the state file keeps)."""
        return dict(zip(self.gw.names, self.gw.admission.versions, strict=True))

    def restore_versions(self, saved: SavedState) -> None:
        """Take the versions a state file kept (start-up, in process); a tenant it does not name stays at 0."""
        adm = self.gw.admission
        adm.version = self._saved_version = saved.version
        for name, v in saved.tenant_versions.items():
            i = self.gw.index.get(name)
            if i is not None:
                adm.versions[i] = v

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> tuple[int, str]:
        """Answer one admin request; returns its status and outcome (the gateway logs the failed ones)."""
        try:
            self._authorize(scope)
            body = await self._body(scope, receive)
            answer = await self._route(scope, body)
        except HttpError as err:
            await send_error(send, err)
            return err.status, err.reason
        except WriteFailed as err:  # nothing was applied (gateway/admission.py)
            await send_error(send, HttpError(err.status, err.reason, err.detail))
            return err.status, err.reason
        except ConnectionResetError:
            closed = scope.get(SCOPE_CLOSED)
            return (408, closed) if closed else (499, "client-disconnect")
        except Exception as exc:  # a bug of ours: a JSON 500, and nothing half-applied is left unaudited
            self.gw._bug(exc, repr(scope["path"][:200]))  # decoded: it may hold any character
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

    async def _route(self, scope: Scope, body: dict[str, Any]) -> Any:
        method = scope["method"]
        # decoded once, by the server (module docstring): no second unquote, so "%250A" stays "%0A"
        parts = scope["path"].strip("/").split("/")[1:]  # after "admin"
        if parts == ["state"] and method == "GET":
            return self.state()
        if parts == ["observation"] and method == "GET":
            return self.observation()
        if parts == ["spec"] and method == "GET":
            return spec_json(self.gw.telemetry.spec)
        if parts == ["limits"] and method == "PUT":
            return self._saved(await self._set_limits(scope, body))
        if len(parts) >= 2 and parts[0] == "tenants":
            i = self._tenant(parts[1])
            rest = parts[2:]
            if not rest and method == "GET":
                return self.tenant_state(i)
            if rest == ["limit"] and method == "PUT":
                limits = {"limits": {parts[1]: body.get("limit")}, "reason": body.get("reason")}
                return self._saved(await self._set_limits(scope, limits))
            if rest == ["borrow"] and method == "PUT":
                return self._saved(self._set_borrow(scope, i, body))
            if len(rest) >= 2 and rest[0] == "envelopes" and method in ("PUT", "DELETE"):
                target = "/".join(rest[1:])  # a model name may hold "/" (module docstring)
                return self._saved(await self._envelope(scope, i, target, body, method == "DELETE"))
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
        return {"version": self.version, "tenant": name, "tenant_version": self.gw.admission.versions[i], **st}

    def state(self) -> dict[str, Any]:
        adm = self.gw.admission
        snap = adm.snapshot()
        now = self.gw.clock()
        for i, (name, st) in enumerate(snap["tenants"].items()):
            st["version"] = adm.versions[i]
            st["envelopes"] = [e.state(now) for e in self.gw.book.envelopes(name)]
        return {"version": self.version, "requests_in_progress": self.gw.in_flight_requests, **snap}

    def observation(self) -> dict[str, Any]:
        """The live Observation (gateway/telemetry.py) with the configuration version it was taken under."""
        obs, info = self.gw.telemetry.observation(self.gw.admission.snapshot(), self.gw.token_footprints())
        return {"version": self.version, **observation_json(obs, self.gw.names, info)}

    # ----------------------------------------------------------------- changes
    def _audit(self, scope: Scope, what: str, version: int, change: Change, reason: Any) -> None:
        rec = {
            "time": round(time.time(), 6),
            "version": version,
            "tenant_version": change.tenant_version,
            "actor": self._actor(scope),
            "what": what,
            "tenant": self.gw.names[change.tenant],
            "old": change.old,
            "new": change.new,
            "reason": str(reason)[:500] if reason is not None else None,
        }
        self.gw.audit_log.write(rec)
        log.info("v%d %s %s %s (its v%d): %s -> %s", version, rec["actor"], what, rec["tenant"],
                 change.tenant_version, change.old, change.new)

    async def _set_limits(self, scope: Scope, body: dict[str, Any]) -> dict[str, Any]:
        limits = body.get("limits")
        if not isinstance(limits, dict) or not limits:
            raise HttpError(400, "bad-request", "'limits' must be an object of tenant name -> limit")
        todo = [(self._tenant(str(name)), _int_field({"limit": v}, "limit")) for name, v in limits.items()]
        tenants = self.gw.cfg.tenants
        over = [f"{self.gw.names[i]} {v} > {ceiling}" for i, v in todo
                if (ceiling := tenants[i].max_limit) is not None and v > ceiling]
        if over:  # the whole batch is refused: nothing is applied
            raise HttpError(400, "above-max-limit", f"limit above the tenant's max_limit (its ceiling, e.g. "
                            f"Kueue's nominal quota plus what it may borrow): {', '.join(over)}; allowed: "
                            f"{self._allowed(todo)}")
        under = [f"{self.gw.names[i]} {v} < {floor}" for i, v in todo
                 if (floor := tenants[i].min_limit) is not None and v < floor]
        if under:
            raise HttpError(400, "below-min-limit", f"limit below the tenant's min_limit (its guaranteed share, "
                            f"e.g. Kueue's nominal quota): {', '.join(under)}; allowed: {self._allowed(todo)}")
        written = await self.gw.admission.write_limits(todo)
        for change in written.changes:
            self._audit(scope, "limit", written.version, change, body.get("reason"))
        return {**self.state(), "changed": bool(written.changes)}

    def _allowed(self, todo: list[tuple[int, int]]) -> str:
        """Each named tenant's allowed limits, for a refusal: ``chat 8..14``, ``batch >= 4``."""
        out = []
        for i in dict.fromkeys(i for i, _ in todo):
            t = self.gw.cfg.tenants[i]
            lo, hi = t.min_limit or 0, t.max_limit
            out.append(f"{t.name} {lo}..{hi}" if hi is not None else f"{t.name} >= {lo}")
        return ", ".join(out)

    def _set_borrow(self, scope: Scope, i: int, body: dict[str, Any]) -> dict[str, Any]:
        v = _int_field(body, "borrow")
        adm = self.gw.admission
        set_borrow = getattr(adm, "set_borrow", None)
        if set_borrow is None:
            raise HttpError(400, "bad-request", "this admission backend cannot borrow")
        changed = adm.snapshot()["tenants"][self.gw.names[i]]["borrow"] != v
        if changed:
            try:
                old = set_borrow(i, v)
            except ValueError as exc:
                raise HttpError(400, "bad-request", str(exc)) from None
            version = adm.next_version([i])
            self._audit(scope, "borrow", version, Change(i, old, v, adm.versions[i]), body.get("reason"))
        return {**self.tenant_state(i), "changed": changed}

    async def _envelope(self, scope: Scope, i: int, target: str, body: dict[str, Any],
                        delete: bool) -> dict[str, Any]:
        cfg = None if delete else self._envelope_config(target, body)
        shared = self.gw.shared_book
        written = await shared.write(i, target, cfg) if shared is not None else self._write_envelope(i, target, cfg)
        if delete and not written.changes:
            raise HttpError(404, "not-found", f"tenant {self.gw.names[i]} has no envelope for target "
                            f"{target[:64]!r}")
        for change in written.changes:
            old, new = change.old, change.new
            self._audit(scope, "envelope", written.version,
                        Change(i, None if old is None else old.model_dump(), None if new is None else new.model_dump(),
                               change.tenant_version), body.get("reason"))
        return {**self.tenant_state(i), "changed": bool(written.changes)}

    def _envelope_config(self, target: str, body: dict[str, Any]) -> EnvelopeConfig:
        fields = {k: v for k, v in body.items() if k != "reason"}
        fields["target"] = target
        try:
            return EnvelopeConfig.model_validate(fields)
        except ValidationError as err:
            msg = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'envelope'}: {e['msg']}" for e in err.errors())
            allowed = ", ".join(k for k in EnvelopeConfig.model_fields if k != "target")
            raise HttpError(400, "bad-request", f"{msg} (envelope keys: {allowed})") from None

    def _write_envelope(self, i: int, target: str, cfg: EnvelopeConfig | None) -> Written:
        """In process: compared with the envelope in force, changed at once (nothing awaits in between)."""
        name, book, adm = self.gw.names[i], self.gw.book, self.gw.admission
        old = next((e.cfg for e in book.envelopes(name) if e.cfg.target == target), None)
        if old == cfg:
            return Written(adm.version, [])
        if cfg is None:
            book.remove(name, target)
        else:
            book.configure(name, cfg, self.gw.clock())
        version = adm.next_version([i])
        return Written(version, [Change(i, old, cfg, adm.versions[i])])
