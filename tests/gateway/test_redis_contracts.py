"""The contract envelope in Redis (gateway/redis/scripts.py ``CONTRACT``) decides as core/contract.py's
``classify`` does, decision by decision, on the same arrival times: on thousands of random arrivals (bursts at
one instant, arrivals exactly on the refill's grid, costs beyond the burst, clock values of a Unix time), and
on the times the real script takes from Redis's clock and returns. And the Redis backend's queue serves a
tenant's in-contract requests before its excess (core/admission.py's two queues)."""

from __future__ import annotations

import asyncio
import itertools
import math
import random
from typing import Any

import pytest
import redis.asyncio as aioredis
from admit.core.contract import Contract, ContractMeter, classify
from admit.gateway.config import RedisConfig, TenantConfig
from admit.gateway.redis.admission import AdmissionError, RedisAdmission
from admit.gateway.redis.contracts import SharedContracts
from admit.gateway.redis.scripts import _CONTRACT_FN, CONTRACT
from redis_helpers import RedisServer

pytestmark = [pytest.mark.system, pytest.mark.timeout(120)]

# the script's contract() on times given by the caller, many arrivals per call: ARGV rate, burst, then (now,
# cost) per arrival; returns the decisions as a string of 0s and 1s
_GIVEN_TIMES = _CONTRACT_FN + """
local out = {}
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 3, #ARGV, 2 do
  out[#out + 1] = contract(KEYS[1], 'classify', rate, burst, tonumber(ARGV[i + 1]), tonumber(ARGV[i]))[1]
end
return table.concat(out)
"""


def _arrivals(rng: random.Random, c: Contract, n: int) -> tuple[list[float], list[int], list[int]]:
    """``n`` arrivals of one tenant in order, with sizes (prompt, output): Poisson at a multiple of the
    contract's rate, bursts at one instant, runs on the refill's grid (k / rate), and arrivals exactly at
    the instant the envelope lets the next one in and one float step either side of it (the edge where any
    other rounding decides otherwise), at the magnitude of a Unix time, half of them rounded to microseconds
    as the log keeps them. Token costs go beyond the burst at times (only a full envelope lets one in)."""
    meter = ContractMeter(c)  # the state the edges are computed on
    t = 1.7e9 + rng.random() * 1e8
    mean_cost = 1.0 if c.unit == "requests" else c.burst / 4
    times: list[float] = []
    prompt: list[int] = []
    out: list[int] = []

    def size() -> tuple[int, int]:
        if c.unit == "requests":
            return rng.randint(1, 500), rng.randint(1, 500)
        k = max(2, int(rng.expovariate(1 / mean_cost))) if rng.random() < 0.95 else int(c.burst * 1.5) + 1
        p = rng.randint(1, k - 1)
        return p, k - p

    def arrive(at: float, p: int, o: int) -> float:
        meter.arrive(at, p, o)
        times.append(at)
        prompt.append(p)
        out.append(o)
        return at

    while len(times) < n:
        kind = rng.random()
        batch: list[float]
        if kind < 0.1:  # a burst at one instant
            batch = [t] * rng.randint(2, int(2 * c.burst) + 3)
        elif kind < 0.2:  # on the grid of the refill
            batch = [t + k * mean_cost / c.rate for k in range(rng.randint(2, 12))]
        elif kind < 0.55 and meter.gcra is not None:  # at the edge, or one float step either side
            batch = []
        else:
            batch = [t + rng.expovariate(rng.choice((0.3, 1.0, 3.0)) * c.rate / mean_cost)]
        if rng.random() < 0.5:
            batch = [round(x, 6) for x in batch]
        if not batch:
            p, o = size()
            g, q = meter.gcra, c.cost(p, o)
            assert g is not None
            step = 1.0 / g.rate
            edge = g.tat + q * step - max(step * g.burst, q * step)
            edge = rng.choice((edge, math.nextafter(edge, -math.inf), math.nextafter(edge, math.inf)))
            t = arrive(max(edge, t), p, o)
            continue
        for x in batch:
            p, o = size()
            t = arrive(max(x, t), p, o)
    return times[:n], prompt[:n], out[:n]


CONTRACTS = [
    Contract(requests_per_s=r, burst=b, attainment=0.9)
    for r, b in ((0.5, 1), (1.0, 2), (3.0, 5), (4.0, 20), (7.3, 2.5), (0.001, 3), (1000.0, 50), (0.1, 1))
] + [
    Contract(tokens_per_s=r, burst=b, attainment=0.9)
    for r, b in ((400.0, 600), (3.0, 7), (1e6, 1e5), (0.01, 1000), (333.3, 1234.5))
]


def test_the_contract_script_decides_as_core_classify_on_random_arrivals(rs: RedisServer) -> None:
    rng = random.Random(31)
    cases = [(c, _arrivals(rng, c, 400)) for c in CONTRACTS]

    async def run() -> list[list[bool]]:
        r = aioredis.Redis.from_url(rs.url, decode_responses=True)
        script = r.register_script(_GIVEN_TIMES)
        out = []
        for k, (c, (times, prompt, asked)) in enumerate(cases):
            args: list[Any] = [c.rate, max(1, math.ceil(c.burst))]
            for x, p, o in zip(times, prompt, asked, strict=True):
                args += [x, c.cost(p, o)]
            got = await script(keys=[f"case:{k}"], args=args)
            out.append([ch == "1" for ch in got])
        await r.aclose()
        return out

    got = asyncio.run(run())
    total = 0
    for (c, (times, prompt, asked)), flags in zip(cases, got, strict=True):
        want = classify(c, times, prompt, asked).tolist()
        first = next((i for i, (a, b) in enumerate(zip(flags, want, strict=True)) if a != b), None)
        assert flags == want, f"{c}: first difference at arrival {first} (t={times[first or 0]!r})"
        assert 0 < sum(want) < len(want), f"{c}: all one class, a weak case"
        total += len(want)
    assert total >= 5000


