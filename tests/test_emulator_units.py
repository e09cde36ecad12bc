"""The emulator's pure pieces: the fault-bent clock, token estimates, vLLM's bucket helpers."""

from __future__ import annotations

import math

import pytest
from admit.emulator.clock import VirtualClock
from admit.emulator.histogram import Hist, buckets_1_2_5
from admit.emulator.tokens import estimate_chat_tokens, estimate_prompt_tokens, estimate_text_tokens


class FakeWall:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_clock_slows_pauses_and_maps_back() -> None:
    wall = FakeWall()
    c = VirtualClock(wall)
    wall.t = 101.0
    assert c.now() == 1.0
    c.set_rate(0.5)  # latency multiplier 2 from wall 101
    wall.t = 103.0
    assert c.now() == 2.0
    c.set_rate(0.0)  # paused at engine 2.0 (wall 103)
    wall.t = 110.0
    assert c.now() == 2.0
    assert math.isinf(c.to_wall(2.5))  # cannot be reached while paused
    c.set_rate(1.0)  # resumed at wall 110
    wall.t = 111.0
    assert c.now() == 3.0
    # engine times map back to the wall time they were (or will be) reached at, across all segments
    assert c.to_wall(0.5) == 100.5
    assert c.to_wall(1.5) == 102.0
    assert c.to_wall(2.5) == 110.5
    assert c.wall_interval(1.0, 3.0) == 10.0
    with pytest.raises(ValueError):
        c.set_rate(-1.0)


def test_token_estimates() -> None:
    assert estimate_prompt_tokens(" hello" * 256) == 257  # the load generator's prompts, plus BOS
    assert estimate_prompt_tokens([1, 2, 3]) == 3  # token ids are exact
    assert estimate_text_tokens("Hello, world!") == 4
    assert estimate_text_tokens("internationalisation") == 2  # a long word counts twice
    assert estimate_chat_tokens([{"text": "hi"}, {"text": ""}]) == 1 + 4 + 2 * 4 + 1


def test_bucket_helpers() -> None:
    assert buckets_1_2_5(1000) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
    assert buckets_1_2_5(131072)[-1] == 100000
    h = Hist((1.0, 2.0))
    for v in (0.5, 1.0, 1.5, 2.0, 3.0):
        h.observe(v)
    h.observe(1.5, 3)
    assert h.cumulative() == [("1.0", 2), ("2.0", 7), ("+Inf", 8)]  # le is inclusive, as in Prometheus
    assert (h.count, h.sum) == (8, 12.5)
    with pytest.raises(ValueError):
        Hist((2.0, 1.0))
