import math

import numpy as np
import pytest
from admit.engine.request import Request
from admit.engine.slot_engine import SlotEngine


def test_pool_limits_concurrency_and_queues_fifo():
    eng = SlotEngine(slots=2, mean_service_s=1.0, distribution="deterministic")
    reqs = [Request(i, 0, 0.0, 1, 1, 0.5) for i in range(4)]
    for r in reqs:
        eng.submit(r, 0.0)
    assert eng.num_running == 2 and eng.num_waiting == 2
    assert eng.memory_utilisation() == 1.0
    finished = []
    while eng.next_event_time() < math.inf:
        t = eng.next_event_time()
        finished += [(r.rid, t) for r in eng.process_event(t)]
    assert finished == [(0, 1.0), (1, 1.0), (2, 2.0), (3, 2.0)]
    assert reqs[2].first_token == 1.0  # started when a slot freed


def test_exponential_service_from_the_requests_uniform_draw():
    eng = SlotEngine(slots=10_000, mean_service_s=2.5)
    u = np.random.default_rng(0).random(20_000)
    s = [eng.service_time(Request(i, 0, 0.0, 1, 1, x)) for i, x in enumerate(u)]
    assert np.mean(s) == pytest.approx(2.5, rel=0.03)
    assert np.percentile(s, 99) == pytest.approx(2.5 * math.log(100), rel=0.05)
    r = Request(0, 0, 0.0, 1, 1, 0.3)
    assert eng.service_time(r) == eng.service_time(r)  # same draw, same time (common random numbers)


def test_bad_engine_settings():
    with pytest.raises(ValueError, match="slots >= 1"):
        SlotEngine(0, 1.0)
    with pytest.raises(ValueError, match="allowed"):
        SlotEngine(1, 1.0, "weibull")
