"""The admission core's two classes per tenant: in-contract requests before the same tenant's excess."""

import math

import pytest
from admit.core.admission import AdmissionCore, Offer, QueueConfig
from hypothesis import given, settings
from hypothesis import strategies as st


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make(limit=1, max_queue=10, timeout=10.0, n=1):
    clock = Clock()
    return AdmissionCore([QueueConfig(limit=limit, max_queue=max_queue, queue_timeout_s=timeout)] * n, clock), clock


def test_a_later_in_contract_item_overtakes_the_tenants_queued_excess():
    core, clock = make(limit=1)
    assert core.offer(0, "running") is Offer.ADMITTED
    clock.t = 1.0
    assert core.offer(0, "x1", in_contract=False) is Offer.QUEUED
    clock.t = 2.0
    assert core.offer(0, "x2", in_contract=False) is Offer.QUEUED
    clock.t = 3.0
    assert core.offer(0, "c1") is Offer.QUEUED
    clock.t = 4.0
    assert core.offer(0, "c2", in_contract=True) is Offer.QUEUED
    assert core.queue_depth(0) == 4
    clock.t = 5.0
    order = []
    for _ in range(4):
        payload, waited = core.release(0)
        order.append((payload, waited))
    # in contract first, oldest first in each class; the waits are each item's own
    assert order == [("c1", 2.0), ("c2", 1.0), ("x1", 4.0), ("x2", 3.0)]
    assert core.release(0) is None and core.queue_depth(0) == 0


def test_in_contract_items_never_overtake_another_tenants_excess():
    core, _ = make(limit=1, n=2)
    core.offer(0, "a0")
    core.offer(1, "b0")
    core.offer(1, "b-excess", in_contract=False)
    core.offer(0, "a-in")
    # each tenant's slot goes to its own queue: tenant 1's excess is not held back by tenant 0's contract
    assert core.release(1) == ("b-excess", 0.0)
    assert core.release(0) == ("a-in", 0.0)
    assert core.in_flight(0) == core.in_flight(1) == 1


def test_set_limit_dispatches_in_contract_first_then_excess():
    core, _ = make(limit=0)
    core.offer(0, "x1", in_contract=False)
    core.offer(0, "c1")
    core.offer(0, "x2", in_contract=False)
    core.offer(0, "c2")
    assert [p for p, _ in core.set_limit(0, 3)] == ["c1", "c2", "x1"]
    assert core.queue_depth(0) == 1


def test_max_queue_bounds_both_classes_together():
    core, _ = make(limit=0, max_queue=2)
    assert core.offer(0, "x", in_contract=False) is Offer.QUEUED
    assert core.offer(0, "c") is Offer.QUEUED
    assert core.offer(0, "c2") is Offer.REJECTED
    assert core.offer(0, "x2", in_contract=False) is Offer.REJECTED
    assert core.counters(0) == {"admitted": 0, "rejected": 2, "dropped": 0}


def test_an_offer_waits_behind_queued_excess_only_for_a_slot():
    # with a free slot and only excess waiting (reachable after a dispatch found only late items), nothing is
    # admitted past the queues; the invariant "queued work means no free slot" makes this state transient
    core, clock = make(limit=1, timeout=1.0)
    core.offer(0, "run")
    core.offer(0, "x", in_contract=False)
    assert core.next_deadline() == 1.0
    clock.t = 2.0
    assert core.release(0) is None  # the excess item timed out: reported as late, not dispatched
    assert core.offer(0, "c") is Offer.ADMITTED
    assert [p for _, p, _ in core.expire()] == ["x"]


def test_both_classes_time_out_and_next_deadline_sees_both_heads():
    core, clock = make(limit=1, timeout=3.0, n=2)
    core.offer(0, "run")
    clock.t = 1.0
    core.offer(0, "x", in_contract=False)
    clock.t = 2.0
    core.offer(0, "c")
    assert core.next_deadline() == 4.0  # the excess head, the older one
    clock.t = 4.0
    assert core.expire() == [(0, "x", 3.0)]
    assert core.next_deadline() == 5.0  # now the in-contract head
    clock.t = 5.5
    assert core.expire() == [(0, "c", 3.5)]
    assert core.counters(0)["dropped"] == 2 and core.queue_depth(0) == 0
    assert core.next_deadline() == math.inf


