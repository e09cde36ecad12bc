"""Tenant contracts shared by several gateway replicas on Redis: one contract envelope per tenant for all.

A request of a tenant with a ``contract:`` is classified in or out of contract at its arrival
(core/contract.py). In process each gateway holds the tenant's envelope; with Redis the envelope is ONE
state in Redis (``<prefix>:contract:<tenant>``), so N replicas together put exactly the contract's rate and
burst in contract, not N times it. Each classification is one atomic script (gateway/redis/scripts.py
``CONTRACT``): core/gcra.py's arithmetic in seconds, operation for operation, so that the decisions are
core/contract.py ``classify``'s on the same times (a test runs both on thousands of random arrivals).

**The clock is Redis's** (``TIME`` in the script), not the replica's. The arrival time is the time the
envelope is charged at, and one envelope needs one clock: replicas' clocks differ (their monotonic clocks
are not even comparable, and wall clocks drift), and a replica whose clock ran ahead would refill the
envelope for everybody, one behind would drain it. On Redis's clock the times are also in the order the
envelope was charged (the script never goes back before the tenant's last time, even if the server's clock
is stepped back), which is the order the classifier must see. The script returns the time it classified at
and a per-tenant sequence number; the request log keeps both (``contract_at``, ``contract_seq``), so
sorting the lines of all replicas by ``(contract_at, contract_seq)`` and running core/contract.py's
``classify`` on them gives the gateway's classes request by request. On the gateway's path the classification
is in the request's one Redis round trip: the script that classifies also charges the rate envelopes and
tries for the lease (``CONTRACT_ACQUIRE``, gateway/redis/envelopes.py ``classify_and_acquire``); the class
picks the queue only when no slot is free, so it is known by then. Alone (``classify``: ``CONTRACT``) it is
one round trip of its own, as when this replica's queue of the tenant is not empty (its requests go first,
so the lease is not tried).

**This replica's mirror.** Each tenant's envelope is mirrored here in a core ``ContractMeter`` on the
replica's wall clock: every answer of the script (and a read every refresh of the Redis backend) sets its
theoretical arrival time to ``now + what Redis has ahead``, as the rate envelopes' mirrors are kept
(gateway/redis/envelopes.py).

**When Redis is unreachable** the contracts follow the leases' ``failure_mode`` (gateway/redis/admission.py):

* ``closed`` — the request gets 503 ``admission-unavailable`` (as its lease would have got), unclassified.
* ``open`` — each replica classifies on its mirror, on its own wall clock, starting from the last shared
  state it saw: during the outage a tenant may have up to ``replicas x`` (what was left + the refill) in
  contract. Such lines have ``contract_seq`` null (their ``contract_at`` is the replica's clock); when
  Redis is back its envelope is the truth again and what replicas classified on their own is not written
  back (as the rate envelopes do).

A classification whose script timed out may have run: the shared envelope may have been charged for a
request that is then answered by the failure mode (never charged back: an outage can cost a tenant one
request's share of its contract, never give it one). A script error (Redis answered, the script failed on
this tenant's key) is not an outage: closed answers 500 ``admission-error`` for this request, open
classifies it on the mirror; Redis stays up.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from admit.core.contract import Contract, ContractMeter
from admit.core.gcra import Gcra
from admit.gateway.admission import ADMISSION_UNAVAILABLE, Deferred
from admit.gateway.config import RedisConfig
from admit.gateway.redis.admission import AdmissionError, RedisAdmission
from admit.gateway.redis.scripts import CONTRACT


@dataclass(frozen=True, slots=True)
class Classified:
    """One request's class, the time it was classified at (Redis's clock, or this replica's when ``seq`` is
    None: classified on the mirror), and Redis's sequence number of the classification."""

    in_contract: bool
    at: float
    seq: int | None


def wall_clock() -> float:
    return round(time.time(), 6)


