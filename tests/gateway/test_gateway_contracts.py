"""The gateway's contracts: each request of a tenant with a ``contract:`` is classified in or out of contract
at its arrival by core/contract.py's meter, the code the simulator classifies with, so replaying the times the
request log records for it gives the gateway's classes request by request; /metrics counts them (tested
against the emulator, which counts prompt tokens as the gateway estimates them)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from admit.core.contract import Contract, classify
from admit.gateway.config import ConfigError, parse_config
from emulator_helpers import Emulator, start_emulator
from gateway_helpers import GatewayProcess, key, samples, tenant_cfg, wait_for

CHAT = {"requests_per_s": 1.0, "burst": 2, "attainment": 0.9}
DOCS = {"tokens_per_s": 400.0, "burst": 600, "attainment": 0.9}


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    e = start_emulator()
    yield e
    e.stop()


@pytest.mark.system
@pytest.mark.timeout(300)
def test_the_gateway_classifies_as_the_simulators_meter_does_on_the_same_arrivals(tmp_path: Path,
                                                                                  emu: Emulator) -> None:
    """Ten chat requests at once against a contract of 1 req/s with a burst of 2, and ten documents of about
    160 tokens against 400 tokens/s with a burst of 600: some of each are excess however fast the machine sends
    them (all ten would need 8 s and 12 s of the refill). Every line's class is what the meter gives on the
    log's times and sizes; the counters on /metrics are the lines'."""
    g = GatewayProcess(tmp_path, emu.url, {"tenants": [
        tenant_cfg("chat", limit=4, max_queue=64, contract=CHAT),
        tenant_cfg("docs", limit=4, max_queue=64, contract=DOCS),
        tenant_cfg("free", limit=4)]})
    try:
        model = str(emu.json("GET", "/v1/models")[1]["data"][0]["id"])
        asked = {"chat": 20, "docs": 60, "free": 5}
        prompt = {"chat": "hello " * 10, "docs": "hello " * 100, "free": "hi"}

        def one(tenant: str, i: int) -> None:
            c = openai.OpenAI(base_url=g.url + "/v1", api_key=key(tenant), max_retries=0, timeout=60)
            c.with_options(default_headers={"x-admit-step-id": f"{tenant}-{i}"}).completions.create(
                model=model, prompt=prompt[tenant], max_tokens=asked[tenant])

        jobs = [(t, i) for i in range(10) for t in ("chat", "docs")] + [("free", 0)]
        with ThreadPoolExecutor(10) as pool:
            list(pool.map(lambda j: one(*j), jobs))
        lines = wait_for(lambda: ls if len(ls := g.request_log()) == len(jobs) else [], 20, "every log line")
        metrics = g.metrics()
    finally:
        g.stop()
    assert all(x["outcome"] == "ok" for x in lines)
    assert next(x for x in lines if x["tenant"] == "free")["in_contract"] is None  # no contract, no class
    for tenant, given in (("chat", CHAT), ("docs", DOCS)):
        # in the order and at the times the meter saw them (contract_at: requests read concurrently are
        # classified in another order than they arrived)
        mine = sorted((x for x in lines if x["tenant"] == tenant), key=lambda x: x["contract_at"])
        assert all(x["arrival"] <= x["contract_at"] for x in mine)
        flags = [x["in_contract"] for x in mine]
        replay = classify(Contract(**given), [x["contract_at"] for x in mine], [x["prompt_tokens"] for x in mine],
                          [asked[tenant]] * len(mine))
        assert flags == replay.tolist(), json.dumps(mine, indent=1)
        assert 0 < sum(flags) < len(flags)  # the burst is in contract, not all ten
        counts = samples(metrics, "admit_gateway_contract_requests_total")
        assert counts[(("class", "in"), ("tenant", tenant))] == sum(flags)
        assert counts[(("class", "excess"), ("tenant", tenant))] == len(flags) - sum(flags)
        # no objectives: every completed request is good, so every in-contract one counts
        assert samples(metrics, "admit_gateway_contract_good_requests_total")[(("tenant", tenant),)] == sum(flags)


def test_a_contract_is_taken_with_shared_state_and_a_malformed_one_names_its_fault() -> None:
    base = {"tenants": [{"name": "chat", "api_keys": ["sk-chat-secret-key"], "contract": CHAT}]}
    assert parse_config(base).tenants[0].contract == Contract(**CHAT)
    # with redis the contract is one envelope for all replicas (tests/gateway/test_gateway_redis_contracts.py)
    assert parse_config({**base, "redis": {"url": "redis://127.0.0.1:6379/0"}}).tenants[0].contract == Contract(**CHAT)
    bad = {"tenants": [{"name": "chat", "api_keys": ["sk-chat-secret-key"],
                        "contract": {"requests_per_s": 1, "tokens_per_s": 5, "burst": 2, "attainment": 0.9}}]}
    with pytest.raises(ConfigError, match="exactly one of requests_per_s and tokens_per_s"):
        parse_config(bad)
