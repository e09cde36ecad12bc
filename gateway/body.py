"""What the gateway needs from an OpenAI request body: a light validation and a token estimate.

The body is forwarded unchanged; the gateway only reads the fields that admission needs (``model`` for the
envelope target, ``stream``, the output limit, ``n``/``best_of`` and the prompt size for the token
envelope) and rejects bodies a backend would choke on with a 400 that names the field. JSON nested deeper
than ``MAX_JSON_DEPTH`` is refused too (no OpenAI request needs it, and Python's parser would otherwise
recurse until it fails). Prompt tokens are estimated as the emulator estimates them (core/tokens.py: words
and punctuation, Llama 3's chat template; token id lists count exactly).

**The up-front charge is the most the backend may produce** (`RequestInfo.cost_tokens`), read the way vLLM
reads the body, so that no spelling of a request gets more output than it was charged for:

* the output limit per choice is, for chat, ``max_completion_tokens`` when given, else ``max_tokens``
  (vLLM's order: the older field loses); for completions ``max_tokens`` (``max_completion_tokens`` is not a
  completions field and vLLM ignores it), 16 when absent or null (vLLM's and OpenAI's default);
* a chat request that names no limit may generate up to the rest of the backend's context
  (``max_model_len`` − prompt), so it is charged the context; where the context is unknown, the gateway's
  ``default_output_tokens`` stands in;
* the limit is capped by the context (vLLM caps it quietly), and counted once per choice: ``n``, or
  ``best_of`` when it is larger (backends that generate ``best_of`` candidates generate them all).

The gateway settles the charge with what the backend really delivered when the request ends (gateway/app.py),
so the estimate only decides whether the request may start.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from admit.core.tokens import BOS_TOKENS, CHAT_ANSWER_HEADER_TOKENS, CHAT_TOKENS_PER_MESSAGE, estimate_text_tokens

MAX_JSON_DEPTH = 64  # arrays and objects inside each other; an OpenAI chat body needs about 5
MAX_CHOICES = 128  # the largest ``n`` (and ``best_of``) accepted
MAX_OUTPUT_TOKENS = 1_000_000  # the largest output limit accepted
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's and OpenAI's output limit of a completion that names none


class BadBody(ValueError):
    """The body is not an acceptable request; the message is safe to return to the client."""


@dataclass(frozen=True, slots=True)
class RequestInfo:
    model: str
    stream: bool
    max_tokens: int | None  # the output limit per choice the backend honours; None: the body names none
    prompt_tokens: int
    n: int = 1  # sequences generated: ``n``, or ``best_of`` when larger

    def cost_tokens(self, context_tokens: int | None, default_output_tokens: int) -> int:
        """The up-front charge: the prompt and the most output the backend may generate for it (module
        docstring). ``context_tokens``: the backend's context length (None when unknown);
        ``default_output_tokens``: the output limit assumed for a body that names none while it is unknown."""
        out = self.max_tokens
        if out is None:
            out = default_output_tokens if context_tokens is None else context_tokens
        if context_tokens is not None:
            out = min(out, max(1, context_tokens - self.prompt_tokens))
        return self.prompt_tokens + out * self.n


def _depth(obj: Any, limit: int) -> bool:
    """Whether ``obj`` nests arrays/objects at most ``limit`` deep (iterative: no recursion of our own)."""
    stack = [(obj, 1)]
    while stack:
        node, d = stack.pop()
        if d > limit:
            return False
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, d + 1) for c in children if isinstance(c, (dict, list)))
    return True


def parse_json(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` with a depth limit; a body that is not JSON or nests deeper raises `BadBody`.

    The depth is only walked when the body has more brackets than the limit (a body with fewer cannot nest
    deeper), so an ordinary request pays one ``bytes.count`` pair.
    """
    try:
        obj = json.loads(raw)
    except RecursionError:
        raise BadBody(f"the body nests arrays/objects deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError):
        raise BadBody("the body is not valid JSON") from None
    if isinstance(obj, (dict, list)) and raw.count(b"[") + raw.count(b"{") > max_depth and not _depth(obj, max_depth):
        raise BadBody(f"the body nests arrays/objects deeper than {max_depth} levels")
    return obj


def _text_tokens(text: str) -> int:
    return BOS_TOKENS + estimate_text_tokens(text)  # one prompt of text (core/tokens.py, the emulator's estimate)


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
            total += estimate_text_tokens(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    total += estimate_text_tokens(part["text"])
        elif content is not None:
            raise BadBody("a message's 'content' must be a string, a list of parts, or null")
        total += CHAT_TOKENS_PER_MESSAGE  # role header and end of turn
    return BOS_TOKENS + CHAT_ANSWER_HEADER_TOKENS + total


def _count(body: dict[str, Any], key: str, hi: int) -> int | None:
    """An optional integer field of the body in [1, hi]; None when absent or null."""
    v = body.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= hi:
        raise BadBody(f"'{key}' must be an integer between 1 and {hi}")
    return v


def parse_request(raw: bytes, chat: bool) -> RequestInfo:
    body = parse_json(raw)
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
    max_tokens = _count(body, "max_tokens", MAX_OUTPUT_TOKENS)
    if chat:
        mct = _count(body, "max_completion_tokens", MAX_OUTPUT_TOKENS)
        out = mct if mct is not None else max_tokens
    else:
        out = max_tokens if max_tokens is not None else COMPLETIONS_DEFAULT_MAX_TOKENS
    n = _count(body, "n", MAX_CHOICES) or 1
    best_of = _count(body, "best_of", MAX_CHOICES) or 1
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise BadBody("'stream_options' must be an object")
    prompt = _message_tokens(body.get("messages")) if chat else _prompt_tokens(body.get("prompt"))
    return RequestInfo(model, stream, out, prompt, max(n, best_of))
