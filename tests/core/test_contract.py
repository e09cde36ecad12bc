"""core/contract.py: which requests a contract covers (a GCRA charged by in-contract requests only, decided by
arrivals alone), the promise's figures, and the errors of a contract that cannot be written."""

from __future__ import annotations

import math

import numpy as np
import pytest
from admit.core.contract import Contract, ContractMeter, classify, figures, shortfall
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError


def req(rate: float, burst: float, attainment: float = 0.99) -> Contract:
    return Contract(requests_per_s=rate, burst=burst, attainment=attainment)


def test_a_tenant_within_its_contract_is_wholly_in_contract() -> None:
    t = np.arange(200) * 0.25  # 4 req/s, exactly the contract
    assert classify(req(4.0, 1), t, np.ones(200), np.ones(200)).all()


def test_a_burst_is_covered_up_to_the_burst_then_the_rate() -> None:
    t = np.zeros(50)  # 50 at once: the burst of 20 is in contract, the rest is excess
    got = classify(req(4.0, 20), t, np.ones(50), np.ones(50))
    assert got.sum() == 20 and got[:20].all()


def test_excess_charges_nothing_so_the_contracted_rate_stays_in_contract() -> None:
    """A tenant sending ten times its contract for 100 s still has its contract's 4 req/s in contract: the
    excess does not use up the envelope (it would, if every arrival charged it, and then nearly nothing
    would be in contract)."""
    t = np.arange(4000) * 0.025  # 40 req/s
    got = classify(req(4.0, 20), t, np.ones(4000), np.ones(4000))
    assert 4.0 * 100 - 1 <= got.sum() <= 4.0 * 100 + 20
    # in every 10 s window past the burst, the contract's 40 requests (give or take the window's edge)
    per_window = np.add.reduceat(got, np.arange(0, 4000, 400))[1:]
    assert np.all(np.abs(per_window - 40) <= 1)


@settings(max_examples=200, deadline=None)
@given(gaps=st.lists(st.floats(0, 2.0, allow_nan=False), min_size=1, max_size=300),
       rate=st.floats(0.1, 50), burst=st.integers(1, 30))
def test_in_contract_requests_never_exceed_the_envelope_in_any_window(gaps: list[float], rate: float,
                                                                      burst: int) -> None:
    t = np.cumsum(gaps)
    got = classify(req(rate, burst), t, np.ones(len(t)), np.ones(len(t)))
    inside = t[got]
    for i in range(len(inside)):  # any window [inside[i], inside[j]] holds at most burst + rate·span of them
        j = np.arange(i, len(inside))
        assert np.all(j - i + 1 <= burst + rate * (inside[j] - inside[i]) + 1e-6)


def test_a_token_contract_charges_prompt_and_asked_for_output() -> None:
    c = Contract(tokens_per_s=1000, burst=3000, attainment=0.9)
    assert c.unit == "tokens" and c.cost(700, 300) == 1000 and c.requests_per_s_at(500) == 2.0
    got = classify(c, [0.0, 0.0, 0.0, 0.0, 1.0], [700] * 5, [300] * 5)  # 3 fill the burst; 1 s refills one
    assert got.tolist() == [True, True, True, False, True]


def test_the_meter_classifies_one_arrival_at_a_time_as_classify_does() -> None:
    rng = np.random.default_rng(7)
    t = np.cumsum(rng.exponential(0.1, 500))
    p, o = rng.integers(10, 2000, 500), rng.integers(1, 500, 500)
    c = Contract(tokens_per_s=8000, burst=20000, attainment=0.95)
    meter = ContractMeter(c)
    one_by_one = [meter.arrive(float(a), int(x), int(y)) for a, x, y in zip(t, p, o, strict=True)]
    assert one_by_one == classify(c, t, p, o).tolist() and 0 < sum(one_by_one) < 500


def test_the_promise_figures() -> None:
    c = req(1.0, 1, attainment=0.99)
    assert shortfall(c, 100, 99) == 0 and shortfall(c, 100, 97) == 2 and shortfall(c, 101, 99) == 1
    f = figures(c, 200, 190)
    assert f == {"contract_arrived": 200.0, "contract_good": 190.0, "contract_attainment": 0.95,
                 "contract_met": 0.0, "contract_shortfall": 8.0}
    assert figures(c, 0, 0)["contract_met"] == 1.0  # nothing in contract: nothing was promised
    assert figures(None, 10, 5) == {}
    assert math.isclose(figures(req(1.0, 1, 0.9), 10, 9)["contract_attainment"], 0.9)
    assert figures(req(1.0, 1, 0.9), 10, 9)["contract_met"] == 1.0  # exactly the promise keeps it


@pytest.mark.parametrize(("data", "why"), [
    ({"burst": 5, "attainment": 0.9}, "exactly one of requests_per_s and tokens_per_s"),
    ({"requests_per_s": 1, "tokens_per_s": 100, "burst": 5, "attainment": 0.9}, "got both"),
    ({"requests_per_s": 0, "burst": 5, "attainment": 0.9}, "greater than 0"),
    ({"requests_per_s": 1, "burst": 0.5, "attainment": 0.9}, "greater than or equal to 1"),
    ({"requests_per_s": 1, "burst": 5, "attainment": 1.5}, "less than or equal to 1"),
    ({"requests_per_s": 1, "burst": 5, "attainment": 0}, "greater than 0"),
    ({"requests_per_s": float("nan"), "burst": 5, "attainment": 0.9}, "finite number"),
    ({"requests_per_s": 1, "burst": 5}, "attainment"),
    ({"requests_per_s": 1, "burst": 5, "attainment": 0.9, "share": 2}, "Extra inputs are not permitted"),
])
def test_a_contract_that_cannot_be_written_says_why(data: dict, why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        Contract.model_validate(data)


def test_arrivals_out_of_order_or_of_unequal_length_are_refused() -> None:
    with pytest.raises(ValueError, match="in order"):
        classify(req(1.0, 1), [1.0, 0.5], [1, 1], [1, 1])
    with pytest.raises(ValueError, match="differ in length"):
        classify(req(1.0, 1), [0.0, 0.5], [1], [1, 1])
