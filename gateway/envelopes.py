"""Rate envelopes per (tenant, target): GCRA buckets on requests and on tokens, with backoff state and alerts.

A request of a tenant towards a target (the model it names) is charged against every envelope of that
tenant whose target is the model or ``*``. All buckets are checked before any is charged, so a deferral
spends nothing. Deferred requests put the envelope into backoff until the computed ``retry_after``; the
backoff state and the remaining budget are readable (admin API, metrics) so a scheduler can plan around
them instead of spinning. When a bucket falls below ``alert_below`` of its burst an alert fires once (a
callback: the gateway logs a line and counts it) and re-arms when the bucket refills above the threshold.

Everything takes ``now`` from the caller (an injected clock), like the admission core.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from admit.core.gcra import Gcra
from admit.gateway.config import ENVELOPE_TARGET_ANY, EnvelopeConfig

AlertHook = Callable[[str, str, str, float], None]  # (tenant, target, unit, remaining fraction)
UNITS = ("requests", "tokens")


@dataclass
class Envelope:
    tenant: str
    cfg: EnvelopeConfig
    buckets: dict[str, Gcra]
    alerted: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(UNITS, False))
    backoff_until: float = -math.inf
    deferred: int = 0
    admitted: int = 0

    @classmethod
    def build(cls, tenant: str, cfg: EnvelopeConfig, now: float) -> Envelope:
        buckets: dict[str, Gcra] = {}
        if cfg.requests_per_s is not None:
            buckets["requests"] = Gcra(cfg.requests_per_s, cfg.request_burst_or_default, now)
        if cfg.tokens_per_s is not None:
            buckets["tokens"] = Gcra(cfg.tokens_per_s, cfg.token_burst_or_default, now)
        return cls(tenant, cfg, buckets)

    def state(self, now: float) -> dict[str, object]:
        out: dict[str, object] = {
            "target": self.cfg.target,
            "config": self.cfg.model_dump(),
            "in_backoff": now < self.backoff_until,
            "backoff_remaining_s": max(0.0, self.backoff_until - now),
            "admitted": self.admitted,
            "deferred": self.deferred,
        }
        for unit, b in self.buckets.items():
            out[unit] = {"remaining": b.remaining(now), "burst": b.burst, "rate_per_s": b.rate}
        return out


@dataclass(frozen=True)
class Charge:
    """What one admitted request spent (envelope, unit, qty), to give back if it never runs or to settle
    against its real usage when it ends."""

    items: tuple[tuple[Envelope, str, float], ...]


@dataclass(frozen=True)
class Deferral:
    retry_after_s: float
    target: str
    unit: str


class EnvelopeBook:
    """All envelopes of all tenants; tenants by name."""

    def __init__(self, on_alert: AlertHook | None = None) -> None:
        self._by_tenant: dict[str, dict[str, Envelope]] = {}
        self._on_alert = on_alert

    def configure(self, tenant: str, cfg: EnvelopeConfig, now: float) -> EnvelopeConfig | None:
        """Add or replace one envelope; returns the previous config. Replacing keeps the debt in units
        (capped to the new burst, gcra.py `Gcra.reconfigure`), so a raise applies at once."""
        envs = self._by_tenant.setdefault(tenant, {})
        old = envs.get(cfg.target)
        if old is None:
            envs[cfg.target] = Envelope.build(tenant, cfg, now)
            return None
        fresh = Envelope.build(tenant, cfg, now)
        for unit, b in fresh.buckets.items():
            prev = old.buckets.get(unit)
            if prev is not None:
                prev.reconfigure(b.rate, b.burst, now)
                fresh.buckets[unit] = prev
        fresh.deferred, fresh.admitted, fresh.backoff_until = old.deferred, old.admitted, old.backoff_until
        envs[cfg.target] = fresh
        return old.cfg

    def remove(self, tenant: str, target: str) -> EnvelopeConfig | None:
        env = self._by_tenant.get(tenant, {}).pop(target, None)
        return None if env is None else env.cfg

    def envelopes(self, tenant: str) -> list[Envelope]:
        return list(self._by_tenant.get(tenant, {}).values())

    def _matching(self, tenant: str, target: str) -> list[Envelope]:
        envs = self._by_tenant.get(tenant)
        if not envs:
            return []
        out = []
        if target != ENVELOPE_TARGET_ANY and target in envs:
            out.append(envs[target])
        if ENVELOPE_TARGET_ANY in envs:
            out.append(envs[ENVELOPE_TARGET_ANY])
        return out

    def charge(self, tenant: str, target: str, tokens: int, now: float) -> Charge | Deferral:
        """Spend one request and ``tokens`` tokens from every matching envelope, or spend nothing and defer."""
        envs = self._matching(tenant, target)
        if not envs:
            return Charge(())
        worst: Deferral | None = None
        for env in envs:
            for unit, b in env.buckets.items():
                qty = 1.0 if unit == "requests" else float(tokens)
                res = b.peek(qty, now)
                if not res.allowed and (worst is None or res.retry_after_s > worst.retry_after_s):
                    worst = Deferral(res.retry_after_s, env.cfg.target, unit)
        if worst is not None:
            for env in envs:
                env.deferred += 1
                env.backoff_until = max(env.backoff_until, now + worst.retry_after_s)
            return worst
        items = []
        for env in envs:
            env.admitted += 1
            for unit, b in env.buckets.items():
                qty = 1.0 if unit == "requests" else float(tokens)
                b.spend(qty, now)
                items.append((env, unit, qty))
                self._watch(env, unit, b, now)
        return Charge(tuple(items))

    def refund(self, charge: Charge, now: float) -> None:
        for env, unit, qty in charge.items:
            env.buckets[unit].refund(qty, now)

    def settle(self, charge: Charge, tokens_used: int, now: float) -> None:
        """Reconcile a finished request's token charge with its real usage: every tokens bucket the charge
        spent from is charged ``tokens_used`` minus what it was charged up front (``Gcra.force`` when more,
        beyond the burst if need be, since the work already ran; ``Gcra.refund`` when fewer). Requests
        buckets are untouched: a request is one request whatever it generated. ``tokens_used`` is in the
        charge's units (prompt + generated tokens). Call it once per charge, after the request ended.
        """
        for env, unit, qty in charge.items:
            diff = float(tokens_used) - qty
            if unit != "tokens" or diff == 0:
                continue
            b = env.buckets[unit]
            if diff > 0:
                b.force(diff, now)
            else:
                b.refund(-diff, now)
            self._watch(env, unit, b, now)

    def _watch(self, env: Envelope, unit: str, b: Gcra, now: float) -> None:
        frac = b.remaining(now) / b.burst
        if frac < env.cfg.alert_below:
            if not env.alerted[unit]:
                env.alerted[unit] = True
                if self._on_alert is not None:
                    self._on_alert(env.tenant, env.cfg.target, unit, frac)
        else:
            env.alerted[unit] = False
