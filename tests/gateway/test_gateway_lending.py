"""The gateway's borrowed and lent concurrency on /metrics (core/contract.py's ``nominal_concurrency`` of the
gateway's ControlSpec and ``lending`` on the tenants' requests in flight, read at each scrape) and its count of
good excess requests, against the emulator: real processes on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from admit.core.contract import lending, nominal_concurrency
from admit.gateway.config import parse_config
from admit.gateway.telemetry import gateway_spec
from emulator_helpers import Emulator, start_emulator
from gateway_helpers import GatewayProcess, key, tenant_cfg, wait_for
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

# chat's envelope refills one request per 100 s: its first request is in contract, the next ones are excess
# however slow the machine; docs asks 200 times chat's rate, so its nominal share is most of the total
CHAT = {"requests_per_s": 0.01, "burst": 1, "attainment": 0.9}
DOCS = {"requests_per_s": 2.0, "burst": 4, "attainment": 0.9}
TENANTS = ("chat", "docs", "free")


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    e = start_emulator()
    yield e
    e.stop()


def gauges(text: str, name: str) -> dict[str, float]:
    return {s.labels["tenant"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name}


async def completion(s: aiohttp.ClientSession, url: str, model: str, tenant: str, tokens: int) -> int:
    body = {"model": model, "prompt": "hi", "max_tokens": tokens, "stream": True, "ignore_eos": True}
    async with s.post(url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key(tenant)}"}) as r:
        async for _ in r.content.iter_any():
            pass
        return r.status


def test_metrics_show_what_the_tenant_without_a_contract_borrows_and_the_idle_shares_lend(
        tmp_path: Path, emu: Emulator) -> None:
    config = {"tenants": [tenant_cfg("chat", limit=6, max_queue=16, contract=CHAT),
                          tenant_cfg("docs", limit=6, max_queue=16, contract=DOCS),
                          tenant_cfg("free", limit=6, max_queue=16)]}
    # C = 3 tenants × 6; live the shares follow the contracted requests/s: chat 0.01/2.01 of 18 rounds to 0, so
    # limits.min (1); docs 17.91, 18; free has no contract, so 0
    nominal = nominal_concurrency(gateway_spec(parse_config(config)))
    assert nominal == [1, 18, 0]
    g = GatewayProcess(tmp_path, emu.url, config)
    try:
        model = str(emu.json("GET", "/v1/models")[1]["data"][0]["id"])
        idle = g.metrics()
        for name in ("admit_gateway_borrowed_concurrency", "admit_gateway_lent_concurrency"):
            assert gauges(idle, name) == dict.fromkeys(TENANTS, 0.0)  # nobody borrows: nothing is lent

        async def run() -> str:
            async with aiohttp.ClientSession() as s:
                for _ in range(3):  # one after another: chat's first is in contract, the other two excess
                    assert await completion(s, g.url, model, "chat", 2) == 200
                holders = [asyncio.ensure_future(completion(s, g.url, model, "free", 4000)) for _ in range(3)]

                def busy() -> str:
                    page = g.metrics()
                    return page if gauges(page, "admit_gateway_in_flight")["free"] == 3 else ""

                page = await asyncio.to_thread(wait_for, busy, 60, "three of free's requests in flight")
                for h in holders:
                    h.cancel()  # the clients leave: the gateway releases their slots
                await asyncio.gather(*holders, return_exceptions=True)
                return page

        page = asyncio.run(run())
        after = wait_for(lambda: p if gauges(p := g.metrics(), "admit_gateway_in_flight")["free"] == 0 else "", 60,
                         "free's requests released")
    finally:
        g.stop()
    in_flight = gauges(page, "admit_gateway_in_flight")
    assert in_flight == {"chat": 0.0, "docs": 0.0, "free": 3.0}
    borrowed, lent = lending([in_flight[t] for t in TENANTS], nominal)
    assert gauges(page, "admit_gateway_borrowed_concurrency") == dict(zip(TENANTS, borrowed.tolist(), strict=True))
    assert gauges(page, "admit_gateway_lent_concurrency") == dict(zip(TENANTS, lent.tolist(), strict=True))
    # free borrows its three; the idle shares (1 and 18) lend them in proportion
    assert borrowed.tolist() == [0, 0, 3] and lent.tolist() == pytest.approx([3 / 19, 54 / 19, 0])
    assert gauges(after, "admit_gateway_borrowed_concurrency") == dict.fromkeys(TENANTS, 0.0)
    # no objectives: every completed request is good; chat's excess ones are counted apart from its promise
    good_in = {s.labels["tenant"]: s.value for f in text_string_to_metric_families(after) for s in f.samples
               if s.name == "admit_gateway_contract_good_requests_total"}
    excess = {s.labels["tenant"]: s.value for f in text_string_to_metric_families(after) for s in f.samples
              if s.name == "admit_gateway_contract_excess_good_requests_total"}
    assert good_in == {"chat": 1.0} and excess == {"chat": 2.0}


def test_without_contracts_the_page_has_no_lending(tmp_path: Path, emu: Emulator) -> None:
    g = GatewayProcess(tmp_path, emu.url, {"tenants": [tenant_cfg("a", limit=2), tenant_cfg("b", limit=2)]})
    try:
        page = g.metrics()
    finally:
        g.stop()
    assert "admit_gateway_in_flight" in page
    assert "borrowed_concurrency" not in page and "lent_concurrency" not in page
    # like the other contract counters, the family is described but has no sample
    assert not [s for f in text_string_to_metric_families(page) for s in f.samples
                if s.name == "admit_gateway_contract_excess_good_requests_total"]
