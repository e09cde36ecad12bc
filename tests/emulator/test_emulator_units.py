"""The emulator's pure pieces: the fault-bent clock, token estimates, vLLM's bucket helpers, the answers' bytes."""

from __future__ import annotations

import json
import math

import pytest
from admit.emulator.clock import VirtualClock
from admit.emulator.histogram import Hist, buckets_1_2_5
from admit.emulator.openai_request import GenParams
from admit.emulator.responses import AnswerFormat
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


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size, _, rest = data.partition(b"\r\n")
        n = int(size, 16)
        out, data = out + rest[:n], rest[n + 2 :]
    return out


def _stream(chat: bool, output: int, writes: list[int]) -> list[dict]:
    """The events of one answer of ``output`` planned tokens, written ``writes[i]`` at a time (the engine loop
    batches tokens when it falls behind), then finished after ``sum(writes)`` tokens."""
    params = GenParams(chat, "m", 5, output, True, True, True)
    fmt = AnswerFormat(params, 7, 0, output, "length")
    raw, first = b"", 0
    for n in writes:
        raw += fmt.token_events(first, n)
        first += n
    raw += fmt.final_events("length", first)
    assert raw.endswith(b"0\r\n\r\n")
    evs = _dechunk(raw[:-5]).decode().split("\n\n")
    assert evs[-2:] == ["data: [DONE]", ""]
    return [json.loads(e.removeprefix("data: ")) for e in evs[:-2]]


@pytest.mark.parametrize("chat", [True, False])
def test_the_last_token_event_carries_the_finish_reason_however_tokens_are_batched(chat: bool) -> None:
    one_by_one = _stream(chat, 6, [1] * 6)
    assert _stream(chat, 6, [1, 3, 2]) == one_by_one == _stream(chat, 6, [6])
    *answer, last = one_by_one
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 6
    if chat:
        role, *answer = answer
        assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len(answer) == 6
    assert [e["choices"][0]["finish_reason"] for e in answer] == [None] * 5 + ["length"]
    assert ["stop_reason" in e["choices"][0] for e in answer] == [not chat] * 5 + [True]
    assert len(_stream(chat, 1, [1])) == 2 + chat  # (role,) the one token with the finish, usage
    # should the engine end an answer before its planned last token, an empty event still carries the finish
    *short, _ = _stream(chat, 6, [1, 4])
    assert short[-1]["choices"][0]["finish_reason"] == "length"
    assert short[-1]["choices"][0]["delta" if chat else "text"] == ({"content": ""} if chat else "")
    assert [e["choices"][0]["finish_reason"] for e in short[:-1]] == [None] * len(short[:-1])
