"""Rate envelopes shared by several gateway replicas on Redis: one GCRA bucket per (tenant, target, unit).

With Redis the budget of an envelope is one set of buckets for all replicas, so N replicas together admit
one envelope, not N. A request's charge is one Lua script (gateway/redis/scripts.py ``GCRA``, server time):
all its buckets are checked and then all charged, or none; a deferral pushes the shared backoff of every
envelope involved. Refunds (a request charged and then deferred by its queue, or that never reached the
backend) go to Redis too. On the gateway's path the charge and the request's first try for a lease are one
script (``charge_and_acquire``, ``CHARGE_ACQUIRE``), so a request with envelopes costs one round trip before
the backend, as one without; the lease is tried only when the charge is granted.

The in-process `EnvelopeBook` this class extends stays as a *mirror*: its buckets take the debt Redis
answered with each charge and with a read every refresh of the Redis backend (``max(poll_s, 0.2)`` s), so
the admin API and ``/metrics`` show the shared remaining budget and backoff, never older than one refresh
(the refill in between is extrapolated). Its counters (admitted, deferred) are this replica's.

**Envelope configs** live in one Redis hash (``<prefix>:envelopes``, field ``tenant/target``, value the
config as JSON, ``null`` once removed). A replica seeds it from its file only where a field is missing, so
a restarted replica never undoes a change made through the admin API. The admin API's change (``write``) is
one compare-and-set script (SET_ENVELOPE): the same config as stored changes nothing, a different one is
written and numbered with the configuration and tenant versions, as limits are (gateway/redis/admission.py);
while Redis is unreachable it is refused (WriteFailed, 503) and nothing is applied. Every other replica takes
it at its next refresh, which reads the configs and the tenant versions in one transaction and takes a
tenant's configs only when their version is at least the one the replica knows. A config read from Redis
that is not a valid one (``EnvelopeConfig``, its target included) is refused, counted and logged once, and
the envelope keeps its last good config. (``configure``/``remove`` called directly, not through the admin
API, write in the background and keep a change Redis did not take to write it again when Redis answers.)

**When Redis is unreachable** the envelopes follow the leases' ``failure_mode``:

* ``closed`` — a request of a tenant with a matching envelope gets 503 ``admission-unavailable``.
* ``open`` — each replica charges its mirror, starting from the last shared state it saw, so the tenant
  gets at most ``replicas x`` (what was left + the refill) during the outage. When Redis is back its
  buckets are the truth again; what replicas spent on their own is not written back (it is past, and
  replaying it would only punish the tenant afterwards).

A charge whose script times out may have run: it is not refunded (the tenant may lose one request's budget,
never gain one). A refund that cannot reach Redis is dropped for the same reason.

**Settling** (``settle``) charges a finished request's real token usage against what its charge took up
front: the difference goes to the shared token buckets in one background script call (``GCRA`` mode
"force", signed: more tokens than charged are forced in, beyond the burst if need be, fewer are refunded).
A settle that cannot reach Redis is dropped and counted, like a refund.

**A script error** (gateway/redis/admission.py: Redis answered, the script failed on this call's keys, e.g.
a bucket key holding something the scripts never write) is not an outage: it is counted, Redis stays up,
and only the request that hit it gets the failure mode's answer (closed: 500 ``admission-error``; open:
the mirror's charge). The read of all buckets falls back to one call per envelope, so a broken key leaves
the other envelopes' mirrors fresh.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from admit.gateway.admission import ADMISSION_UNAVAILABLE, Change, Deferred, Lease, Written
from admit.gateway.config import EnvelopeConfig, RedisConfig
from admit.gateway.envelopes import AlertHook, Charge, Deferral, Envelope, EnvelopeBook
from admit.gateway.redis.admission import AdmissionError, RedisAdmission, is_script_error
from admit.gateway.redis.contracts import Classified, SharedContracts
from admit.gateway.redis.scripts import CHARGE_ACQUIRE, CONTRACT_ACQUIRE, GCRA, SET_ENVELOPE
from pydantic import ValidationError

log = logging.getLogger("admit.gateway.redis")
_FREE = Charge(())


class SharedCharge(Charge):
    """A charge made in Redis: its refund goes there too."""


@dataclass(slots=True)
class _Spend:
    """The GCRA script's keys and args (mode "spend") for one request over its matching envelopes."""

    envs: list[Envelope]
    items: list[tuple[Envelope, str]]  # (envelope, unit) per bucket, in the script's order
    qtys: list[float]
    keys: list[str]
    args: list[Any]


