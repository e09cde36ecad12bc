"""Admission state shared by several gateway replicas on Redis: concurrency leases with expiry.

(The rate envelopes shared the same way, gateway/redis/envelopes.py, ride on this backend's connection and
its up/down state: they are refreshed with the leases and written back before it counts as up again.)

Every admitted request holds a *lease* in Redis (gateway/redis/scripts.py): a member of its tenant's sorted
set whose score is an expiry in server time. Taking one is a single Lua script that drops expired leases,
reads the tenant's shared limit and adds the lease only below it, so the replicas together never pass the
limit. A request with rate envelopes takes its first try in the same script as its envelope charge
(``CHARGE_ACQUIRE``, gateway/redis/envelopes.py ``charge_and_acquire``): one round trip, not two.
A replica renews the leases of its running requests every ``lease_ttl_s / 3``; a replica that
crashes stops renewing and its slots come back ``lease_ttl_s`` later.

**Limits and admin writes.** The limits live in one hash (``<prefix>:limits``), seeded from a replica's
file only where a tenant has none. A change through the admin API is one script (WRITE_LIMITS,
gateway/redis/scripts.py) that compares each limit with the one *Redis* holds, sets those that differ and
numbers the change in Redis (the configuration version ``<prefix>:version``, one per change; each tenant's
version in ``<prefix>:tenant_versions``), so the last write wins whichever replica made it, a write equal to
what Redis holds changes nothing, and all replicas number versions in one sequence. The admin API awaits it
and answers (and audits) with Redis's old value and version; while Redis is unreachable it refuses the change
(``WriteFailed``, 503) rather than apply what may never win. Every other replica takes the change at its next
refresh (READ, every ``max(poll_s, 0.2)`` s), and takes a tenant's values only when their version is at
least the one it knows: a read that was on its way while a newer write landed never undoes that write.

**Values read from Redis are checked** like admin input (gateway/config.py ``parse_count``): a limit or version
that is not an integer in its range ("nan", "1e400", "-3", "2.5", "abc") is refused, the tenant keeps its last
good value, and the refusal is counted (``bad_values`` in /admin/state's redis section,
``admit_gateway_redis_bad_values_total{kind}``) and logged once per (key, value). ACQUIRE never uses such a
limit either: it uses the replica's last good one, which it passes anyway as the seed, and says so.

**Queueing** is per replica: each replica keeps the tenant's queues (``max_queue``, ``queue_timeout_s``) for
its own clients, in the in-process gateway's core (core/admission.py ``AdmissionCore``, its slots left to
Redis): two FIFO queues, the tenant's in-contract requests and its excess (``acquire(..., in_contract=)``,
gateway/redis/contracts.py classifies them), and a slot goes to the oldest in-contract request, to the oldest
excess one only when no in-contract one waits here. The next in line retries when a slot of this replica
frees, when a limit changes, and every ``poll_s`` (a slot freed by another replica). Fairness across
replicas is therefore approximate: whichever replica's head asks first after a slot frees gets it (a
replica's in-contract request goes before that replica's excess, not before another replica's), and a
tenant may have up to ``replicas x max_queue`` requests queued. The limit itself is exact.

**When Redis is unreachable** (a command fails or times out after ``timeout_s``) the backend marks the
state *down*, counts it, and probes every ``poll_s`` until a PING answers:

* ``failure_mode: closed`` — new requests are answered 503 ``admission-unavailable`` with Retry-After;
  requests already queued keep waiting (their TTL still applies) and are served when Redis is back.
* ``failure_mode: open`` — each replica enforces every tenant's limit *on its own* (its local count of
  requests in flight), so the backend sees at most ``replicas x limit`` per tenant, never an unbounded flood.

Releases that fail are kept and sent again when Redis answers; then every lease still running here
(including those admitted open during the outage) is written back, so the shared count is right again and
the limit holds from there on. No slot leaks either way: a lease is released by its id, idempotently.

**A script error is not an outage.** Only a failure to reach Redis marks it down: a connection error, a
timeout, a server that is loading (``BusyLoadingError``), read-only, out of memory or busy with another
script — every call would fail the same way. A script that the server ran and that failed on the keys or
arguments of *this* call (a ``ResponseError`` such as ``WRONGTYPE``, or a Lua error on a stored value that
is not what the scripts write) is a *script error*: counted (``script_errors`` in /admin/state's redis
section, ``admit_gateway_redis_script_errors_total{script}``), logged once per (script, message), and it
affects only the call that hit it; Redis stays up for every other tenant, and the aggregate reads (all
tenants' leases, all envelopes' buckets) fall back to one call per tenant or envelope, so one broken key
does not blind the others. (``NoScriptError`` is not one: redis-py reloads the script.) The request that hit
it gets the failure mode's answer for itself alone:

* ``closed`` — **500** ``admission-error``, without Retry-After. Not the outage's 503: nothing is
  unavailable, and waiting does not help (the same state fails the same way until an operator fixes it);
  a 500 is what it is, a fault on the gateway's side, and it keeps the outage's 503 and its
  ``admission-unavailable`` counters meaning "Redis is unreachable". A request already queued gets the same
  answer when its turn comes, instead of waiting out its TTL.
* ``open`` — the local decision, as during an outage (the local limit, the envelope mirror).

A lease whose script failed was not granted (the lease's ZADD is its script's last write), so it is only
dropped here; a release or renewal that fails so is dropped too (the lease's TTL bounds what that leaves).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import redis.asyncio as aioredis
from admit.core.admission import AdmissionCore, Offer, QueueConfig
from admit.gateway.admission import ADMISSION_UNAVAILABLE, Change, Deferred, Lease, TenantSlots, WriteFailed, Written
from admit.gateway.config import LIMIT_MAX, VERSION_MAX, RedisConfig, TenantConfig, parse_count
from admit.gateway.redis.scripts import ACQUIRE, READ, RELEASE, RENEW, WRITE_LIMITS
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import (
    AskError,
    ClusterError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)

log = logging.getLogger("admit.gateway.redis")
_ERRORS = (RedisError, OSError, asyncio.TimeoutError)
ADMISSION_ERROR = "admission-error"
# error replies that are the server's state, not the call's: every call would get them (redis-py maps these
# to their own classes; MISCONF, BUSY and the rest come as a plain ResponseError with the code first)
_SERVER_STATE = (NoScriptError, OutOfMemoryError, ReadOnlyError, NoPermissionError, TryAgainError, AskError,
                 ClusterError)
_SERVER_STATE_CODES = ("MISCONF ", "BUSY ", "NOREPLICAS ")
_LOGGED_MAX = 256  # distinct (script, message) pairs logged; past that script errors are only counted
T = TypeVar("T")


def is_script_error(exc: BaseException) -> bool:
    """Redis answered, and the script (or a command it ran) failed on this call's keys or arguments: a
    *script error*, not a sign that Redis is unreachable (module docstring)."""
    return (
        isinstance(exc, ResponseError)
        and not isinstance(exc, _SERVER_STATE)
        and not str(exc).startswith(_SERVER_STATE_CODES)
    )


class AdmissionError(Deferred):
    """A request whose admission could not be decided because a Redis script failed on its tenant's state,
    with ``failure_mode: closed``: 500 ``admission-error`` and no Retry-After (module docstring)."""

    def __init__(self, detail: str) -> None:
        super().__init__(ADMISSION_ERROR, 0.0, detail, status=500)
        self.retry_after_s = None  # type: ignore[assignment]  # no Retry-After: waiting does not fix it


@dataclass(slots=True)
class RedisLease(Lease):
    id: str = ""


@dataclass
class RedisStats:
    """Counters of the shared-state machinery (exported as metrics and in /admin/state)."""

    errors: int = 0  # Redis commands that failed or timed out
    outages: int = 0  # up -> down transitions
    recoveries: int = 0  # down -> up transitions
    leases_expired: int = 0  # leases dropped by Redis because nobody renewed them (a replica died or stalled)
    leases_restored: int = 0  # leases of running requests written back after an outage or expiry
    releases_retried: int = 0  # releases that failed and were sent again after Redis returned
    script_errors: int = 0  # calls that Redis answered with a script error (not outages; module docstring)
    script_errors_by: dict[str, int] = field(default_factory=dict)  # per script (or command)
    bad_values: int = 0  # values read from Redis that failed their check (module docstring), each time read
    bad_values_by: dict[str, int] = field(default_factory=dict)  # per kind: limit, version, envelope
    fail_open_admitted: list[int] = field(default_factory=list)  # per tenant
    fail_closed_deferred: list[int] = field(default_factory=list)  # per tenant


class Attached(Protocol):
    """Other shared state riding on this backend's connection and up/down state (the rate envelopes)."""

    async def refresh(self) -> None: ...

    async def recover(self) -> None: ...

    def stats(self) -> dict[str, Any]: ...


