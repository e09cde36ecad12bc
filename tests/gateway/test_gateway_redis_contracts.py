"""Contracts with gateway replicas on a real redis-server (gateway/redis/contracts.py): one contract envelope
for all replicas, classified on Redis's clock, replayed request by request from the replicas' request logs
with core/contract.py's classify; in-contract requests served before the same tenant's queued excess in a
replica's queue; Redis down: classified on the replica's mirror when failing open, 503 when closed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from admit.core.contract import Contract, classify
from admit.gateway.config import ConfigError, parse_config
from gateway_helpers import CountingMock, GatewayProcess, key, samples, tenant_cfg, wait_for
from redis_helpers import RedisServer

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

# a refill too slow to matter within a test (one request in 1000 s): exactly the burst is in contract, however
# fast or slow the machine sends the requests
SLOW = {"requests_per_s": 0.001, "burst": 4, "attainment": 0.9}
# as tests/gateway/test_gateway_contract_precedence.py: after a first small request, one of more than the
# burst's tokens is excess and one of a few tokens in contract
TOKENS = {"tokens_per_s": 0.01, "burst": 1000, "attainment": 0.9}
BIG = [1] * 1500


@pytest.fixture(scope="module")
def mock() -> Iterator[CountingMock]:
    m = CountingMock(itl_ms=10)
    yield m
    m.stop()


def gateway(tmp: Path, mock: CountingMock, rs: RedisServer, mode: str, contract: dict[str, Any], limit: int = 4,
            wait: bool = True) -> GatewayProcess:
    tmp.mkdir()
    cfg = {"redis": {"url": rs.url, "failure_mode": mode, "lease_ttl_s": 30, "poll_s": 0.05, "timeout_s": 1},
           "tenants": [tenant_cfg("t", limit=limit, max_queue=50, queue_timeout_s=120, contract=contract),
                       tenant_cfg("free", limit=2)]}
    return GatewayProcess(tmp, mock.url, cfg, wait=wait)


async def completion(s: aiohttp.ClientSession, url: str, prompt: object = "x", tokens: int = 2, tag: str = "",
                     tenant: str = "t") -> tuple[int, str | None]:
    body = {"model": "mock", "prompt": prompt, "max_tokens": tokens, "stream": True}
    headers = {"Authorization": f"Bearer {key(tenant)}", "x-admit-step-id": tag}
    async with s.post(url + "/v1/completions", json=body, headers=headers) as resp:
        async for _ in resp.content.iter_any():
            pass
        return resp.status, resp.headers.get("x-admit-reason")


def logged(g: GatewayProcess, n: int) -> list[dict[str, Any]]:
    """The request log's ``n`` lines, once all are written (a line is written as its request finishes)."""
    return list(wait_for(lambda: ls if len(ls := g.request_log()) == n else [], 30, f"{n} request-log lines"))


