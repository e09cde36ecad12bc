"""The response parser on its own: byte streams cut at arbitrary points give the same counts and outcome.

The parser counts token events per read and parses only the special ones (usage, errors, empty deltas,
``[DONE]``); these tests check it against the event-by-event meaning on streams that exercise every path.
"""

from __future__ import annotations

import json
import random

import pytest
from admit.loadgen.client import Attempt, Connection


class Owner:
    def __init__(self) -> None:
        self.done: list[tuple[Attempt, str | None]] = []

    def on_attempt_done(self, conn: Connection, attempt: Attempt, now: int, reason: str | None) -> None:
        self.done.append((attempt, reason))

    def on_connection_lost(self, conn: Connection) -> None:
        pass


class Transport:
    def write(self, data: bytes) -> None:
        pass

    def abort(self) -> None:
        pass


def chunked(events: list[bytes], ext: bool = False, crlf: bool = False) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    out = [head]
    for ev in events:
        data = ev + (b"\r\n\r\n" if crlf else b"\n\n")
        out.append(b"%x%s\r\n" % (len(data), b";x=1" if ext else b"") + data + b"\r\n")
    return b"".join(out) + b"0\r\n\r\n"


def token(i: int) -> bytes:
    return b'data: {"id":"c","choices":[{"index":0,"text":" t%d"}]}' % i


def usage(n: int, prompt: int = 32, nested: bool = False) -> bytes:
    u: dict = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
    if nested:
        u = {"prompt_tokens": prompt, "prompt_tokens_details": {"cached_tokens": 0}, "completion_tokens": n}
    return b"data: " + json.dumps({"id": "c", "choices": [], "usage": u}, separators=(",", ":")).encode()


DONE = b"data: [DONE]"


def run(stream: bytes, cuts: list[int]) -> tuple[Attempt, str | None, int]:
    owner = Owner()
    conn = Connection(owner)  # type: ignore[arg-type]
    conn.connection_made(Transport())  # type: ignore[arg-type]
    a = Attempt(0, 0, 0)
    conn.send(a, b"")
    prev = 0
    reads = 0
    for c in [*sorted(cuts), len(stream)]:
        if c > prev:
            reads += 1
            conn.data_received(stream[prev:c])
            prev = c
    assert len(owner.done) == 1, "the attempt must end exactly once"
    return owner.done[0][0], owner.done[0][1], reads


CASES = {
    "completions+usage": ([token(i) for i in range(16)] + [usage(16), DONE], 16, None, 16),
    "chat role and finish events": (
        [b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}']
        + [b'data: {"choices":[{"delta":{"content":"x"}}]}'] * 5
        + [b'data: {"choices":[{"delta":{"content":null},"finish_reason":"length"}]}', usage(5), DONE],
        5,
        None,
        5,
    ),
    "nested usage falls back to json": ([token(i) for i in range(3)] + [usage(3, nested=True), DONE], 3, None, 3),
    "comments and no-space data": (
        [b": keep-alive", b'data:{"choices":[{"text":"a"}]}', b"event: x\ndata: " + token(1)[6:], DONE],
        2,
        None,
        0,
    ),
    "no usage": ([token(i) for i in range(4)] + [DONE], 4, None, 0),
    "malformed event": ([token(0), b"data: this is not json", token(1), DONE], 2, "malformed_sse", 0),
    "error event": ([token(0), b'data: {"error":{"message":"x"}}', DONE], 1, "stream_error", 0),
    "no [DONE]": ([token(0), token(1)], 2, "incomplete_stream", 0),
    "usage with choices is a token": (
        [token(0), b'data: {"choices":[{"text":"z"}],"usage":{"prompt_tokens":1,"completion_tokens":2}}', DONE],
        2,
        None,
        2,
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("framing", ["plain", "ext", "crlf"])
def test_any_read_boundaries_give_the_same_outcome(name: str, framing: str) -> None:
    events, tokens, reason, reported = CASES[name]
    stream = chunked(events, ext=framing == "ext", crlf=framing == "crlf")
    rng = random.Random(hash((name, framing)) & 0xFFFF)
    splits = [[], list(range(1, len(stream)))]  # one read, then one byte per read
    splits += [rng.sample(range(1, len(stream)), k) for k in (1, 3, 10, 40) for _ in range(5)]
    for cuts in splits:
        a, why, reads = run(stream, cuts)
        assert why == reason, (cuts, why)
        assert sum(a.counts) == tokens
        assert len(a.times) == len(a.counts) <= reads
        assert all(c > 0 for c in a.counts)
        assert a.output_tokens == reported


def test_content_length_stream_and_bad_chunk_framing() -> None:
    body = b"".join(e + b"\n\n" for e in [token(0), token(1), usage(2), DONE])
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(body)
    a, why, _ = run(head + body, [len(head) + 7, len(head) + 90])
    assert why is None and sum(a.counts) == 2 and a.output_tokens == 2
    bad = chunked([token(0), DONE]).replace(b"\n\n\r\n", b"\n\nXY", 1)
    _, why, _ = run(bad, [])
    assert why == "bad_http"