class RedisAdmission(TenantSlots):
    ERRORS = _ERRORS  # what a Redis call may raise: unreachable (mark_down) or a script error (script_error)

    def __init__(self, tenants: Sequence[TenantConfig], cfg: RedisConfig, replica: str | None = None) -> None:
        super().__init__(tenants)
        self._loop = asyncio.get_running_loop()
        self.cfg = cfg
        self.replica = replica or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.admitted = [0] * self.n_tenants
        self.local = [0] * self.n_tenants  # leases this replica holds (shared or open)
        self.shared = [0] * self.n_tenants  # leases all replicas hold, as last read from Redis
        # the queues only (module docstring): limit 0, so the core never admits; Redis grants the slots
        self.core = AdmissionCore([QueueConfig(limit=0, max_queue=t.max_queue, queue_timeout_s=t.queue_timeout_s)
                                   for t in tenants], time.monotonic)
        self.live: dict[str, int] = {}  # lease id -> tenant, every lease of this replica not yet released
        self.pending_release: list[tuple[int, str]] = []
        self.dirty_limits: set[int] = set()
        self.up = True
        self.stats = RedisStats(fail_open_admitted=[0] * self.n_tenants, fail_closed_deferred=[0] * self.n_tenants)
        self._ids = itertools.count(1)
        self._ttl_ms = int(cfg.lease_ttl_s * 1000)
        p = cfg.prefix
        self._zkeys = [f"{p}:leases:{name}" for name in self.names]
        self._limits_key = f"{p}:limits"
        self.versions_key = f"{p}:tenant_versions"  # tenant -> its version (module docstring)
        self.version_key = f"{p}:version"  # the configuration version
        self.r = aioredis.Redis.from_url(
            cfg.url, socket_timeout=cfg.timeout_s, socket_connect_timeout=cfg.timeout_s,
            retry=Retry(NoBackoff(), 0), retry_on_timeout=False, decode_responses=True,
        )
        self._acquire = self.r.register_script(ACQUIRE)
        self._release = self.r.register_script(RELEASE)
        self._renew = self.r.register_script(RENEW)
        self._write_limits = self.r.register_script(WRITE_LIMITS)
        self._read = self.r.register_script(READ)
        self._kick = [asyncio.Event() for _ in tenants]
        self._tasks: list[asyncio.Task[None]] = []
        self._bg: set[asyncio.Task[Any]] = set()
        self.attached: list[Attached] = []  # refreshed with the leases, recovered before they count as up
        self._logged: set[tuple[str, str]] = set()  # (script, message) of the script errors logged so far
        self._bad_logged: set[tuple[str, str]] = set()  # (where, value) of the bad values logged so far

    # ----------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Seed the shared limits (never overwriting another replica's) and start the background tasks."""
        try:
            for name, lim in zip(self.names, self.nominal, strict=True):
                await self.r.hsetnx(self._limits_key, name, lim)
            await self._refresh()
        except _ERRORS as exc:
            self.failed(exc, "start")
        self._tasks = [asyncio.ensure_future(self._pump(t)) for t in range(self.n_tenants)]
        self._tasks.append(asyncio.ensure_future(self._maintain()))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.live and self.up:  # a clean stop hands its slots back at once instead of after the TTL
            with contextlib.suppress(*_ERRORS):
                for lid, t in list(self.live.items()):
                    await self._release(keys=[self._zkeys[t]], args=[lid])
        with contextlib.suppress(*_ERRORS):
            await self.r.aclose()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    def mark_down(self, exc: BaseException) -> None:
        self.stats.errors += 1
        if self.up:
            self.up = False
            self.stats.outages += 1
            log.warning("redis unreachable (%s): failing %s", type(exc).__name__, self.cfg.failure_mode)

    def script_error(self, script: str, exc: BaseException, where: str = "") -> None:
        """Count a script error (``is_script_error``) and log it once per (script, message); Redis stays up."""
        s = self.stats
        s.script_errors += 1
        s.script_errors_by[script] = s.script_errors_by.get(script, 0) + 1
        key = (script, str(exc))
        if key not in self._logged and len(self._logged) < _LOGGED_MAX:
            self._logged.add(key)
            log.warning("redis script %s failed%s (a script error, not an outage: only this call is affected; "
                        "counted, logged once): %s", script, f" for {where}" if where else "", exc)

    async def read_each(self, script: str, read: Callable[[list[T]], Awaitable[None]], items: list[T],
                        where: Callable[[T], str]) -> None:
        """``read(items)`` in one call; after a script error (counted), ``read([item])`` for each item, so that one
        item's broken key leaves the others fresh (its own error counted too, ``where`` naming it). Anything
        that is not a script error is raised."""
        try:
            await read(items)
        except ResponseError as exc:
            if not is_script_error(exc):
                raise
            self.script_error(script, exc)
            for item in items:
                try:
                    await read([item])
                except ResponseError as exc_one:
                    if not is_script_error(exc_one):
                        raise
                    self.script_error(script, exc_one, where(item))

    def failed(self, exc: BaseException, script: str, where: str = "") -> bool:
        """Account for a failed Redis call: a script error is counted (True); anything else marks Redis down
        (False)."""
        if is_script_error(exc):
            self.script_error(script, exc, where)
            return True
        self.mark_down(exc)
        return False

    def write_failed(self, exc: BaseException, script: str) -> WriteFailed:
        """An admin write whose script failed (``failed`` has counted it): 500 for a script error, else 503."""
        if self.failed(exc, script):
            return WriteFailed(500, ADMISSION_ERROR, f"the change failed in Redis ({script}: {exc}); nothing was "
                               "applied")
        return WriteFailed(503, ADMISSION_UNAVAILABLE, "Redis did not answer: nothing was applied on this "
                           "replica (if Redis stored the change before it stopped answering, every replica takes "
                           "it at its next refresh); send it again when Redis is back: the same change again "
                           "changes nothing")

    def unavailable(self) -> WriteFailed:
        """An admin write while Redis is known to be unreachable: refused at once."""
        return WriteFailed(503, ADMISSION_UNAVAILABLE, "Redis is unreachable: nothing was applied (a change that "
                           "cannot be stored in Redis cannot win on every replica); send it again when Redis is "
                           "back")

    def bad_value(self, kind: str, where: str, raw: str, why: str) -> None:
        """A value read from Redis at ``where`` (key and field) that failed its check: refused (the replica keeps
        its last good value), counted, and logged once per (where, value)."""
        s = self.stats
        s.bad_values += 1
        s.bad_values_by[kind] = s.bad_values_by.get(kind, 0) + 1
        key = (where, raw[:100])
        if key not in self._bad_logged and len(self._bad_logged) < _LOGGED_MAX:
            self._bad_logged.add(key)
            log.warning("redis holds a bad %s at %r (%s): refused, the last good value stays (counted; logged "
                        "once per value)", kind, where, why)

    def checked(self, raw: str, kind: str, where: str) -> int | None:
        """A limit or version (``kind``) read from Redis as text: the number, or None when it is not one (then
        refused, counted and logged: ``bad_value``)."""
        try:
            return parse_count(raw, kind, LIMIT_MAX if kind == "limit" else VERSION_MAX)
        except ValueError as exc:
            self.bad_value(kind, where, raw, str(exc))
            return None

    def refused(self, bad: Sequence[str]) -> None:
        """The values a write script refused, ``[kind, where, value, ...]``: counted and logged here."""
        for i in range(0, len(bad) - 2, 3):
            self.checked(bad[i + 2], bad[i], bad[i + 1])

    def admission_error(self, t: int, fresh: bool, what: str) -> RedisLease | None:
        """The failure mode's answer to one request whose script failed: closed raises AdmissionError (500),
        open decides locally, as during an outage (``_fallback``)."""
        if self.cfg.failure_mode == "closed":
            raise AdmissionError(f"{what} failed in Redis for tenant {self.names[t]} (a script error)")
        return self._fallback(t, fresh)

    # ----------------------------------------------------------------- leases
    async def acquire(self, tenant: int, asked: bool = False, in_contract: bool = True) -> Lease:
        """A lease for ``tenant``: at once if a slot is free and nobody is queued here, else from its queue
        (``in_contract``: the in-contract one, served first; else the excess one).

        ``asked``: the caller has just tried for a slot itself and found none (the envelope charge and the
        lease in one script, gateway/redis/envelopes.py ``charge_and_acquire``), so the request goes straight
        to the queue, as after a failed first try here, without asking Redis a second time.
        """
        if not asked and not self.core.queue_depth(tenant):
            lease = await self._try(tenant, fresh=True)
            if lease is not None:
                return lease
        fut: asyncio.Future[RedisLease] = self._loop.create_future()
        if self.core.offer(tenant, fut, in_contract) is Offer.REJECTED:
            raise self._full(tenant)
        self._kick[tenant].set()
        try:
            done, _ = await asyncio.wait((fut,), timeout=self.ttl[tenant])
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release(fut.result())  # a slot arrived just as the client left: give it back
            else:
                fut.cancel()
                self.cancelled[tenant] += 1
            self.core.cancel(tenant, fut)
            raise
        if not done:
            fut.cancel()
            self.core.cancel(tenant, fut)
            raise self._expired(tenant)
        return fut.result()  # its waited_s is the core's (the request record's clock, time.monotonic)

    async def _try(self, t: int, fresh: bool = False) -> RedisLease | None:
        """One attempt at a slot: a shared lease, or the fallback of the failure mode while Redis is down."""
        if not self.up:
            return self._fallback(t, fresh)
        lid = self.reserve(t)
        keys, args = self.acquire_args(t, lid)
        try:
            got = await self._acquire(keys=keys, args=args)
        except asyncio.CancelledError:
            self.forget(t, lid)
            raise
        except _ERRORS as exc:
            if is_script_error(exc):  # it granted no lease (module docstring): nothing to release
                self.live.pop(lid, None)
                self.script_error("ACQUIRE", exc, f"tenant {self.names[t]}")
                return self.admission_error(t, fresh, "the lease")
            self.forget(t, lid)
            self.mark_down(exc)
            return self._fallback(t, fresh)
        return self.acquired(t, lid, got)

    # The pieces of one attempt, also used by the envelopes' combined script (CHARGE_ACQUIRE), which takes a
    # lease on the same terms as ACQUIRE: reserve an id, send these keys and args, apply the answer.
    def reserve(self, t: int) -> str:
        """A new lease id, entered in ``live`` before the script that may grant it runs: a lease granted to a
        caller that left while the script ran is then still found (``forget``, or ``close``) and released."""
        lid = f"{self.replica}:{next(self._ids)}"
        self.live[lid] = t
        return lid

    def acquire_args(self, t: int, lid: str) -> tuple[list[str], list[Any]]:
        """ACQUIRE's keys and args for lease ``lid`` of tenant ``t``."""
        return [self._zkeys[t], self._limits_key], [self.names[t], lid, self._ttl_ms, self.nominal[t]]

    def acquired(self, t: int, lid: str, got: Sequence[Any]) -> RedisLease | None:
        """Apply ACQUIRE's answer ``{granted, holders, limit used, expired[, refused]}``: the lease, or None (no
        slot free). The limit it used is not taken as this replica's: READ brings it with its version."""
        self.stats.leases_expired += int(got[3])
        self.shared[t] = int(got[1])
        if len(got) > 4:  # the stored limit is not one: the script used this replica's (module docstring)
            self.checked(got[4], "limit", f"{self._limits_key} {self.names[t]}")
        if not int(got[0]):
            self.live.pop(lid, None)
            return None
        return self._grant(t, lid)

    def _grant(self, t: int, lid: str) -> RedisLease:
        self.local[t] += 1
        self.admitted[t] += 1
        return RedisLease(t, time.monotonic(), 0.0, id=lid)

    def _fallback(self, t: int, fresh: bool) -> RedisLease | None:
        if self.cfg.failure_mode == "closed":
            if not fresh:
                return None  # queued requests wait for Redis (or their TTL)
            self.stats.fail_closed_deferred[t] += 1
            raise Deferred(ADMISSION_UNAVAILABLE, self.cfg.retry_after_s, "the shared admission state is unreachable",
                           status=503)
        if self.local[t] >= self.nominal[t]:
            return None
        lid = self.reserve(t)
        self.stats.fail_open_admitted[t] += 1
        return self._grant(t, lid)

    def forget(self, t: int, lid: str) -> None:
        """A lease whose script may or may not have run: drop it here and make sure Redis drops it too (at
        once, or when Redis answers again if it is known to be down already)."""
        self._drop_live(t, lid)

    def release(self, lease: Lease) -> None:
        if not self._first_release(lease, time.monotonic()):
            return
        t = lease.tenant
        self.local[t] -= 1
        if self._drop_live(t, getattr(lease, "id", "")) and not self.up:
            self._kick[t].set()  # fail-open counts locally: the freed local slot is usable at once

    def _drop_live(self, t: int, lid: str) -> bool:
        """Stop tracking lease ``lid`` and release it in Redis now, or once Redis is back; False if untracked."""
        if self.live.pop(lid, None) is None:
            return False
        if self.up:
            self._spawn(self._release_remote(t, lid))
        else:
            self.pending_release.append((t, lid))
        return True

    async def _release_remote(self, t: int, lid: str) -> None:
        try:
            await self._release(keys=[self._zkeys[t]], args=[lid])
        except _ERRORS as exc:
            if not self.failed(exc, "RELEASE", f"tenant {self.names[t]}"):
                self.pending_release.append((t, lid))  # a script error drops it: sending it again fails again
        else:
            self.shared[t] = max(0, self.shared[t] - 1)
        self._kick[t].set()

    # ----------------------------------------------------------------- queue pump
    async def _pump(self, t: int) -> None:
        """Hand slots to this replica's queued requests of tenant ``t``: the next in line of the core (the
        oldest in-contract one, else the oldest excess one) when the slot is granted, so an in-contract
        request that arrived while Redis was asked goes first."""
        core, kick = self.core, self._kick[t]
        while True:
            if not core.queue_depth(t):
                await kick.wait()
            else:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(kick.wait(), self.cfg.poll_s)
            kick.clear()
            while core.queue_depth(t):
                try:
                    lease = await self._try(t)
                except AdmissionError as err:  # the next in line's answer (closed); the others try for themselves
                    got = core.take(t)
                    if got is not None and not got[0].done():
                        got[0].set_exception(err)
                    continue
                except Deferred:
                    break
                if lease is None:
                    break
                self._hand(t, lease)
            for i, fut, _ in core.expire():  # found late by take(): answered as their own timeouts would
                if not fut.done():
                    fut.set_exception(self._expired(i))

    def _hand(self, t: int, lease: RedisLease) -> None:
        """Give a granted slot to the next in line still waiting, or back when nobody waits any more."""
        while (got := self.core.take(t)) is not None:
            fut, waited = got
            if not fut.done():
                lease.waited_s = waited
                fut.set_result(lease)
                return
        self.release(lease)

    # ----------------------------------------------------------------- limits
    def set_limit(self, tenant: int, limit: int) -> int:
        """Set a limit here at once and write it to Redis in the background (kept and written again while Redis
        is down). The admin API does not use this: it awaits ``write_limits``."""
        old = self._set_nominal(tenant, limit)
        self.dirty_limits.add(tenant)
        self._spawn(self._push_limit(tenant))
        self._kick[tenant].set()
        return old

    async def _push_limit(self, t: int) -> None:
        if t not in self.dirty_limits:
            return  # an admin write of this tenant came first
        value = self.nominal[t]
        try:
            written, tvs = await self._write(((t, value),))
        except _ERRORS as exc:
            # stays dirty (in force here): written again when Redis is back, or with the next change
            self.failed(exc, "WRITE_LIMITS", f"tenant {self.names[t]}")
            return
        if self.nominal[t] == value:
            self.dirty_limits.discard(t)
            self.take_limit(t, value, tvs[0])
        self._kick[t].set()

    async def write_limits(self, limits: Sequence[tuple[int, int]]) -> Written:
        """The admin API's write: compare-and-set in Redis, one script call (module docstring). Taken here at
        once; raises WriteFailed (nothing applied here) when Redis does not answer or the script fails."""
        if not self.up:
            raise self.unavailable()
        try:
            written, tvs = await self._write(limits)
        except _ERRORS as exc:
            raise self.write_failed(exc, "WRITE_LIMITS") from None
        for (t, v), tv in zip(limits, tvs, strict=True):
            self.dirty_limits.discard(t)  # Redis holds this write's value now, whatever this replica had
            self.take_limit(t, v, tv)
        return written

    async def _write(self, limits: Sequence[tuple[int, int]]) -> tuple[Written, list[int]]:
        """WRITE_LIMITS for ``(tenant, limit)`` pairs: what it changed, and each tenant's version after it."""
        args: list[Any] = [self.version]
        for t, v in limits:
            args += [self.names[t], v, self.versions[t]]
        got = await self._write_limits(keys=[self._limits_key, self.versions_key, self.version_key], args=args)
        self.refused(got[-1])
        version = int(got[0])  # numbers the script wrote itself
        self.take_version(version)
        changes, tvs = [], []
        for (t, v), (changed, old, tv) in zip(limits, got[1:-1], strict=True):
            tvs.append(int(tv))
            if int(changed):
                changes.append(Change(t, int(old) if old else None, v, int(tv)))
        return Written(version, changes), tvs

    def take_limit(self, t: int, limit: int, tv: int) -> None:
        """A limit Redis holds at tenant version ``tv`` (read, or just written): taken unless this replica knows
        a newer version of the tenant (the read was on its way while a newer write landed) or has a change of
        its own not yet written (``dirty_limits``)."""
        if tv < self.versions[t] or t in self.dirty_limits:
            return
        self.versions[t] = tv
        if limit != self.nominal[t]:
            self.nominal[t] = limit
            self._kick[t].set()

    def take_version(self, version: int) -> None:
        """The configuration version Redis holds: versions only grow (a stale read, or a server that lost its
        data, never takes this replica's back)."""
        if version > self.version:
            self.version = version

    # ----------------------------------------------------------------- upkeep
    async def _maintain(self) -> None:
        """Probe while down; while up renew leases every ttl/3 and refresh the shared view every poll."""
        renew_every = self.cfg.lease_ttl_s / 3
        last_renew = self._loop.time()
        while True:
            await asyncio.sleep(self.cfg.poll_s if not self.up else max(self.cfg.poll_s, 0.2))
            try:
                if not self.up:
                    await self.r.connection_pool.disconnect()  # pooled sockets to the dead server are stale
                    await self.r.ping()
                    await self._recover()
                    last_renew = self._loop.time()
                if self._loop.time() - last_renew >= renew_every:
                    await self._renew_all()
                    last_renew = self._loop.time()
                await self._refresh()
                for other in self.attached:
                    await other.refresh()
            except _ERRORS as exc:
                self.failed(exc, "upkeep")  # a script error here is one of the shared keys (limits, configs)

    async def _recover(self) -> None:
        pending, self.pending_release = self.pending_release, []
        resent = 0
        for i, (t, lid) in enumerate(pending):
            try:
                await self._release(keys=[self._zkeys[t]], args=[lid])
            except _ERRORS as exc:
                if is_script_error(exc):  # dropped (module docstring); recovery goes on
                    self.script_error("RELEASE", exc, f"tenant {self.names[t]}")
                    continue
                self.pending_release.extend(pending[i:])
                raise
            self.stats.releases_retried += 1
            resent += 1
        for t in list(self.dirty_limits):
            await self._push_limit(t)
        for other in self.attached:
            await other.recover()
        written: set[str] = set()
        while set(self.live) - written:  # leases granted open while we were writing: write those too
            written = set(self.live)
            await self._renew_all()
        self.up = True  # no await since the last write: every running lease is in Redis from here on
        for t, lid in self.pending_release:  # released while we were busy above
            self._spawn(self._release_remote(t, lid))
        self.pending_release = []
        self.stats.recoveries += 1
        log.warning("redis reachable again: %d releases resent, leases renewed", resent)
        for k in self._kick:
            k.set()

    async def _renew_all(self) -> None:
        by_tenant: dict[int, list[str]] = {}
        for lid, t in list(self.live.items()):
            by_tenant.setdefault(t, []).append(lid)
        for t, ids in by_tenant.items():
            try:
                added = await self._renew(keys=[self._zkeys[t]], args=[self._ttl_ms, *ids])
            except ResponseError as exc:
                if not is_script_error(exc):
                    raise
                self.script_error("RENEW", exc, f"tenant {self.names[t]}")  # the other tenants' go on
                continue
            self.stats.leases_restored += int(added)

    async def _refresh(self) -> None:
        """Read every tenant's shared holders, limit and version, in one call; after a script error, one call
        per tenant, so that one tenant's broken key leaves the others' view fresh."""
        shared_keys = [self._limits_key, self.versions_key, self.version_key]
        try:
            got = await self._read(keys=[*self._zkeys, *shared_keys], args=self.names)
        except ResponseError as exc:
            if not is_script_error(exc):
                raise
            self.script_error("READ", exc)
            for t in range(self.n_tenants):
                try:
                    one = await self._read(keys=[self._zkeys[t], *shared_keys], args=[self.names[t]])
                except ResponseError as exc_t:
                    if not is_script_error(exc_t):
                        raise
                    self.script_error("READ", exc_t, f"tenant {self.names[t]}")
                    continue
                self._apply_read([t], one)
            return
        self._apply_read(range(self.n_tenants), got)

    def _apply_read(self, tenants: Sequence[int], got: Sequence[Any]) -> None:
        """READ's answer ``{expired dropped, configuration version, then per tenant: holders, limit, tenant
        version}`` for ``tenants``, in that order; stored values come as text and are checked here."""
        self.stats.leases_expired += int(got[0])
        if got[1]:
            version = self.checked(got[1], "version", self.version_key)
            if version is not None:
                self.take_version(version)
        for i, t in enumerate(tenants):
            holders, raw_limit, raw_tv = got[2 + 3 * i : 5 + 3 * i]
            self.shared[t] = int(holders)
            name = self.names[t]
            tv = self.checked(raw_tv, "version", f"{self.versions_key} {name}") if raw_tv else 0
            if not raw_limit:
                continue  # none stored (a server that lost its data): ACQUIRE seeds this replica's
            limit = self.checked(raw_limit, "limit", f"{self._limits_key} {name}")
            if tv is not None and limit is not None:
                self.take_limit(t, limit, tv)

    # ----------------------------------------------------------------- state
    def _queue_len(self, tenant: int) -> int:
        return self.core.queue_depth(tenant)

    def in_flight(self, tenant: int) -> int:
        return self.local[tenant]

    def queue_depth(self, tenant: int) -> int:
        return self.core.queue_depth(tenant)

    def snapshot(self) -> dict[str, Any]:
        tenants = {}
        for i, name in enumerate(self.names):
            tenants[name] = {
                "limit": self.nominal[i],
                "effective_limit": self.nominal[i],
                "borrow": 0,
                "priority": self.priority[i],
                "in_flight": self.local[i],
                "shared_in_flight": self.shared[i],
                "queue_depth": self.queue_depth(i),
                "max_queue": self.max_queue[i],
                "queue_timeout_s": self.ttl[i],
                "admitted": self.admitted[i],
                "queue_full": self.queue_full[i],
                "ttl_expired": self.ttl_expired[i],
                "cancelled_in_queue": self.cancelled[i],
                "fail_open_admitted": self.stats.fail_open_admitted[i],
                "fail_closed_deferred": self.stats.fail_closed_deferred[i],
            }
        s = self.stats
        return {
            "capacity": None,
            "in_flight": sum(self.local),
            "tenants": tenants,
            "redis": {
                "replica": self.replica,
                "up": self.up,
                "failure_mode": self.cfg.failure_mode,
                "errors": s.errors,
                "outages": s.outages,
                "recoveries": s.recoveries,
                "leases_expired": s.leases_expired,
                "leases_restored": s.leases_restored,
                "releases_retried": s.releases_retried,
                "script_errors": s.script_errors,
                "script_errors_by_script": dict(s.script_errors_by),
                "bad_values": s.bad_values,
                "bad_values_by_kind": dict(s.bad_values_by),
                "pending_releases": len(self.pending_release),
                "leases_held": len(self.live),
                **{k: v for other in self.attached for k, v in other.stats().items()},
            },
        }