def test_two_replicas_share_one_contract_envelope(tmp_path: Path, mock: CountingMock, rs: RedisServer) -> None:
    """16 requests sent alternately to two replicas (eight at once each time): exactly the burst (4) is in
    contract, not 4 per replica; the classes of both logs, sorted by (contract_at, contract_seq), are what
    core/contract.py's classify gives on those times, request by request; the /metrics counters of both
    replicas add up to the lines'."""
    g1 = gateway(tmp_path / "g1", mock, rs, "closed", SLOW, wait=False)
    g2 = gateway(tmp_path / "g2", mock, rs, "closed", SLOW, wait=False)
    try:
        g1.ready()
        g2.ready()

        async def run() -> list[tuple[int, str | None]]:
            async with aiohttp.ClientSession() as s:
                out = []
                for rnd in range(2):
                    out += await asyncio.gather(*(completion(s, (g1, g2)[i % 2].url, "hello", 3, f"{rnd}-{i}")
                                                  for i in range(8)))
                out.append(await completion(s, g1.url, tenant="free"))
                return out

        answers = asyncio.run(run())
        lines = logged(g1, 9) + logged(g2, 8)
        metrics = [g1.metrics(), g2.metrics()]
    finally:
        g1.stop()
        g2.stop()
    assert answers == [(200, None)] * 17
    mine = sorted((x for x in lines if x["tenant"] == "t"), key=lambda x: (x["contract_at"], x["contract_seq"]))
    assert sorted(x["contract_seq"] for x in mine) == list(range(1, 17))  # one envelope counted them all
    assert [x["contract_seq"] for x in mine] == list(range(1, 17))  # and its times are in that order
    flags = [x["in_contract"] for x in mine]
    replay = classify(Contract(**SLOW), [x["contract_at"] for x in mine], [x["prompt_tokens"] for x in mine],
                      [3] * len(mine))
    assert flags == replay.tolist()
    assert sum(flags) == 4  # the contract's burst for both replicas together, not 4 each
    free = next(x for x in lines if x["tenant"] == "free")
    assert free["in_contract"] is None and free["contract_seq"] is None
    for cls, n in (("in", 4), ("excess", 12)):  # which replica took the 4 in contract is the race's: maybe one
        assert sum(samples(m, "admit_gateway_contract_requests_total").get((("class", cls), ("tenant", "t")), 0.0)
                   for m in metrics) == n
    assert sum(samples(m, "admit_gateway_contract_good_requests_total").get((("tenant", "t"),), 0.0)
               for m in metrics) == 4
    for m in metrics:  # the lending gauges are on the page with Redis too (nothing in flight now)
        assert samples(m, "admit_gateway_borrowed_concurrency")[(("tenant", "t"),)] == 0


def test_in_contract_is_served_before_the_queued_excess_with_redis(tmp_path: Path, mock: CountingMock,
                                                                   rs: RedisServer) -> None:
    """tests/gateway/test_gateway_contract_precedence.py's scenario on a replica with Redis: limit 1 held by an
    excess request, two excess requests queue, then an in-contract one; when the holder's client leaves, the
    slot goes to the in-contract request, then to the excess in arrival order (the log's lines are in service
    order: with limit 1 each finishes before the next starts)."""
    g = gateway(tmp_path / "g", mock, rs, "closed", TOKENS, limit=1)

    def depth() -> int:
        return int(g.state()["tenants"]["t"]["queue_depth"])

    async def run() -> list[tuple[int, str | None]]:
        async with aiohttp.ClientSession() as s:
            assert await completion(s, g.url, "x", 2, "first") == (200, None)
            holder = asyncio.ensure_future(completion(s, g.url, "x", 20000, "holder"))  # runs for minutes
            await asyncio.to_thread(wait_for, lambda: g.state()["tenants"]["t"]["in_flight"] == 1, 30, "holder")
            jobs = []
            for n, (prompt, tag) in enumerate(((BIG, "excess-1"), (BIG, "excess-2"), ("x", "in-contract")), 1):
                jobs.append(asyncio.ensure_future(completion(s, g.url, prompt, 2, tag)))
                await asyncio.to_thread(wait_for, lambda n=n: depth() == n, 30, f"{tag} queued")
            holder.cancel()
            return await asyncio.gather(*jobs)

    try:
        statuses = asyncio.run(run())
        lines = logged(g, 5)
    finally:
        g.stop()
    assert statuses == [(200, None)] * 3
    holder = [x for x in lines if x["step_id"] == "holder"]
    assert len(holder) == 1 and holder[0]["in_contract"] is False
    served = [(x["step_id"], x["in_contract"], x["outcome"]) for x in lines[1:] if x["step_id"] != "holder"]
    assert served == [("in-contract", True, "ok"), ("excess-1", False, "ok"), ("excess-2", False, "ok")]
    assert all(isinstance(x["contract_seq"], int) for x in lines)  # all classified in Redis