def test_a_dispatch_skips_late_items_of_both_classes_and_reports_them():
    core, clock = make(limit=1, timeout=1.0)
    core.offer(0, "run")
    core.offer(0, "c-late")
    core.offer(0, "x-late", in_contract=False)
    clock.t = 0.5
    core.offer(0, "x-fresh", in_contract=False)
    clock.t = 1.2
    assert core.release(0) == ("x-fresh", pytest.approx(0.7))
    assert core.next_deadline() == -math.inf
    assert [p for _, p, _ in core.expire()] == ["c-late", "x-late"]


def test_cancel_finds_a_payload_in_either_queue():
    core, _ = make(limit=0)
    core.offer(0, "c")
    core.offer(0, "x", in_contract=False)
    assert core.cancel(0, "x") is True
    assert core.cancel(0, "x") is False
    assert core.cancel(0, "c") is True
    assert core.queue_depth(0) == 0 and core.queued == 0
    assert core.next_deadline() == math.inf


ops = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), st.integers(0, 1), st.booleans()),
        st.tuples(st.just("release"), st.integers(0, 1)),
        st.tuples(st.just("limit"), st.integers(0, 1), st.integers(0, 4)),
        st.tuples(st.just("tick"), st.floats(0.0, 2.0)),
    ),
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_the_core_is_a_two_class_fifo_for_any_operation_sequence(seq):
    """Against a plain model: per tenant, a list per class; a freed slot takes the first live in-contract item,
    else the first live excess item; items past their deadline are dropped whenever they are met."""
    timeout = 1.5
    core, clock = make(limit=2, max_queue=3, timeout=timeout, n=2)
    model = [([], []) for _ in range(2)]  # per tenant: (in contract, excess) lists of (deadline, payload)
    in_flight = [0, 0]
    limit = [2, 2]
    serial = 0

    def take(i):
        for q in model[i]:
            while q:
                deadline, p = q.pop(0)
                if deadline >= clock.t:
                    return p
        return None

    for op in seq:
        if op[0] == "offer":
            _, i, inside = op
            serial += 1
            p = (i, serial, inside)
            got = core.offer(i, p, in_contract=inside)
            depth = len(model[i][0]) + len(model[i][1])
            if in_flight[i] < limit[i] and depth == 0:
                assert got is Offer.ADMITTED
                in_flight[i] += 1
            elif depth >= 3:
                assert got is Offer.REJECTED
            else:
                assert got is Offer.QUEUED
                model[i][0 if inside else 1].append((clock.t + timeout, p))
        elif op[0] == "release" and in_flight[op[1]] > 0:
            i = op[1]
            in_flight[i] -= 1
            got = core.release(i)
            want = take(i) if in_flight[i] < limit[i] else None
            assert (got[0] if got else None) == want
            if want is not None:
                in_flight[i] += 1
        elif op[0] == "limit":
            _, i, lim = op
            limit[i] = lim
            got = [p for p, _ in core.set_limit(i, lim)]
            want = []
            while in_flight[i] < lim and (p := take(i)) is not None:
                want.append(p)
                in_flight[i] += 1
            assert got == want
        elif op[0] == "tick":
            clock.t += op[1]
            core.expire()
            for i in range(2):
                for q in model[i]:
                    q[:] = [(d, p) for d, p in q if d > clock.t]
        for i in range(2):
            assert core.in_flight(i) == in_flight[i]
            assert core.queue_depth(i) == len(model[i][0]) + len(model[i][1])


def test_take_hands_a_slot_granted_elsewhere_to_the_next_in_line():
    """A backend that keeps the slots elsewhere (Redis) uses the core with limit 0 for its queues only: take()
    gives the oldest in-contract item, else the oldest excess one, skips an expired one (handed out by the
    next expire()), and counts nothing in flight."""
    core, clock = make(limit=0, max_queue=3, timeout=10.0)
    assert core.offer(0, "x1", in_contract=False) is Offer.QUEUED  # limit 0: never admitted here
    clock.t = 1.0
    assert core.offer(0, "x2", in_contract=False) is Offer.QUEUED
    clock.t = 2.0
    assert core.offer(0, "c1") is Offer.QUEUED
    assert core.offer(0, "c2") is Offer.REJECTED  # one bound for both queues
    clock.t = 10.5  # x1 is past its deadline (10.0)
    assert core.take(0) == ("c1", 8.5)
    assert core.take(0) == ("x2", 9.5)
    assert core.take(0) is None
    assert core.in_flight(0) == 0 and core.queue_depth(0) == 0
    assert core.expire() == [(0, "x1", 10.5)]
