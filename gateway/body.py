"""What the gateway needs from an OpenAI request body: a light validation and a token estimate.

The body is forwarded unchanged; the gateway only reads the fields that admission needs (``model`` for the
envelope target, ``stream``, ``max_tokens`` and the prompt size for the token envelope) and rejects bodies
a backend would choke on with a 400 that names the field. Prompt tokens are estimated as UTF-8 bytes / 4
(token id lists count exactly); the estimate only sizes the token envelope, the request log prefers the
backend's own ``usage`` counts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

BYTES_PER_TOKEN = 4


class BadBody(ValueError):
    """The body is not an acceptable request; the message is safe to return to the client."""


@dataclass(frozen=True, slots=True)
class RequestInfo:
    model: str
    stream: bool
    max_tokens: int
    prompt_tokens: int

    @property
    def cost_tokens(self) -> int:
        return self.prompt_tokens + self.max_tokens


def _text_tokens(text: str) -> int:
    return max(1, len(text.encode("utf-8", "replace")) // BYTES_PER_TOKEN) if text else 0


def _prompt_tokens(prompt: Any) -> int:
    if isinstance(prompt, str):
        return _text_tokens(prompt)
    if isinstance(prompt, list):
        if all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
            return len(prompt)
        total = 0
        for item in prompt:
            if isinstance(item, str):
                total += _text_tokens(item)
            elif isinstance(item, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in item):
                total += len(item)
            else:
                raise BadBody("'prompt' must be a string, a list of strings, or token ids")
        return total
    raise BadBody("'prompt' must be a string, a list of strings, or token ids")


def _message_tokens(messages: Any) -> int:
    if not isinstance(messages, list) or not messages:
        raise BadBody("'messages' must be a non-empty list of objects with 'role' and 'content'")
    total = 0
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadBody("every message must be an object with a string 'role'")
        content = m.get("content")
        if isinstance(content, str):
            total += _text_tokens(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    total += _text_tokens(part["text"])
        elif content is not None:
            raise BadBody("a message's 'content' must be a string, a list of parts, or null")
        total += 4  # role and separators
    return total


def parse_request(raw: bytes, chat: bool) -> RequestInfo:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise BadBody("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadBody("the body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model or len(model) > 256:
        raise BadBody("'model' must be a non-empty string")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadBody("'stream' must be true or false")
    mt = body.get("max_completion_tokens") if body.get("max_tokens") is None else body.get("max_tokens")
    if mt is None:
        mt = 16
    if not isinstance(mt, int) or isinstance(mt, bool) or not 1 <= mt <= 1_000_000:
        raise BadBody("'max_tokens' must be an integer between 1 and 1000000")
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise BadBody("'stream_options' must be an object")
    prompt = _message_tokens(body.get("messages")) if chat else _prompt_tokens(body.get("prompt"))
    return RequestInfo(model, stream, mt, prompt)
