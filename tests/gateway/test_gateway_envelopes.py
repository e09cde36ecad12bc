"""Rate envelopes: the GCRA arithmetic on an injected clock, and 429 envelope-empty through the gateway."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator

import pytest
from admit.core.gcra import Gcra
from admit.gateway.config import EnvelopeConfig
from admit.gateway.envelopes import Charge, Deferral, EnvelopeBook
from gateway_helpers import CountingMock, GatewayProcess, http, key, tenant_cfg, wait_for

# generous: it bounds a hang; a loaded 2-core machine takes many seconds to start each process
pytestmark = [pytest.mark.system, pytest.mark.timeout(180)]


def test_gcra_burst_then_rate() -> None:
    g = Gcra(rate=2.0, burst=3, now=0.0)
    assert [g.spend(1, 0.0).allowed for _ in range(4)] == [True, True, True, False]
    denied = g.spend(1, 0.0)
    assert denied.retry_after_s == pytest.approx(0.5)  # one unit refills every 1/rate s
    assert not g.spend(1, 0.49).allowed
    assert g.spend(1, 0.5).allowed
    assert g.remaining(0.5) == pytest.approx(0.0)
    assert g.remaining(2.0) == pytest.approx(3.0)  # full again after burst/rate


def test_gcra_weighted_spend_and_refund() -> None:
    g = Gcra(rate=100.0, burst=200, now=10.0)
    assert g.spend(150, 10.0).allowed
    res = g.spend(100, 10.0)
    assert not res.allowed and res.retry_after_s == pytest.approx(0.5)  # 50 left, 50 more need 0.5 s
    g.refund(150, 10.0)
    assert g.remaining(10.0) == pytest.approx(200)


def test_gcra_oversize_spend_passes_only_when_full_and_leaves_debt() -> None:
    g = Gcra(rate=10.0, burst=5, now=0.0)
    assert g.spend(20, 0.0).allowed  # larger than the burst: allowed from a full bucket
    res = g.spend(1, 0.0)
    assert not res.allowed and res.retry_after_s == pytest.approx(1.6)  # 2 s of debt minus the 0.5 s burst window


def test_a_full_bucket_passes_one_spend_of_its_burst_or_more_at_any_clock_value() -> None:
    """The test is made on the debt, not the clock: where a spend's seconds (q*T) exceed the clock's value (a
    monotonic clock counts from boot), ``(now + q*T) - q*T`` can round above ``now`` and deferred such a spend
    from a full bucket (by 1e-13 s), about one in four at 0.001/s with a burst of 1."""
    rng = random.Random(7)
    for _ in range(20_000):
        now = rng.uniform(0, 1e5) if rng.random() < 0.9 else rng.uniform(1e5, 1e9)
        rate, burst = rng.choice([(0.001, 1), (1.0, 1), (2.0, 600), (0.37, 5), (0.01, 3)])
        for qty in (burst, burst * 3.7):
            assert Gcra(rate, burst, now).spend(qty, now).allowed, (now, rate, burst, qty)


def test_gcra_reconfigure_raise_frees_budget_at_once() -> None:
    # the gateway test's 'rated' envelope, drained, then opened up: only the 2 units spent are kept as debt
    g = Gcra(rate=0.5, burst=2, now=0.0)
    assert g.spend(2, 0.0).allowed
    g.reconfigure(rate=1000.0, burst=1000, now=0.0)
    assert g.remaining(0.0) == pytest.approx(998)  # kept in time (4 s at 1000/s) it would be 0
    assert g.spend(1, 0.0).allowed
    # partly used: the debt in units (3), refilled at the new rate from there
    g = Gcra(rate=1.0, burst=4, now=10.0)
    g.spend(3, 10.0)
    g.reconfigure(rate=2.0, burst=8, now=10.0)
    assert g.remaining(10.0) == pytest.approx(5)  # the used fraction (3/4) would leave 2
    assert g.remaining(11.0) == pytest.approx(7)
    assert g.remaining(11.5) == pytest.approx(8)
    # a raise of the rate alone keeps the units and refills faster
    g = Gcra(rate=1.0, burst=4, now=0.0)
    g.spend(4, 0.0)
    g.reconfigure(rate=4.0, burst=4, now=1.0)  # 3 units of debt left after 1 s at the old rate
    assert g.remaining(1.0) == pytest.approx(1)
    assert g.remaining(1.5) == pytest.approx(3)


def test_gcra_reconfigure_cut_never_exceeds_the_new_burst() -> None:
    g = Gcra(rate=10.0, burst=100, now=0.0)
    g.spend(30, 0.0)  # 70 left
    g.reconfigure(rate=1.0, burst=50, now=0.0)
    assert g.remaining(0.0) == pytest.approx(20)  # 50 - the 30 spent: not 50 (fresh), not 70 (what was left)
    assert g.remaining(10.0) == pytest.approx(30)  # the new, slower refill
    g.reconfigure(rate=1.0, burst=10, now=10.0)  # 20 units of debt, more than the new burst: capped to it
    assert g.remaining(10.0) == pytest.approx(0)
    assert not g.spend(1, 10.0).allowed
    assert g.remaining(20.0) == pytest.approx(10)  # the cap bounds the stall to one new burst's refill
    full = Gcra(rate=10.0, burst=100, now=0.0)
    full.reconfigure(rate=10.0, burst=5, now=0.0)
    assert full.remaining(0.0) == pytest.approx(5)
    # both directions over many configurations: never more than the new burst; a raise of the burst adds
    # exactly what it adds to what was left (when the debt was within the old burst); a cut of the burst
    # never leaves more than was left
    rng = random.Random(7)
    for _ in range(2000):
        rate, burst = rng.uniform(0.01, 100), rng.randint(1, 500)
        g = Gcra(rate, burst, now=0.0)
        g.spend(rng.uniform(0, 2 * burst), 0.0)  # up to an oversize spend's debt (allowed from full)
        now = rng.uniform(0, 2 * burst / rate)
        before = g.remaining(now)
        new_rate, new_burst = rng.uniform(0.01, 100), rng.randint(1, 500)
        g.reconfigure(new_rate, new_burst, now)
        after = g.remaining(now)
        assert 0 <= after <= new_burst + 1e-9
        if new_burst >= burst and before > 0:
            assert after == pytest.approx(before + new_burst - burst, abs=1e-6)
        elif new_burst < burst:
            assert after <= before + 1e-6


def test_gcra_reconfigure_unchanged_changes_nothing() -> None:
    g = Gcra(rate=10.0, burst=5, now=0.0)
    g.spend(20, 0.0)  # an oversize spend: 20 units of debt, beyond the burst
    tat = g.tat
    g.reconfigure(rate=10.0, burst=5, now=0.5)
    assert g.tat == tat  # not capped to one burst: the same parameters forgive nothing
    with pytest.raises(ValueError):
        g.reconfigure(rate=0.0, burst=5, now=0.5)
    assert (g.rate, g.burst, g.tat) == (10.0, 5, tat)  # a refused change leaves the bucket as it was


def test_gcra_force_goes_into_debt_and_the_rate_holds() -> None:
    g = Gcra(rate=10.0, burst=20, now=0.0)
    g.force(50, 0.0)  # beyond the burst: the work ran already
    assert g.remaining(0.0) == 0
    res = g.spend(1, 0.0)
    assert not res.allowed and res.retry_after_s == pytest.approx(3.1)  # 50 - 20 + 1 units at 10/s
    assert g.spend(1, 3.1).allowed
    g.force(5, 100.0)  # on a full bucket it is a spend that cannot be refused
    assert g.remaining(100.0) == pytest.approx(15)
    g.refund(5, 100.0)
    assert g.remaining(100.0) == pytest.approx(20)


def test_book_settle_charges_the_real_tokens_and_leaves_requests() -> None:
    alerts: list[tuple[str, str, str, float]] = []
    book = EnvelopeBook(on_alert=lambda *a: alerts.append(a))
    book.configure("t", EnvelopeConfig(target="*", requests_per_s=1, request_burst=10), 0.0)
    book.configure("t", EnvelopeConfig(target="m", tokens_per_s=10, token_burst=100,
                                       requests_per_s=1, request_burst=10), 0.0)
    charge = book.charge("t", "m", 20, 0.0)
    assert isinstance(charge, Charge)
    env_any, env_m = book.envelopes("t")
    book.settle(charge, 90, 0.0)  # 70 more than charged up front
    assert env_m.buckets["tokens"].remaining(0.0) == pytest.approx(10)
    assert env_m.buckets["requests"].remaining(0.0) == pytest.approx(9)  # one request, whatever it generated
    assert env_any.buckets["requests"].remaining(0.0) == pytest.approx(9)
    assert alerts == [("t", "m", "tokens", pytest.approx(0.1))]  # below alert_below (0.2) after the settle
    big = book.charge("t", "m", 5, 0.0)
    assert isinstance(big, Charge)
    book.settle(big, 300, 0.0)  # far beyond the burst: forced, a debt the rate pays off
    assert env_m.buckets["tokens"].remaining(0.0) == 0
    denied = book.charge("t", "m", 1, 0.0)
    assert isinstance(denied, Deferral) and denied.unit == "tokens"
    # 90 spent by the first, 300 by the second, 1 more asked, against a burst of 100, at 10 tokens/s
    assert denied.retry_after_s == pytest.approx((90 + 300 + 1 - 100) / 10)
    refunded = EnvelopeBook()
    refunded.configure("t", EnvelopeConfig(target="*", tokens_per_s=10, token_burst=100), 0.0)
    c = refunded.charge("t", "m", 80, 0.0)
    assert isinstance(c, Charge)
    refunded.settle(c, 30, 0.0)  # fewer than charged: the difference comes back
    assert refunded.envelopes("t")[0].buckets["tokens"].remaining(0.0) == pytest.approx(70)
    refunded.settle(Charge(()), 1000, 0.0)  # a request no envelope charged: nothing to settle


def test_book_checks_all_envelopes_before_charging_and_alerts_once() -> None:
    alerts: list[tuple[str, str, str, float]] = []
    book = EnvelopeBook(on_alert=lambda *a: alerts.append(a))
    book.configure("t", EnvelopeConfig(target="*", requests_per_s=1, request_burst=10), 0.0)
    book.configure("t", EnvelopeConfig(target="m", tokens_per_s=10, token_burst=100), 0.0)
    assert isinstance(book.charge("t", "m", 70, 0.0), Charge)
    denied = book.charge("t", "m", 70, 0.0)
    assert isinstance(denied, Deferral) and denied.unit == "tokens" and denied.target == "m"
    assert denied.retry_after_s == pytest.approx(4.0)
    env_any = book.envelopes("t")[0]
    assert env_any.buckets["requests"].remaining(0.0) == pytest.approx(9)  # the deferral spent nothing
    assert isinstance(book.charge("t", "other", 10**6, 0.0), Charge)  # only '*' applies to another model
    assert alerts == []
    for _ in range(8):
        book.charge("t", "other", 0, 0.0)
    assert [(a[0], a[1], a[2]) for a in alerts] == [("t", "*", "requests")]  # fired once, not per request
    assert env_any.state(0.0)["in_backoff"] is True  # the token deferral put both envelopes into backoff


@pytest.fixture(scope="module")
def gw(mock: CountingMock, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    cfg = {"tenants": [
        tenant_cfg("rated", limit=8, envelopes=[{"target": "*", "requests_per_s": 0.5, "request_burst": 2}]),
        tenant_cfg("tokens", limit=8, envelopes=[{"target": "mock", "tokens_per_s": 50, "token_burst": 200}]),
    ]}
    g = GatewayProcess(tmp_path_factory.mktemp("gw"), mock.url, cfg)
    yield g
    g.stop()


def post(gw: GatewayProcess, tenant: str, max_tokens: int = 2) -> tuple[int, dict[str, str], bytes]:
    return http("POST", gw.url + "/v1/completions", {"model": "mock", "prompt": "x", "max_tokens": max_tokens},
                {"Authorization": f"Bearer {key(tenant)}"})


def test_request_envelope_defers_with_retry_after(gw: GatewayProcess) -> None:
    t0 = time.monotonic()
    assert post(gw, "rated")[0] == 200
    assert post(gw, "rated")[0] == 200
    status, headers, body = post(gw, "rated")
    elapsed = time.monotonic() - t0
    assert status == 429 and headers["x-admit-reason"] == "envelope-empty"
    # 0.5 requests/s, burst 2: the next unit comes 2 s after the first request was charged, which was at most
    # `elapsed` ago (a few ms on a quiet machine; a loaded one may take longer, and the bound follows it).
    # The ms header is exact; Retry-After is the same in whole seconds, rounded up.
    retry_ms = int(headers["x-admit-retry-after-ms"])
    assert 2000 - 1000 * elapsed <= retry_ms <= 2000, (retry_ms, elapsed)
    assert headers["retry-after"] == str(math.ceil(retry_ms / 1000))
    assert b'"reason":"envelope-empty"' in body
    env = gw.state()["tenants"]["rated"]["envelopes"][0]
    assert env["in_backoff"] and env["deferred"] == 1 and env["requests"]["remaining"] < 1
    metrics = gw.metrics()
    assert 'admit_gateway_deferred_total{reason="envelope-empty",tenant="rated"} 1.0' in metrics
    assert 'admit_gateway_envelope_alerts_total{target="*",tenant="rated",unit="requests"} 1.0' in metrics
    assert 'admit_gateway_envelope_remaining{target="*",tenant="rated",unit="requests"}' in metrics
    wait_for(lambda: "envelope near exhaustion: tenant=rated" in gw.stderr(), 20, "the alert log line")


def test_token_envelope_counts_prompt_and_max_tokens(gw: GatewayProcess) -> None:
    assert post(gw, "tokens", max_tokens=150)[0] == 200  # ~151 of 200
    status, headers, _ = post(gw, "tokens", max_tokens=150)
    assert status == 429 and headers["x-admit-reason"] == "envelope-empty"
    assert post(gw, "tokens", max_tokens=20)[0] == 200  # a small one still fits: the deferral spent nothing


def test_envelope_changed_through_admin_api_applies_at_once(gw: GatewayProcess) -> None:
    status, body = gw.admin("PUT", "/admin/tenants/rated/envelopes/*",
                            {"requests_per_s": 1000, "request_burst": 1000, "reason": "open up"}, actor="ctl")
    assert status == 200, body
    # the raise applies at once: the drained bucket (burst 2, 0.5/s) keeps its 2 units of debt, not its time
    assert gw.state()["tenants"]["rated"]["envelopes"][0]["requests"]["remaining"] >= 997
    assert [post(gw, "rated")[0] for _ in range(3)] == [200] * 3
    status, body = gw.admin("PUT", "/admin/tenants/rated/envelopes/*", {"requests_per_s": -1})
    assert status == 400 and "requests_per_s" in body["error"]["message"]
    audit = [x for x in gw.audit_log() if x["what"] == "envelope"]
    assert audit[-1]["new"]["requests_per_s"] == 1000 and audit[-1]["old"]["requests_per_s"] == 0.5
    assert audit[-1]["actor"] == "ctl"
    status, _ = gw.admin("DELETE", "/admin/tenants/rated/envelopes/*")
    assert status == 200 and gw.state()["tenants"]["rated"]["envelopes"] == []