def _down(tmp: Path, mock: CountingMock, rs: RedisServer, mode: str) -> tuple[list[Any], list[dict[str, Any]],
                                                                           dict[str, Any], str]:
    """Two requests with Redis up, Redis killed, three more: the answers of the three, the log, the state."""
    g = gateway(tmp, mock, rs, mode, SLOW)
    try:
        async def run() -> list[tuple[int, str | None]]:
            async with aiohttp.ClientSession() as s:
                for i in range(2):
                    assert await completion(s, g.url, tag=f"up-{i}") == (200, None)
                rs.kill()
                return [await completion(s, g.url, tag=f"down-{i}") for i in range(3)]

        late = asyncio.run(run())
        lines = logged(g, 5)
        return late, lines, g.state(), g.metrics()
    finally:
        g.stop()


def test_redis_down_fail_open_classifies_on_the_replicas_mirror(tmp_path: Path, mock: CountingMock,
                                                                rs: RedisServer) -> None:
    late, lines, state, metrics = _down(tmp_path / "g", mock, rs, "open")
    assert late == [(200, None)] * 3  # served, none lost
    up = [x for x in lines if x["step_id"].startswith("up-")]
    down = sorted((x for x in lines if x["step_id"].startswith("down-")), key=lambda x: x["step_id"])
    assert [x["contract_seq"] for x in sorted(up, key=lambda x: x["contract_seq"])] == [1, 2]
    assert [x["in_contract"] for x in up] == [True, True]
    # on the mirror: the shared envelope had 2 of its 4 left, so two more in contract and then excess
    assert [(x["in_contract"], x["contract_seq"]) for x in down] == [(True, None), (True, None), (False, None)]
    assert all(x["outcome"] == "ok" for x in lines)
    assert state["redis"]["contracts_fail_open_classified"] == 3 and state["redis"]["contracts_classified"] == 2
    counts = samples(metrics, "admit_gateway_contract_requests_total")
    assert counts[(("class", "in"), ("tenant", "t"))] == 4 and counts[(("class", "excess"), ("tenant", "t"))] == 1
    # the three classified on the mirror, on /metrics too; the tenant without a contract has no sample
    assert samples(metrics, "admit_gateway_redis_contracts_fail_open_total") == {(("tenant", "t"),): 3}


def test_redis_down_fail_closed_answers_503(tmp_path: Path, mock: CountingMock, rs: RedisServer) -> None:
    late, lines, state, metrics = _down(tmp_path / "g", mock, rs, "closed")
    assert late == [(503, "admission-unavailable")] * 3
    down = [x for x in lines if x["step_id"].startswith("down-")]
    assert [(x["status"], x["in_contract"]) for x in down] == [(503, None)] * 3  # not classified
    assert state["tenants"]["t"]["fail_closed_deferred"] == 3
    assert 'admit_gateway_deferred_total{reason="admission-unavailable",tenant="t"} 3.0' in metrics
    assert samples(metrics, "admit_gateway_redis_contracts_fail_open_total") == {(("tenant", "t"),): 0}


def test_a_contract_with_redis_is_checked_as_without() -> None:
    redis = {"redis": {"url": "redis://127.0.0.1:6379/0"}}
    ok = {"tenants": [{"name": "t", "api_keys": ["sk-t-secret-key"], "contract": SLOW}]}
    assert parse_config({**ok, **redis}).tenants[0].contract == Contract(**SLOW)
    for bad, why in (({"requests_per_s": 1, "tokens_per_s": 5, "burst": 2, "attainment": 0.9},
                      "exactly one of requests_per_s and tokens_per_s"),
                     ({"requests_per_s": 1, "burst": 0.5, "attainment": 0.9}, "burst"),
                     ({"requests_per_s": 1, "burst": 2, "attainment": 1.5}, "attainment")):
        cfg = {"tenants": [{"name": "t", "api_keys": ["sk-t-secret-key"], "contract": bad}]}
        errors = []
        for given in (cfg, {**cfg, **redis}):
            with pytest.raises(ConfigError, match=why) as err:
                parse_config(given)
            errors.append(str(err.value))
        assert errors[0] == errors[1]
