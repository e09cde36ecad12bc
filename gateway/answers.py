"""What the gateway reads from the backend's answers: token counts, error events, and the context length.

The gateway forwards answers untouched; it only reads what its accounting needs, without decoding JSON on
the hot path where a byte pattern will do:

* **usage** — the ``usage`` object's ``prompt_tokens`` and ``completion_tokens`` (a non-streamed body, or a
  stream's usage event with ``stream_options.include_usage``): what a finished request really used;
* **streamed tokens** (`StreamTokens`) — a stream's ``data:`` events as they pass, for what a stream
  delivered when no usage comes: the client left, the backend broke off, or usage was not asked for. vLLM
  and the emulator send one event per generated token and choice (and, for chat, one role event per
  choice, which is counted too: a charge may err by that event, never by a token it did not count);
* **error events** — the ``code`` and message of an OpenAI-style error, as a body or as a stream's event;
* **the context length** — ``max_model_len`` from ``GET /v1/models`` (vLLM and the emulator report it):
  the most one sequence may hold, which bounds what a request that names no output limit may cost.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

USAGE_KEY = b'"usage"'
STREAM_END = b"data: [DONE]"
# a 200 stream whose first event is an error: vLLM's refusal (code 503) once the stream has begun
ERROR_EVENT = b'data: {"error"'
_EVENT = b"\ndata:"  # an event's start: a raw newline never occurs inside a JSON string, which escapes it

# the usage object's two counts, read without decoding any JSON (either order, plain integers). Inside a JSON
# string a quote is escaped, so the pattern can only match the key itself, never generated text.
_USAGE_COUNTS = re.compile(
    rb'"usage": ?\{(?=[^{}]*"prompt_tokens": ?(\d+)[,}])(?=[^{}]*"completion_tokens": ?(\d+)[,}])'
)


class StreamTokens:
    """The ``data:`` events of a stream counted as its bytes pass, in any cut: an event whose start spans two
    reads is counted once (the last bytes of each read are kept to join the next)."""

    __slots__ = ("_tail", "events")

    def __init__(self) -> None:
        self.events = 0
        self._tail = b"\n"  # the first event starts the body, with no newline before it

    def feed(self, data: bytes) -> int:
        """Count the events that start in ``data``; returns the count so far."""
        joined = self._tail + data
        self.events += joined.count(_EVENT)
        self._tail = joined[-(len(_EVENT) - 1):]  # shorter than an event's start: never counted twice
        return self.events


def flat_usage(data: bytes) -> dict[str, Any] | None:
    """The two counts of the last usage object in ``data``, if it has them as plain integers, without nesting."""
    at = data.rfind(USAGE_KEY)
    m = _USAGE_COUNTS.match(data, at) if at >= 0 else None
    if m is None:
        return None
    return {"prompt_tokens": int(m.group(1)), "completion_tokens": int(m.group(2))}


def stream_usage(chunk: bytes) -> dict[str, Any] | None:
    """The usage event's counts in a piece of a stream (None when it has none)."""
    flat = flat_usage(chunk)
    if flat is not None:
        return flat
    for line in chunk.split(b"\n"):
        if USAGE_KEY in line and line.startswith(b"data:") and b'"usage":null' not in line.replace(b" ", b""):
            with contextlib.suppress(ValueError):
                got = json.loads(line[5:])
                if isinstance(got, dict) and isinstance(got.get("usage"), dict):
                    return got["usage"]
    return None


def body_usage(body: bytes) -> dict[str, Any] | None:
    """The usage counts of a whole (non-streamed) answer (None when it has none)."""
    flat = flat_usage(body)
    if flat is not None:
        return flat
    with contextlib.suppress(ValueError):
        got = json.loads(body)
        if isinstance(got, dict) and isinstance(got.get("usage"), dict):
            return got["usage"]
    return None


def event_code(event: bytes) -> int | None:
    """The ``code`` of a stream's error event ``data: {"error": {..., "code": 503}}`` (None if it has none)."""
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        got = json.loads(event.removeprefix(b"data: ").split(b"\n", 1)[0])
        err = got.get("error") if isinstance(got, dict) else None
        code = err.get("code") if isinstance(err, dict) else None
        if isinstance(code, int):
            return code
    return None


def error_message(body: bytes) -> str:
    """The message of an OpenAI-style error body (``{"error": {"message": ...}}`` or ``{"message": ...}``), cut
    to 300 characters; empty when there is none."""
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        got = json.loads(body)
        if isinstance(got, dict):
            inner = got.get("error")
            msg = inner.get("message") if isinstance(inner, dict) else got.get("message")
            if isinstance(msg, str):
                return msg[:300]
    return ""


def context_tokens(models_body: bytes) -> int | None:
    """The largest ``max_model_len`` of the models a ``GET /v1/models`` answer lists (None when none says)."""
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        got = json.loads(models_body)
        cards = got.get("data") if isinstance(got, dict) else None
        lens = [c.get("max_model_len") for c in cards if isinstance(c, dict)] if isinstance(cards, list) else []
        ok = [n for n in lens if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 100_000_000]
        if ok:
            return max(ok)
    return None