# what charge_and_acquire answers: (the charge or its deferral, the lease or None, the script asked for a lease)
ChargedLease = tuple[Charge | Deferral, Lease | None, bool]


def _json(cfg: EnvelopeConfig | None) -> str:
    return "" if cfg is None else json.dumps(cfg.model_dump(), sort_keys=True, separators=(",", ":"))


class SharedEnvelopeBook(EnvelopeBook):
    def __init__(self, cfg: RedisConfig, clock: Any, on_alert: AlertHook | None = None) -> None:
        super().__init__(on_alert)
        self._clock = clock
        self._prefix = cfg.prefix
        self._cfg_key = f"{cfg.prefix}:envelopes"
        self._adm: RedisAdmission | None = None
        self._seen: dict[str, str] = {}  # field -> JSON last read from (or written to) Redis
        self._dirty: dict[str, EnvelopeConfig | None] = {}  # changes made here that Redis has not taken yet
        self._bg: set[asyncio.Task[Any]] = set()
        self.read_at = -1.0  # clock() of the last read of the shared bucket state
        self.fail_open_charged = 0  # charges made on the mirror while Redis was down
        self.refunds_dropped = 0
        self.settled = 0  # settles written to Redis
        self.settles_dropped = 0  # settles that could not be written (Redis down, or a script error)
        self.configs_applied = 0  # changes other replicas made, taken from Redis

    # ----------------------------------------------------------------- keys
    def _bucket_key(self, tenant: str, target: str, unit: str) -> str:
        return f"{self._prefix}:gcra:{tenant}/{target}:{unit}"

    def _backoff_key(self, tenant: str, target: str) -> str:
        return f"{self._prefix}:backoff:{tenant}/{target}"

    def _fields(self) -> dict[str, EnvelopeConfig]:
        return {f"{t}/{target}": env.cfg for t, envs in self._by_tenant.items() for target, env in envs.items()}

    # ----------------------------------------------------------------- lifecycle
    async def attach(self, adm: RedisAdmission) -> None:
        """Use ``adm``'s connection and up/down state; seed and read the shared configs when Redis answers."""
        self._adm = adm
        self._gcra = adm.r.register_script(GCRA)
        self._charge_acquire = adm.r.register_script(CHARGE_ACQUIRE)
        self._contract_acquire = adm.r.register_script(CONTRACT_ACQUIRE)
        self._set = adm.r.register_script(SET_ENVELOPE)
        adm.attached.append(self)
        if adm.up:
            try:
                await self.refresh()
            except adm.ERRORS as exc:
                adm.failed(exc, "attach")

    async def recover(self) -> None:
        """Redis answers again: write the changes made meanwhile (refresh then seeds anything it lost)."""
        for field in list(self._dirty):
            await self._push(field, raise_errors=True)

    async def refresh(self) -> None:
        """Seed missing configs, take other replicas' changes, and read the shared budget of every bucket."""
        adm = self._adm
        assert adm is not None
        r = adm.r
        async with r.pipeline(transaction=True) as pipe:  # the configs and their versions as of one moment
            pipe.hgetall(self._cfg_key)
            pipe.hgetall(adm.versions_key)
            stored, tvs = await pipe.execute()
        for field, cfg in self._fields().items():
            if field not in stored and field not in self._dirty:  # a fresh server (or one that lost its data)
                await r.hsetnx(self._cfg_key, field, _json(cfg))
                stored[field] = str(await r.hget(self._cfg_key, field) or _json(cfg))
        index = {name: t for t, name in enumerate(adm.names)}
        for field, value in stored.items():
            if field in self._dirty or self._seen.get(field) == value:
                continue
            tenant, _, target = field.partition("/")
            t = index.get(tenant)
            if t is None:  # a tenant of another replica's configuration: not ours to enforce
                self._seen[field] = value
                continue
            raw = tvs.get(tenant)
            tv = adm.checked(raw, "version", f"{adm.versions_key} {tenant}") if raw else 0
            if tv is not None and tv >= adm.versions[t]:  # else refused, or older than a write this replica knows
                self._take(field, value)
        await self._read_buckets()

    def _take(self, field: str, value: str) -> None:
        """A config another replica wrote (or Redis's, at start-up), checked like admin input."""
        tenant, _, target = field.partition("/")
        if value == "null":
            self._seen[field] = value
            if super().remove(tenant, target) is not None:
                self.configs_applied += 1
            return
        cfg = self._parsed(field, value)
        if cfg is None:
            return  # not taken (nor marked seen): refused and counted at every refresh until it is fixed
        self._seen[field] = value
        envs = self._by_tenant.get(tenant, {})
        if target not in envs or envs[target].cfg != cfg:
            super().configure(tenant, cfg, self._clock())
            self.configs_applied += 1

    def _parsed(self, field: str, value: str) -> EnvelopeConfig | None:
        """The config stored in ``field``, or None when it is not a valid one (refused, counted, logged once)."""
        target = field.partition("/")[2]
        try:
            data = json.loads(value)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            return EnvelopeConfig.model_validate({**data, "target": target})
        except ValidationError as err:
            why = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'envelope'}: {e['msg']}" for e in err.errors())
        except ValueError as exc:  # JSONDecodeError is one
            why = str(exc)
        assert self._adm is not None
        self._adm.bad_value("envelope", f"{self._cfg_key} {field}", value, f"not a valid config: {why}")
        return None

    async def _read_buckets(self) -> None:
        """Read every envelope's shared buckets and backoff, in one call; after a script error, one call per
        envelope, so that one envelope's broken key leaves the others' mirrors fresh."""
        envs = [env for envs in self._by_tenant.values() for env in envs.values()]
        if envs:
            assert self._adm is not None
            await self._adm.read_each("GCRA", self._read_envs, envs,
                                      lambda env: f"envelope {env.tenant}/{env.cfg.target}")
        self.read_at = self._clock()

    async def _read_envs(self, envs: list[Envelope]) -> None:
        items = [(env, unit) for env in envs for unit in env.buckets]
        keys = [self._bucket_key(env.tenant, env.cfg.target, unit) for env, unit in items]
        keys += [self._backoff_key(env.tenant, env.cfg.target) for env in envs]
        args: list[Any] = ["read", len(items)]
        for env, unit in items:
            b = env.buckets[unit]
            args += [b.rate, b.burst, 0]
        got = await self._gcra(keys=keys, args=args)
        self._sync(items, envs, got)

    def _sync(self, items: list[tuple[Envelope, str]], envs: list[Envelope], got: list[Any]) -> None:
        """Set the mirror buckets (and backoffs) to what Redis answered, on this replica's clock."""
        now = self._clock()
        n = len(items)
        for (env, unit), ahead in zip(items, got[3 : 3 + n], strict=True):
            b = env.buckets.get(unit)
            if b is not None:
                b.tat = now + float(ahead)
        for env, left in zip(envs, got[3 + n :], strict=True):
            env.backoff_until = now + float(left) if float(left) > 0 else min(env.backoff_until, now)

    # ----------------------------------------------------------------- changes
    def configure(self, tenant: str, cfg: EnvelopeConfig, now: float) -> EnvelopeConfig | None:
        old = super().configure(tenant, cfg, now)
        self._publish(f"{tenant}/{cfg.target}", cfg)
        return old

    def remove(self, tenant: str, target: str) -> EnvelopeConfig | None:
        old = super().remove(tenant, target)
        if old is not None:
            self._publish(f"{tenant}/{target}", None)
        return old

    def _publish(self, field: str, cfg: EnvelopeConfig | None) -> None:
        if self._adm is None:
            return  # the configuration file, before Redis: seeded by attach(), never overwriting Redis
        self._dirty[field] = cfg
        self._spawn(self._push(field))

    async def _push(self, field: str, raise_errors: bool = False) -> None:
        """Write a change made by ``configure``/``remove`` (not the admin API's: ``write``) in the background."""
        adm = self._adm
        assert adm is not None
        if field not in self._dirty:
            return  # an admin write of this envelope came first
        cfg = self._dirty[field]
        try:
            _, _, tv = await self._store(field, cfg)
        except adm.ERRORS as exc:
            if is_script_error(exc):  # not written again (it would fail again): the next refresh takes Redis's
                adm.script_error("SET_ENVELOPE", exc, f"envelope {field}")
                if field in self._dirty and self._dirty[field] is cfg:
                    del self._dirty[field]
                    self._seen.pop(field, None)
                return
            if raise_errors:
                raise
            adm.mark_down(exc)  # stays dirty: written again when Redis is back
            return
        if field in self._dirty and self._dirty[field] is cfg:
            del self._dirty[field]
            self._seen[field] = _json(cfg) or "null"
            tenant = field.partition("/")[0]
            if tenant in adm.names:
                t = adm.names.index(tenant)
                adm.versions[t] = max(adm.versions[t], tv)

    async def write(self, t: int, target: str, cfg: EnvelopeConfig | None) -> Written:
        """The admin API's change of tenant ``t``'s envelope for ``target`` (``cfg`` None: remove it):
        compare-and-set in Redis (SET_ENVELOPE), then taken here at once. ``changes`` is empty when Redis held
        that config already (or, for a removal, none). Raises WriteFailed when it cannot be stored: nothing
        is applied then."""
        adm = self._adm
        assert adm is not None, "attach() first"
        if not adm.up:
            raise adm.unavailable()
        tenant = adm.names[t]
        field = f"{tenant}/{target}"
        try:
            old, version, tv = await self._store(field, cfg)
        except adm.ERRORS as exc:
            raise adm.write_failed(exc, "SET_ENVELOPE") from None
        value = _json(cfg) or "null"
        self._dirty.pop(field, None)  # Redis holds this write's value now, whatever this replica had pending
        if tv >= adm.versions[t]:  # else a newer change of this tenant is in force here already
            adm.versions[t] = tv
            self._seen[field] = value
            if cfg is None:
                super().remove(tenant, target)
            else:
                envs = self._by_tenant.get(tenant, {})
                if target not in envs or envs[target].cfg != cfg:
                    super().configure(tenant, cfg, self._clock())
        if old is None:
            return Written(version, [])
        prev = None if old in ("", "null") else self._parsed(field, old)
        return Written(version, [Change(t, prev, cfg, tv)])

    async def _store(self, field: str, cfg: EnvelopeConfig | None) -> tuple[str | None, int, int]:
        """SET_ENVELOPE for ``field``: the JSON Redis held before (None when the script changed nothing), and
        the configuration and tenant versions after it. Raises what Redis raises."""
        adm = self._adm
        assert adm is not None
        tenant, _, target = field.partition("/")
        t = adm.names.index(tenant) if tenant in adm.names else None
        rates: list[float | int] = [0, 0, 0, 0]
        if cfg is not None:
            if cfg.requests_per_s is not None:
                rates[0:2] = [cfg.requests_per_s, cfg.request_burst_or_default]
            if cfg.tokens_per_s is not None:
                rates[2:4] = [cfg.tokens_per_s, cfg.token_burst_or_default]
        keys = [
            self._cfg_key,
            self._bucket_key(tenant, target, "requests"),
            self._bucket_key(tenant, target, "tokens"),
            self._backoff_key(tenant, target),
            adm.versions_key,
            adm.version_key,
        ]
        known = 0 if t is None else adm.versions[t]
        got = await self._set(keys=keys, args=[field, _json(cfg), *rates, tenant, adm.version, known])
        adm.refused(got[4])
        version = int(got[2])  # numbers the script wrote itself
        adm.take_version(version)
        return (str(got[1]) if int(got[0]) else None), version, int(got[3])

    # ----------------------------------------------------------------- charges
    async def charge_shared(self, tenant: str, target: str, tokens: int) -> Charge | Deferral:
        """``charge`` on the shared buckets (one script); the failure mode's answer while Redis is down."""
        return await self._charge(self._matching(tenant, target), tenant, target, tokens)

    async def _charge(self, envs: list[Envelope], tenant: str, target: str, tokens: int) -> Charge | Deferral:
        if not envs:
            return _FREE
        adm = self._adm
        assert adm is not None, "attach() first"
        if not adm.up:
            return self._fallback(tenant, target, tokens)
        spend = self._spend(envs, tokens)
        try:
            got = await self._gcra(keys=spend.keys, args=spend.args)
        except adm.ERRORS as exc:
            script = adm.failed(exc, "GCRA", f"tenant {tenant}")
            return self._fallback(tenant, target, tokens, script_error=script)
        return self._spent(spend, got)

    async def charge_and_acquire(self, t: int, target: str, tokens: int) -> ChargedLease:
        """The charge of ``charge_shared`` and the lease of ``RedisAdmission.acquire`` in ONE script
        (CHARGE_ACQUIRE): the fast path of a request with envelopes, one Redis round trip instead of two
        (the second costs latency and gateway CPU on every request: docs/BENCHMARKS.md, "One script for the
        charge and the lease").

        Returns ``(charge or deferral, lease or None, asked)``. The script tries for the lease only when the
        charge is granted, so a deferral takes no lease. ``asked`` means it tried and found no free slot:
        the caller then queues with ``acquire(t, asked=True)``, which does not ask Redis again, and refunds
        the charge if the queue defers, exactly as after the two separate calls. When there is nothing to
        combine — no envelope matches (no extra work), Redis is down (the failure mode's answer), or
        requests are queued here already (they go first, as ``acquire`` would have it) — this is
        ``charge_shared`` alone, and the caller acquires as usual.

        The lease id is entered in ``live`` before the script runs (``reserve``), so a lease granted to a
        caller that left meanwhile is released (``forget``); its charge is not refunded, as for a charge
        whose script may have run.
        """
        adm = self._adm
        assert adm is not None, "attach() first"
        tenant = adm.names[t]
        envs = self._matching(tenant, target)
        if not envs or not adm.up or adm.queue_depth(t):
            return await self._charge(envs, tenant, target, tokens), None, False
        spend = self._spend(envs, tokens)
        lid = adm.reserve(t)
        keys, args = adm.acquire_args(t, lid)
        try:
            got, leased = await self._charge_acquire(keys=keys + spend.keys, args=args + spend.args)
        except asyncio.CancelledError:
            adm.forget(t, lid)
            raise
        except adm.ERRORS as exc:
            if is_script_error(exc):  # it took no lease (gateway/redis/admission.py): nothing to release
                adm.live.pop(lid, None)
                adm.script_error("CHARGE_ACQUIRE", exc, f"tenant {tenant}")
                return self._fallback(tenant, target, tokens, script_error=True), None, False
            adm.mark_down(exc)  # first: the lease it may have granted is released when Redis is back
            adm.forget(t, lid)
            return self._fallback(tenant, target, tokens), None, False
        charge = self._spent(spend, got)
        if not leased:  # the charge deferred: the script took no lease
            adm.live.pop(lid, None)
            return charge, None, False
        lease = adm.acquired(t, lid, leased)
        return charge, lease, lease is None

    async def classify_and_acquire(self, t: int, target: str, tokens: int, contracts: SharedContracts,
                                   prompt_tokens: int, output_tokens: int) -> tuple[Classified, Charge | Deferral,
                                                                                    Lease | None, bool]:
        """The request of a tenant with a contract: its class (``SharedContracts.classify``) and then
        ``charge_and_acquire``, in ONE script (CONTRACT_ACQUIRE), so that the contract adds no Redis round
        trip to the request's one. Returns ``(class, charge or deferral, lease or None, asked)``, the last three
        as ``charge_and_acquire``'s. The class is written in Redis whatever comes of the charge and the lease.

        Redis down, or this replica's queue of the tenant not empty: the two calls one after the other, as
        before (the failure mode's answers; the queued requests go first). The script failing:

        * Redis unreachable (or a timeout, after which the class, the charge and the lease may all have been
          taken in Redis): the failure mode's answers, the class first (closed: 503), as for the two calls; a
          lease it may have granted is released.
        * a script error (Redis answered; which of the three keys broke is not told): closed answers 500
          admission-error, open classifies on the mirror and charges the mirror; the lease is then tried as
          usual by the caller (``asked`` False).
        """
        adm = self._adm
        assert adm is not None, "attach() first"
        if not adm.up or adm.queue_depth(t):
            got_class = await contracts.classify(t, prompt_tokens, output_tokens)
            return (got_class, *await self.charge_and_acquire(t, target, tokens))
        tenant = adm.names[t]
        envs = self._matching(tenant, target)
        spend = self._spend(envs, tokens) if envs else None
        ckey, cargs = contracts.classify_args(t, prompt_tokens, output_tokens)
        lid = adm.reserve(t)
        keys, args = adm.acquire_args(t, lid)
        if spend is not None:
            keys, args = keys + spend.keys, args + spend.args
        try:
            answer = await self._contract_acquire(keys=[ckey, *keys], args=[*cargs, *args])
        except asyncio.CancelledError:
            adm.forget(t, lid)
            raise
        except adm.ERRORS as exc:
            if is_script_error(exc):  # it took no lease (gateway/redis/admission.py): nothing to release
                adm.live.pop(lid, None)
                adm.script_error("CONTRACT_ACQUIRE", exc, f"tenant {tenant}")
                got_class = contracts.fallback(t, prompt_tokens, output_tokens, script_error=True)
                charge = self._fallback(tenant, target, tokens, script_error=True) if envs else _FREE
                return got_class, charge, None, False
            adm.mark_down(exc)  # first: the lease it may have granted is released when Redis is back
            adm.forget(t, lid)
            got_class = contracts.fallback(t, prompt_tokens, output_tokens)
            return got_class, self._fallback(tenant, target, tokens) if envs else _FREE, None, False
        classed, got, leased = answer[0], answer[1], answer[2:]
        got_class = contracts.classified(t, classed.split(" "))
        charge = _FREE if spend is None else self._spent(spend, got)
        if not leased:  # the charge deferred: the script took no lease
            adm.live.pop(lid, None)
            return got_class, charge, None, False
        lease = adm.acquired(t, lid, leased)
        return got_class, charge, lease, lease is None

    def _spend(self, envs: list[Envelope], tokens: int) -> _Spend:
        """What charging ``envs`` for one request of ``tokens`` sends to the GCRA script: one unit of each
        requests bucket, ``tokens`` of each tokens bucket, and the backoff key of every envelope."""
        items: list[tuple[Envelope, str]] = []
        qtys: list[float] = []
        args: list[Any] = ["spend", 0]
        for env in envs:
            for unit, b in env.buckets.items():
                qty = 1.0 if unit == "requests" else float(tokens)
                items.append((env, unit))
                qtys.append(qty)
                args += [b.rate, b.burst, qty]
        args[1] = len(items)
        keys = [self._bucket_key(env.tenant, env.cfg.target, unit) for env, unit in items]
        keys += [self._backoff_key(env.tenant, env.cfg.target) for env in envs]
        return _Spend(envs, items, qtys, keys, args)

    def _spent(self, spend: _Spend, got: list[Any]) -> Charge | Deferral:
        """Apply the GCRA script's answer to a spend: mirror, counters, alerts; the charge or its deferral."""
        items, envs = spend.items, spend.envs
        self._sync(items, envs, got)
        if not int(got[0]):
            for env in envs:
                env.deferred += 1
            env, unit = items[int(got[1]) - 1]
            return Deferral(float(got[2]), env.cfg.target, unit)
        now = self._clock()
        for env in envs:
            env.admitted += 1
        for env, unit in items:
            b = env.buckets.get(unit)  # gone only if a refresh dropped the unit while the script ran
            if b is not None:
                self._watch(env, unit, b, now)
        return SharedCharge(tuple((env, unit, q) for (env, unit), q in zip(items, spend.qtys, strict=True)))

    def _fallback(self, tenant: str, target: str, tokens: int, script_error: bool = False) -> Charge | Deferral:
        """The failure mode's answer while Redis is down, or (``script_error``) for this one request whose
        script failed: closed defers (503 admission-unavailable, or 500 admission-error), open charges the
        mirror."""
        adm = self._adm
        assert adm is not None
        if adm.cfg.failure_mode == "closed":
            if script_error:
                raise AdmissionError(f"the rate envelopes of tenant {tenant} failed in Redis (a script error)")
            adm.stats.fail_closed_deferred[adm.names.index(tenant)] += 1
            raise Deferred(
                ADMISSION_UNAVAILABLE, adm.cfg.retry_after_s, "the shared rate envelopes are unreachable", status=503
            )
        got = super().charge(tenant, target, tokens, self._clock())
        if isinstance(got, Charge):
            self.fail_open_charged += 1
        return got

    def refund(self, charge: Charge, now: float) -> None:
        if isinstance(charge, SharedCharge):
            self._spawn(self._refund_remote(charge))
        else:
            super().refund(charge, now)

    async def _refund_remote(self, charge: SharedCharge) -> None:
        items = [(env, unit) for env, unit, _ in charge.items]
        args: list[Any] = ["refund", len(items)]
        for env, unit, qty in charge.items:
            b = env.buckets.get(unit)
            if b is None:  # the envelope changed meanwhile; its bucket is gone
                return
            args += [b.rate, b.burst, qty]
        got = await self._background_gcra(items, args, "a refund")
        if got is None:
            self.refunds_dropped += 1
            return
        self._sync(items, [], got)

    async def _background_gcra(self, items: list[tuple[Envelope, str]], args: list[Any], what: str) -> Any:
        """One GCRA script call on the buckets of ``items`` off the request path (a refund, a settle); None
        when Redis does not answer it (the caller counts it as dropped: see the module docstring)."""
        adm = self._adm
        assert adm is not None
        keys = [self._bucket_key(env.tenant, env.cfg.target, unit) for env, unit in items]
        try:
            return await self._gcra(keys=keys, args=args)
        except adm.ERRORS as exc:
            adm.failed(exc, "GCRA", f"{what} of tenant {items[0][0].tenant}")
            return None

    def settle(self, charge: Charge, tokens_used: int, now: float) -> None:
        """``EnvelopeBook.settle`` on the shared buckets for a charge made in Redis (one background script
        call, like a refund); a charge made on the mirror (failing open) is settled there."""
        if not isinstance(charge, SharedCharge):
            super().settle(charge, tokens_used, now)
        elif any(unit == "tokens" and qty != tokens_used for _, unit, qty in charge.items):
            self._spawn(self._settle_remote(charge, tokens_used))

    async def _settle_remote(self, charge: SharedCharge, tokens_used: int) -> None:
        adm = self._adm
        assert adm is not None
        items: list[tuple[Envelope, str]] = []
        args: list[Any] = ["force", 0]
        for env, unit, qty in charge.items:
            b = env.buckets.get(unit)
            if unit != "tokens" or b is None or qty == tokens_used:  # b None: the envelope dropped its tokens
                continue
            items.append((env, unit))
            args += [b.rate, b.burst, float(tokens_used) - qty]  # signed: > 0 forced in, < 0 refunded
        if not items:
            return
        args[1] = len(items)
        if not adm.up:  # not worth a timeout: Redis's buckets are the truth again when it is back
            self.settles_dropped += 1
            return
        got = await self._background_gcra(items, args, "a settle")
        if got is None:
            self.settles_dropped += 1
            return
        self.settled += 1
        self._sync(items, [], got)  # the mirror shows the settled budget at once
        self._sync(items, [], got)
        now = self._clock()
        for env, unit in items:
            b = env.buckets.get(unit)
            if b is not None:
                self._watch(env, unit, b, now)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    # ----------------------------------------------------------------- state
    def stats(self) -> dict[str, Any]:
        """Shown in /admin/state's ``redis`` section."""
        return {
            "envelopes_read_age_s": None if self.read_at < 0 else round(max(0.0, self._clock() - self.read_at), 3),
            "envelope_configs_pending": len(self._dirty),
            "envelope_configs_taken": self.configs_applied,
            "envelope_fail_open_charged": self.fail_open_charged,
            "envelope_refunds_dropped": self.refunds_dropped,
            "envelope_settled": self.settled,
            "envelope_settles_dropped": self.settles_dropped,
        }
