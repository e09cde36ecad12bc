"""The OpenAI request bodies the emulator accepts, validated into one ``GenParams``; errors as OpenAI does.

Every problem is an :class:`ApiError` that the server turns into a JSON error body
``{"error": {"message", "type", "param", "code"}}`` with the HTTP status as ``code`` (vLLM's form).

Accepted fields (others are ignored, as sampling parameters change nothing here):
``model`` (str, optional; must be the served name), ``prompt`` (completions: a string, a list of token
ids, or a one-element list of either), ``messages`` (chat: a non-empty list of objects with a string
``role`` and ``content`` that is a string, a list of ``{"type": "text", "text": ...}`` parts, or null),
``max_tokens`` / ``max_completion_tokens`` (int >= 1 or null), ``stream`` (bool),
``stream_options.include_usage`` (bool; only with ``stream``), ``ignore_eos`` (bool), ``n`` (only 1).

Output budget as vLLM sets it: ``max_tokens`` when given; otherwise 16 for completions (OpenAI's
default) and ``max_model_len − prompt`` for chat. ``prompt + max_tokens > max_model_len`` is a 400.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from admit.emulator.tokens import estimate_chat_tokens, estimate_prompt_tokens

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError", 404: "NotFoundError",
          405: "MethodNotAllowed", 413: "RequestTooLarge", 500: "InternalServerError",
          503: "ServiceUnavailableError"}  # fmt: skip


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> bytes:
        err = {"message": self.message, "type": _TYPES.get(self.status, "Error"), "param": self.param,
               "code": self.status}  # fmt: skip
        return json.dumps({"error": err}).encode()


@dataclass(frozen=True)
class GenParams:
    chat: bool
    model: str
    prompt_tokens: int
    max_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool


def parse_json(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "request body must be a JSON object")
    return data


def _bool(data: dict[str, Any], key: str, default: bool) -> bool:
    v = data.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ApiError(400, f"{key} must be a boolean, got {v!r}", key)
    return v


def _opt_int(data: dict[str, Any], key: str) -> int | None:
    v = data.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(400, f"{key} must be an integer, got {v!r}", key)
    if v < 1:
        raise ApiError(400, f"{key} must be at least 1, got {v}", key)
    return v


def _prompt(data: dict[str, Any]) -> str | list[int]:
    if "prompt" not in data:
        raise ApiError(400, "missing required field 'prompt'", "prompt")
    p = data["prompt"]
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str | list):
        p = p[0]  # one prompt in a batch of one
    if isinstance(p, str):
        return p
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in p):
        return p
    if isinstance(p, list) and len(p) > 1 and all(isinstance(t, str | list) for t in p):
        raise ApiError(400, "only one prompt per request is supported", "prompt")
    raise ApiError(400, "prompt must be a string, a non-empty list of token ids, or a list of one of them", "prompt")


def _messages(data: dict[str, Any]) -> list[dict[str, Any]]:
    if "messages" not in data:
        raise ApiError(400, "missing required field 'messages'", "messages")
    msgs = data["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(400, "messages must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a string 'role'", "messages")
        c = m.get("content")
        if c is None or isinstance(c, str):
            text = c or ""
        elif isinstance(c, list) and all(isinstance(p, dict) and isinstance(p.get("text", ""), str) for p in c):
            text = " ".join(p.get("text", "") for p in c)
        else:
            raise ApiError(400, f"messages[{i}].content must be a string, a list of text parts, or null", "messages")
        out.append({"role": m["role"], "text": text})
    return out


def parse_generation(body: bytes, *, chat: bool, served_model: str, max_model_len: int) -> GenParams:
    """Validate a ``/v1/completions`` (``chat=False``) or ``/v1/chat/completions`` body."""
    data = parse_json(body)
    model = data.get("model", served_model)
    if model is None:
        model = served_model
    if not isinstance(model, str):
        raise ApiError(400, f"model must be a string, got {model!r}", "model")
    if model != served_model:
        raise ApiError(404, f"model {model!r} is not served here; the served model is {served_model!r}", "model")
    n = data.get("n", 1)
    if n is not None and (isinstance(n, bool) or n != 1):
        raise ApiError(400, f"only n=1 is supported, got {n!r}", "n")
    stream = _bool(data, "stream", False)
    opts = data.get("stream_options")
    include_usage = False
    if opts is not None:
        if not stream:
            raise ApiError(400, "stream_options is only allowed with stream=true", "stream_options")
        if not isinstance(opts, dict):
            raise ApiError(400, "stream_options must be an object", "stream_options")
        include_usage = _bool(opts, "include_usage", False)
    ignore_eos = _bool(data, "ignore_eos", False)
    prompt_tokens = estimate_chat_tokens(_messages(data)) if chat else estimate_prompt_tokens(_prompt(data))
    max_tokens = _opt_int(data, "max_tokens")
    if chat:
        mct = _opt_int(data, "max_completion_tokens")
        max_tokens = mct if mct is not None else max_tokens
    if prompt_tokens >= max_model_len:
        raise ApiError(
            400,
            f"the prompt is {prompt_tokens} tokens, but the model's context is {max_model_len} tokens",
            "messages" if chat else "prompt",
        )
    if max_tokens is None:
        max_tokens = max_model_len - prompt_tokens if chat else COMPLETIONS_DEFAULT_MAX_TOKENS
    if prompt_tokens + max_tokens > max_model_len:
        raise ApiError(
            400,
            f"prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) is {prompt_tokens + max_tokens} tokens, "
            f"more than the model's context of {max_model_len} tokens",
            "max_tokens",
        )
    return GenParams(chat, model, prompt_tokens, max_tokens, ignore_eos, stream, include_usage)