class SharedContracts:
    def __init__(self, cfg: RedisConfig, names: list[str], contracts: list[Contract | None]) -> None:
        self.names = names
        self.contracts = contracts
        self.meters = [None if c is None else ContractMeter(c) for c in contracts]  # the mirrors
        self._keys = [f"{cfg.prefix}:contract:{n}" for n in names]
        self._last = [-math.inf] * len(names)  # the last time this replica classified at on its own
        self._adm: RedisAdmission | None = None
        self.read_at = -1.0  # time.monotonic() of the last read of the shared envelopes
        self.fail_open_classified = 0  # requests classified on the mirror while Redis was down (or failed)
        self.fail_open_by = [0] * len(names)  # the same, per tenant (/metrics)
        self.shared_classified = 0

    def _args(self, t: int, cost: float) -> list[Any]:
        c = self.contracts[t]
        assert c is not None
        return [c.rate, max(1, math.ceil(c.burst)), cost]  # as core/contract.py's ContractMeter builds its Gcra

    # ----------------------------------------------------------------- lifecycle
    async def attach(self, adm: RedisAdmission) -> None:
        """Use ``adm``'s connection and up/down state, and read the shared envelopes with its refresh."""
        self._adm = adm
        self._script = adm.r.register_script(CONTRACT)
        adm.attached.append(self)
        if adm.up:
            try:
                await self.refresh()
            except adm.ERRORS as exc:
                adm.failed(exc, "attach")

    async def recover(self) -> None:
        """Nothing to write back: what was classified here during an outage stays past (module docstring)."""

    async def refresh(self) -> None:
        """Set every mirror to the shared envelope, in one call for all tenants with a contract; after a script
        error one call per tenant, so that one tenant's broken key leaves the others' mirrors fresh (its own
        stays as it was)."""
        ts = [t for t, c in enumerate(self.contracts) if c is not None]
        if not ts:
            return
        assert self._adm is not None
        await self._adm.read_each("CONTRACT", self._read, ts, lambda t: f"tenant {self.names[t]}")
        self.read_at = time.monotonic()

    async def _read(self, ts: list[int]) -> None:
        args: list[Any] = ["read"]
        for t in ts:
            args += self._args(t, 0.0)
        got = await self._script(keys=[self._keys[t] for t in ts], args=args)
        for t, one in zip(ts, got, strict=True):
            self._sync(t, float(one[3]))

    def _sync(self, t: int, ahead: float) -> None:
        meter = self.meters[t]
        assert meter is not None
        now = wall_clock()
        if meter.gcra is None:
            meter.gcra = Gcra(meter.contract.rate, max(1, math.ceil(meter.contract.burst)), now)
        meter.gcra.tat = now + ahead

    # ----------------------------------------------------------------- classification
    async def classify(self, t: int, prompt_tokens: int, output_tokens: int) -> Classified:
        """Tenant ``t``'s request, in or out of contract, on the shared envelope; the failure mode's answer
        when Redis does not give one (module docstring)."""
        adm = self._adm
        meter = self.meters[t]
        assert adm is not None and meter is not None, "attach() first, for a tenant with a contract"
        if not adm.up:
            return self.fallback(t, prompt_tokens, output_tokens)
        key, args = self.classify_args(t, prompt_tokens, output_tokens)
        try:
            got = (await self._script(keys=[key], args=["classify", *args]))[0]
        except adm.ERRORS as exc:
            script = adm.failed(exc, "CONTRACT", f"tenant {self.names[t]}")
            return self.fallback(t, prompt_tokens, output_tokens, script_error=script)
        return self.classified(t, got)

    # The pieces of one classification, also used by the script that classifies, charges and leases in one
    # (gateway/redis/envelopes.py ``classify_and_acquire``): these keys and args, then apply the answer.
    def classify_args(self, t: int, prompt_tokens: int, output_tokens: int) -> tuple[str, list[Any]]:
        """Tenant ``t``'s contract key and the script's rate, burst and cost of this request."""
        meter = self.meters[t]
        assert meter is not None
        return self._keys[t], self._args(t, meter.contract.cost(prompt_tokens, output_tokens))

    def classified(self, t: int, got: list[Any]) -> Classified:
        """Apply the script's contract() answer ``{in contract, time, seq, ahead}``: the mirror, the count."""
        self._sync(t, float(got[3]))
        self.shared_classified += 1
        return Classified(bool(int(got[0])), float(got[1]), int(got[2]))

    def fallback(self, t: int, prompt_tokens: int, output_tokens: int, script_error: bool = False) -> Classified:
        """The failure mode's answer while Redis is down, or (``script_error``) for this one request whose
        script failed: closed raises (503 admission-unavailable, or 500 admission-error), open classifies on
        this replica's mirror."""
        adm = self._adm
        meter = self.meters[t]
        assert adm is not None and meter is not None
        if adm.cfg.failure_mode == "closed":
            if script_error:
                raise AdmissionError(f"the contract of tenant {self.names[t]} failed in Redis (a script error)")
            adm.stats.fail_closed_deferred[t] += 1
            raise Deferred(ADMISSION_UNAVAILABLE, adm.cfg.retry_after_s, "the shared contract state is unreachable",
                           status=503)
        at = max(wall_clock(), self._last[t])  # the log's times of this replica stay in its classification order
        self._last[t] = at
        self.fail_open_classified += 1
        self.fail_open_by[t] += 1
        return Classified(meter.arrive(at, prompt_tokens, output_tokens), at, None)

    # ----------------------------------------------------------------- state
    def stats(self) -> dict[str, Any]:
        """Shown in /admin/state's ``redis`` section."""
        return {
            "contracts_read_age_s": None if self.read_at < 0 else round(max(0.0, time.monotonic() - self.read_at), 3),
            "contracts_classified": self.shared_classified,
            "contracts_fail_open_classified": self.fail_open_classified,
        }
