"""`admit calibrate`'s decode timing (live/calibrate.py `decode_window`) on stream timings written here: the
steps it times are the ones where every stream of the batch decodes, however far apart the streams began."""

from __future__ import annotations

import pytest
from admit.live.calibrate import MIN_WINDOW_STEPS, decode_window


def stream(first: float, step: float, tokens: int, prompt: int = 100) -> dict:
    return {"times": [first + i * step for i in range(tokens)], "prompt_tokens": prompt}


def test_streams_that_began_together_are_timed_over_the_middle_of_their_answers() -> None:
    runs = [stream(1.0, 0.02, 96), stream(1.001, 0.02, 96)]
    gaps, kv = decode_window(runs)
    assert gaps == pytest.approx([0.02, 0.02])
    assert 2 * 100 + 2 * 40 <= kv <= 2 * 100 + 2 * 56  # contexts at the middle of the answers (about token 48)


def test_a_stream_that_began_late_is_timed_only_where_all_decode_together() -> None:
    # the second request's prompt went in a third of the way through the first's answer; before that, the first
    # decoded alone at 10 ms a step, then both at 30 ms: only the shared steps may be timed
    alone = [1.0 + 0.01 * i for i in range(32)]
    first = {"times": alone + [alone[-1] + 0.03 * (i + 1) for i in range(64)], "prompt_tokens": 100}
    second = {"times": [alone[-1] + 0.03 * i for i in range(96)], "prompt_tokens": 100}
    gaps, _ = decode_window([first, second])
    assert gaps == pytest.approx([0.03, 0.03])


def test_streams_that_hardly_overlap_give_no_sample() -> None:
    runs = [stream(1.0, 0.02, 96), stream(1.0 + 0.02 * (96 - MIN_WINDOW_STEPS), 0.02, 96)]
    assert decode_window(runs) is None
