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


def make(limit=2, max_queue=3, timeout=3.0, n=1):
    clock = Clock()
    cfg = QueueConfig(limit=limit, max_queue=max_queue, queue_timeout_s=timeout)
    return AdmissionCore([cfg] * n, clock), clock


def test_admits_up_to_limit_then_queues_then_rejects():
    core, _ = make(limit=2, max_queue=1)
    assert core.offer(0, "a") is Offer.ADMITTED
    assert core.offer(0, "b") is Offer.ADMITTED
    assert core.offer(0, "c") is Offer.QUEUED
    assert core.offer(0, "d") is Offer.REJECTED
    assert core.in_flight(0) == 2 and core.queue_depth(0) == 1
    assert core.counters(0) == {"admitted": 2, "rejected": 1, "dropped": 0}


def test_release_dispatches_in_fifo_order_and_reports_wait():
    core, clock = make(limit=1, max_queue=5)
    core.offer(0, "a")
    clock.t = 1.0
    core.offer(0, "b")
    clock.t = 1.5
    core.offer(0, "c")
    clock.t = 2.0
    payload, waited = core.release(0)
    assert payload == "b" and waited == pytest.approx(1.0)
    clock.t = 2.25
    assert core.release(0) == ("c", pytest.approx(0.75))
    assert core.release(0) is None
    assert core.in_flight(0) == 0


def test_timeout_drops_and_next_deadline():
    core, clock = make(limit=1, timeout=3.0)
    core.offer(0, "a")
    clock.t = 1.0
    core.offer(0, "b")
    assert core.next_deadline() == pytest.approx(4.0)
    clock.t = 3.9
    assert core.expire() == []
    clock.t = 4.0
    dropped = core.expire()
    assert [(t, p) for t, p, _ in dropped] == [(0, "b")]
    assert core.counters(0)["dropped"] == 1
    assert core.next_deadline() == math.inf


def test_expired_head_is_never_dispatched_and_is_reported_as_a_drop():
    core, clock = make(limit=1, max_queue=5, timeout=1.0)
    core.offer(0, "a")
    core.offer(0, "late")
    clock.t = 0.5
    core.offer(0, "fresh")
    clock.t = 1.2  # "late" is past its deadline (1.0), "fresh" is not (1.5)
    assert core.release(0)[0] == "fresh"
    assert core.next_deadline() == -math.inf  # something to report now
    assert [p for _, p, _ in core.expire()] == ["late"]


def test_raising_limit_dispatches_queued_lowering_cancels_nothing():
    core, _ = make(limit=1, max_queue=5)
    for p in "abc":
        core.offer(0, p)
    assert [p for p, _ in core.set_limit(0, 3)] == ["b", "c"]
    assert core.in_flight(0) == 3
    assert core.set_limit(0, 1) == []
    assert core.in_flight(0) == 3  # in-flight work is never cancelled
    core.offer(0, "d")
    assert core.release(0) is None  # still over the new limit: nothing dispatched
    assert core.release(0) is None
    assert core.release(0)[0] == "d"


def test_tenants_are_independent():
    core, _ = make(limit=1, n=2)
    assert core.offer(0, "a") is Offer.ADMITTED
    assert core.offer(0, "b") is Offer.QUEUED
    assert core.offer(1, "x") is Offer.ADMITTED


def test_cancel_removes_a_queued_item():
    core, _ = make(limit=0, max_queue=5)
    core.offer(0, "a")
    core.offer(0, "b")
    assert core.cancel(0, "a") is True
    assert core.cancel(0, "zzz") is False
    assert core.queue_depth(0) == 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"limit": -1, "max_queue": 1, "queue_timeout_s": 1.0}, r"limit\n  Input should be greater than or equal to 0"),
        ({"limit": 1, "max_queue": -1, "queue_timeout_s": 1.0}, r"max_queue\n  Input should be greater than or equal"),
        ({"limit": 1, "max_queue": 1, "queue_timeout_s": 0.0}, r"queue_timeout_s\n  Input should be greater than 0"),
        ({"limit": 1, "max_queue": 1, "queue_timeout_s": math.nan}, r"queue_timeout_s\n  Input should be greater"),
        ({"limit": math.inf, "max_queue": 1, "queue_timeout_s": 1.0}, r"limit\n  Input should be a finite number"),
    ],
)
def test_bad_config_is_a_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        QueueConfig(**kwargs)


def test_release_without_in_flight_is_an_error():
    core, _ = make()
    with pytest.raises(RuntimeError, match="nothing in flight"):
        core.release(0)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), st.integers(0, 1)),
        st.tuples(st.just("release"), st.integers(0, 1)),
        st.tuples(st.just("limit"), st.integers(0, 1), st.integers(0, 4)),
        st.tuples(st.just("tick"), st.floats(0.0, 2.0)),
    ),
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_conservation_and_limits_hold_for_any_operation_sequence(seq):
    core, clock = make(limit=2, max_queue=3, timeout=1.5, n=2)
    offered = [0, 0]
    finished = [0, 0]
    for op in seq:
        if op[0] == "offer":
            offered[op[1]] += 1
            core.offer(op[1], object())
        elif op[0] == "release" and core.in_flight(op[1]) > 0:
            finished[op[1]] += 1
            core.release(op[1])
        elif op[0] == "limit":
            core.set_limit(op[1], op[2])
        elif op[0] == "tick":
            clock.t += op[1]
            core.expire()
        for i in range(2):
            c = core.counters(i)
            # every offered request is admitted, rejected, dropped (reported or pending) or still queued
            pending = sum(1 for tt, _, _ in core._late if tt == i)
            assert c["admitted"] + c["rejected"] + c["dropped"] + core.queue_depth(i) == offered[i]
            assert core.in_flight(i) == c["admitted"] - finished[i]
            assert pending <= c["dropped"]
            # a non-empty queue means the tenant is at (or over) its limit: no idle slot with waiting work
            if core.queue_depth(i) > 0:
                assert core.in_flight(i) >= core.limit(i)
