"""The official openai client against a real emulator process: completions and chat, streamed and not."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from emulator_helpers import Emulator, start_emulator

MODEL = "test-model"


pytestmark = pytest.mark.system  # starts real servers: `make check` leaves it to `make test`


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    # engine time runs 4x faster than the wall clock, short drawn answers: the module stays fast
    e = start_emulator("--model", MODEL, "--max-model-len", "4096", "--seed", "3", "--latency-multiplier", "0.25",
                       "--output-median", "30")  # fmt: skip
    yield e
    e.stop()


@pytest.fixture(scope="module")
def client(emu: Emulator) -> openai.OpenAI:
    return openai.OpenAI(base_url=emu.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_completion_not_streamed(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="hello" + " hello" * 19, max_tokens=7,
                                  extra_body={"ignore_eos": True})  # fmt: skip
    assert r.usage is not None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (21, 7, 28)
    assert r.choices[0].finish_reason == "length"
    assert len(r.choices[0].text.split()) == 7


def test_completion_streamed_with_usage(client: openai.OpenAI) -> None:
    stream = client.completions.create(
        model=MODEL,
        prompt="one two three",
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    texts = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
    assert len(texts) == 12
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (4, 12)
    assert len({c.id for c in chunks}) == 1


def test_chat_not_streamed(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": "be brief"},
                                       {"role": "user", "content": "hi there"}], max_tokens=5,
                                       extra_body={"ignore_eos": True})  # fmt: skip
    assert r.choices[0].message.role == "assistant"
    assert len(r.choices[0].message.content.split()) == 5
    assert r.usage is not None
    # 1 begin + 4 answer header + 2 messages x 4 + "be brief" (2) + "hi there" (2)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (17, 5)


def test_chat_streamed_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=9,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})  # fmt: skip
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    assert sum(1 for d in deltas if d.content) == 9
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 9


def test_without_ignore_eos_stops_at_drawn_length_or_max_tokens(client: openai.OpenAI) -> None:
    reasons = set()
    for _ in range(12):
        r = client.completions.create(model=MODEL, prompt="x", max_tokens=40)
        n = r.usage.completion_tokens
        assert 1 <= n <= 40
        assert r.choices[0].finish_reason == ("length" if n == 40 else "stop")
        reasons.add(r.choices[0].finish_reason)
    assert reasons == {"stop", "length"}  # median 30, sigma 0.8: both happen in 12 draws with this seed


def test_client_errors_are_openai_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", max_tokens=5000)
    assert "4096" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other-model", prompt="x", max_tokens=5)
