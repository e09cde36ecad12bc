"""Bytes of the OpenAI answers: SSE events (framed for HTTP chunked transfer) and whole JSON bodies.

A streamed answer is one ``data: {json}`` event per output token (a completions ``text_completion``
object, or a chat ``chat.completion.chunk`` whose first delta also carries the assistant role), then an
event with empty text and the ``finish_reason``, then — with ``stream_options.include_usage`` — an event
with ``choices: []`` and the ``usage`` counts, then ``data: [DONE]``. Each token event is a prefix and a
suffix made once per request around the token's text, so streaming costs one concatenation per token.
"""

from __future__ import annotations

import json
from typing import Any

from admit.emulator.protocol import GenParams
from admit.emulator.tokens import WORD_TEXT, output_text, token_text, word_index

DONE = b"data: [DONE]\n\n"


def http_chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk (``Transfer-Encoding: chunked``) carrying ``data``."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}  # fmt: skip


class AnswerFormat:
    """How one request's answer is written: ids, object names, the token-event template."""

    __slots__ = ("_chunks", "created", "head", "id", "params", "rid", "role_head", "tail")

    def __init__(self, params: GenParams, rid: int, created: int) -> None:
        self.params = params
        self.rid = rid
        self.created = created
        self._chunks: list[bytes] | None = None
        self.id = f"{'chatcmpl' if params.chat else 'cmpl'}-{rid}"
        model = json.dumps(params.model)
        if params.chat:
            pre = f'data: {{"id":"{self.id}","object":"chat.completion.chunk","created":{created},"model":{model},'
            self.head = (pre + '"choices":[{"index":0,"delta":{"content":"').encode()
            self.role_head = (pre + '"choices":[{"index":0,"delta":{"role":"assistant","content":"').encode()
            self.tail = b'"},"logprobs":null,"finish_reason":null}]}\n\n'
        else:
            pre = f'data: {{"id":"{self.id}","object":"text_completion","created":{created},"model":{model},'
            self.head = self.role_head = (pre + '"choices":[{"index":0,"text":"').encode()
            self.tail = b'","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.params.model}

    def token_events(self, first: int, n: int) -> bytes:
        """The SSE events of output tokens ``first .. first+n-1`` in one HTTP chunk."""
        if first > 0:  # each token its own framed chunk; several chunks may share one write
            framed = self._framed
            if n == 1:
                return framed[word_index(self.rid, first)]
            i = word_index(self.rid, first)
            k = len(framed)
            return b"".join([framed[(i + j) % k] for j in range(n)])
        rid = self.rid
        parts = []
        for i in range(first, first + n):
            head = self.role_head if i == 0 else self.head
            parts.append(head + token_text(rid, i).encode() + self.tail)
        return http_chunk(b"".join(parts))

    @property
    def _framed(self) -> list[bytes]:
        """One framed chunk per output word (token events after the first are one of these)."""
        f = self._chunks
        if f is None:
            f = self._chunks = [http_chunk(self.head + w.encode() + self.tail) for w in WORD_TEXT]
        return f

    def final_events(self, finish_reason: str, completion_tokens: int) -> bytes:
        """Finish-reason event, optional usage event, [DONE], and the end of the chunked body."""
        p = self.params
        if p.chat:
            obj = self._base("chat.completion.chunk")
            obj["choices"] = [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish_reason}]
        else:
            obj = self._base("text_completion")
            obj["choices"] = [{"index": 0, "text": "", "logprobs": None, "finish_reason": finish_reason,
                               "stop_reason": None}]  # fmt: skip
        data = _event(obj)
        if p.include_usage:
            u = self._base("chat.completion.chunk" if p.chat else "text_completion")
            u["choices"] = []
            u["usage"] = usage(p.prompt_tokens, completion_tokens)
            data += _event(u)
        return http_chunk(data + DONE) + b"0\r\n\r\n"

    def whole_body(self, finish_reason: str, completion_tokens: int) -> bytes:
        """The non-streamed JSON answer."""
        p = self.params
        text = output_text(self.rid, completion_tokens)
        if p.chat:
            obj = self._base("chat.completion")
            obj["choices"] = [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                               "finish_reason": finish_reason}]  # fmt: skip
        else:
            obj = self._base("text_completion")
            obj["choices"] = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                               "stop_reason": None}]  # fmt: skip
        obj["usage"] = usage(p.prompt_tokens, completion_tokens)
        return json.dumps(obj).encode()