def test_the_contract_script_on_redis_time_replays_with_core_classify(rs: RedisServer) -> None:
    """The production script on Redis's clock: 1500 classifications as fast as one client sends them (most
    within one refill), then the times and numbers it returned, replayed by core's classify: the same classes;
    the times never go back and the numbers count up."""
    c = Contract(requests_per_s=200.0, burst=5, attainment=0.9)
    d = Contract(tokens_per_s=5000.0, burst=300, attainment=0.9)
    rng = random.Random(7)

    async def run() -> list[tuple[int, list[Any]]]:
        r = aioredis.Redis.from_url(rs.url, decode_responses=True)
        script = r.register_script(CONTRACT)
        out = []
        for _ in range(1500):
            which = rng.randrange(2)
            contract = (c, d)[which]
            cost = contract.cost(50, rng.randint(1, 120))
            got = await script(keys=[f"admit:contract:{which}"],
                               args=["classify", contract.rate, max(1, math.ceil(contract.burst)), cost])
            out.append((which, [*got[0], cost]))
        await r.aclose()
        return out

    got = asyncio.run(run())
    for which, contract in enumerate((c, d)):
        mine = [x for w, x in got if w == which]
        flags = [bool(int(x[0])) for x in mine]
        times = [float(x[1]) for x in mine]
        assert [int(x[2]) for x in mine] == list(range(1, len(mine) + 1))
        assert all(b >= a for a, b in itertools.pairwise(times))
        costs = [int(x[4]) for x in mine]
        prompt = [1 if contract.unit == "requests" else k - 1 for k in costs]
        replay = classify(contract, times, prompt, [1] * len(mine))
        assert flags == replay.tolist()
        assert 0 < sum(flags) < len(flags)


def test_the_redis_queue_serves_in_contract_before_excess(rs: RedisServer) -> None:
    """Limit 1 and its slot held: two excess requests queue, then an in-contract one. The freed slot goes to
    the in-contract request, then the excess in arrival order; a full queue refuses (core's bound)."""
    cfg = RedisConfig(url=rs.url, poll_s=0.05)
    tenants = [TenantConfig(name="a", limit=1, max_queue=3, queue_timeout_s=30)]

    async def run() -> tuple[list[str], int]:
        adm = RedisAdmission(tenants, cfg, "one")
        await adm.start()
        try:
            holder = await adm.acquire(0)
            order: list[str] = []

            async def wait(tag: str, in_contract: bool) -> None:
                lease = await adm.acquire(0, in_contract=in_contract)
                order.append(tag)
                await asyncio.sleep(0)
                adm.release(lease)

            jobs = []
            for n, (tag, first) in enumerate((("excess-1", False), ("excess-2", False), ("in", True)), 1):
                jobs.append(asyncio.ensure_future(wait(tag, first)))
                while adm.queue_depth(0) < n:
                    await asyncio.sleep(0.005)
            refused = 0
            try:
                await adm.acquire(0, in_contract=True)
            except Exception:  # Deferred queue-full
                refused = 1
            adm.release(holder)
            await asyncio.wait_for(asyncio.gather(*jobs), 20)
            return order, refused + adm.queue_full[0]
        finally:
            await adm.close()

    order, refused = asyncio.run(run())
    assert order == ["in", "excess-1", "excess-2"]
    assert refused == 2



def test_a_broken_contract_key_is_a_script_error_not_an_outage(rs: RedisServer) -> None:
    """A tenant's contract key holding what the script never writes (a string, not a hash): closed answers
    that request 500 admission-error, open classifies it on the replica's mirror; Redis stays up and the
    other tenant's contract is classified in Redis as before."""
    contract = Contract(requests_per_s=0.001, burst=2, attainment=0.9)
    tenants = [TenantConfig(name=n, limit=2, contract=contract) for n in ("a", "b")]

    async def run(mode: str) -> tuple[list[Any], dict[str, Any]]:
        cfg = RedisConfig(url=rs.url, poll_s=0.05, failure_mode=mode, prefix=mode)
        adm = RedisAdmission(tenants, cfg, mode)
        await adm.start()
        shared = SharedContracts(cfg, ["a", "b"], [contract, contract])
        await shared.attach(adm)
        r = aioredis.Redis.from_url(rs.url)
        await r.set(f"{mode}:contract:a", "not a hash")
        await r.aclose()
        out: list[Any] = []
        try:
            for t in (0, 0, 0, 1):
                try:
                    out.append(await shared.classify(t, 10, 10))
                except AdmissionError as err:
                    out.append((err.status, err.reason))
            return out, {**shared.stats(), "up": adm.up, "script_errors": adm.stats.script_errors}
        finally:
            await adm.close()

    closed, st = asyncio.run(run("closed"))
    assert closed[:3] == [(500, "admission-error")] * 3
    assert closed[3].in_contract and closed[3].seq == 1
    # (the refresh's reads of the broken key are script errors too, one per refresh)
    assert st["up"] and st["script_errors"] >= 3 and st["contracts_fail_open_classified"] == 0
    opened, st = asyncio.run(run("open"))
    assert [(x.in_contract, x.seq) for x in opened[:3]] == [(True, None), (True, None), (False, None)]
    assert opened[3].in_contract and opened[3].seq == 1
    assert st["up"] and st["contracts_fail_open_classified"] == 3
