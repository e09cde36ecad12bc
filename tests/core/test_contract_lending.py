"""Borrowed and lent concurrency (core/contract.py ``lending``) and each tenant's nominal share of the
deployment's concurrency (``nominal_concurrency``), as properties of the arithmetic."""

from __future__ import annotations

import numpy as np
import pytest
from admit.controllers.contracts_field import ShareStaticController
from admit.core.contract import Contract, lending, nominal_concurrency
from admit.core.spec import ControlSpec, Limits, TenantSpec
from hypothesis import given, settings
from hypothesis import strategies as st

counts = st.integers(min_value=0, max_value=200)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(counts, counts), min_size=1, max_size=8))
def test_lent_sums_to_what_is_borrowed_or_to_the_idle_share_whichever_is_less(rows: list[tuple[int, int]]) -> None:
    in_flight = [a for a, _ in rows]
    nominal = [b for _, b in rows]
    borrowed, lent = lending(in_flight, nominal)
    idle = [max(0, n - x) for x, n in zip(in_flight, nominal, strict=True)]
    assert borrowed.tolist() == [max(0, x - n) for x, n in zip(in_flight, nominal, strict=True)]
    assert lent.sum() == pytest.approx(min(borrowed.sum(), sum(idle)), rel=1e-12, abs=1e-12)
    assert all(0 <= v <= i + 1e-12 for v, i in zip(lent.tolist(), idle, strict=True))  # never more than it has idle
    assert all(v == 0 for v, i in zip(lent.tolist(), idle, strict=True) if i == 0)  # only idle shares lend
    if borrowed.sum() == 0:
        assert lent.tolist() == [0.0] * len(rows)  # nobody borrows: nothing is lent
    if borrowed.sum() >= sum(idle):
        assert lent.tolist() == [float(i) for i in idle]  # every idle share is in use


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=6), st.data())
def test_rows_of_decisions_are_each_their_own_division(n: int, data: st.DataObject) -> None:
    rows = data.draw(st.lists(st.lists(counts, min_size=n, max_size=n), min_size=1, max_size=5))
    nominal = data.draw(st.lists(counts, min_size=n, max_size=n))
    borrowed, lent = lending(np.array(rows), nominal)
    for j, row in enumerate(rows):
        b, le = lending(row, nominal)
        assert borrowed[j].tolist() == b.tolist() and lent[j].tolist() == le.tolist()


def test_idle_shares_lend_in_proportion_when_the_borrowers_use_part_of_them() -> None:
    borrowed, lent = lending([0, 2, 13], [8, 4, 0])  # idle 8 and 2, borrowed 13 > 10: all of it lent
    assert borrowed.tolist() == [0, 0, 13] and lent.tolist() == [8, 2, 0]
    borrowed, lent = lending([0, 2, 5], [8, 4, 0])  # borrowed 5 of the idle 10: half of each idle share
    assert borrowed.tolist() == [0, 0, 5] and lent.tolist() == [4, 1, 0]


def _spec(contracts: list[Contract | None], loads: list[float | None], initial: int = 16) -> ControlSpec:
    tenants = [TenantSpec(name=f"t{i}", slo_e2e_p99_s=10.0, slo_ttft_p99_s=1.0, contract=c, contract_load=x)
               for i, (c, x) in enumerate(zip(contracts, loads, strict=True))]
    return ControlSpec(tenants=tuple(tenants), limits=Limits(min=1, max=64, initial=initial, max_step=4))


CONTRACT = Contract(requests_per_s=2.0, burst=4, attainment=0.9)


@pytest.mark.parametrize("loads", [[0.3, 0.2, None], [None, None, None]])  # the simulator's, and live (no loads)
def test_a_contracted_tenants_nominal_is_the_cap_static_share_deploys_and_others_have_none(
        loads: list[float | None]) -> None:
    other = Contract(tokens_per_s=3000.0, burst=9000, attainment=0.99)
    spec = _spec([CONTRACT, other, None], loads)
    ctrl = ShareStaticController()
    ctrl.reset(spec, 0)
    nominal = nominal_concurrency(spec)
    assert nominal[:2] == ctrl.cap[:2] and nominal[2] == 0 and all(x > 0 for x in nominal[:2])


def test_without_contracts_every_nominal_is_zero() -> None:
    assert nominal_concurrency(_spec([None, None], [None, None])) == [0, 0]
