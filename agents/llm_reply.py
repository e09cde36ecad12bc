"""The reply contract of the LLM policy: the JSON schema sent as ``response_format`` and its validation.

The model must answer ``{"rationale": str, "deltas": [int, ...]}`` with exactly one delta per tenant, each
within ``[-max_step, +max_step]``. Servers that honour ``response_format`` (llama.cpp turns it into a
grammar, OpenAI and vLLM into constrained decoding) can only emit that shape, but a reply is validated
anyway: servers that ignore the schema, truncated output and values a lax server let through all exist.
``parse_reply`` never raises; it names the reason a reply is unusable, and the policy then holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

RATIONALE_MAX_CHARS = 120  # one short sentence; a longer one costs tokens and seconds on every call

# Reasons a reply becomes a hold, in the order they are checked.
REPLY_REASONS = ("length", "empty", "not_json", "not_object", "wrong_length", "not_integer", "out_of_range")


def response_format(n_tenants: int, max_step: int) -> dict[str, Any]:
    """The OpenAI ``response_format`` value that constrains a reply to valid deltas."""
    schema = {
        "type": "object",
        "properties": {
            "rationale": {"type": "string", "maxLength": RATIONALE_MAX_CHARS},
            "deltas": {
                "type": "array",
                "items": {"type": "integer", "minimum": -max_step, "maximum": max_step},
                "minItems": n_tenants,
                "maxItems": n_tenants,
            },
        },
        "required": ["rationale", "deltas"],
        "additionalProperties": False,
    }
    return {"type": "json_schema", "json_schema": {"name": "admission_deltas", "strict": True, "schema": schema}}


@dataclass(frozen=True)
class Reply:
    deltas: list[int] | None  # None: unusable, see ``reason``
    rationale: str
    reason: str  # "ok" or one of REPLY_REASONS


def _strip_fences(text: str) -> str:
    text = text.strip()
    if text.startswith("```") and text.endswith("```"):
        text = text[3:-3].removeprefix("json").strip()
    return text


def parse_reply(content: str | None, finish_reason: str | None, n_tenants: int, max_step: int) -> Reply:
    """Validate a chat completion's text; deltas only when every check passes."""
    if finish_reason == "length":
        return Reply(None, "", "length")  # cut off: even parseable JSON could be missing its tail
    if not content or not content.strip():
        return Reply(None, "", "empty")
    try:
        data = json.loads(_strip_fences(content))
    except (json.JSONDecodeError, RecursionError):
        return Reply(None, "", "not_json")
    if not isinstance(data, dict) or not isinstance(data.get("deltas"), list):
        return Reply(None, "", "not_object")
    rationale = data.get("rationale")
    rationale = rationale[:RATIONALE_MAX_CHARS] if isinstance(rationale, str) else ""
    raw = data["deltas"]
    if len(raw) != n_tenants:
        return Reply(None, rationale, "wrong_length")
    if not all(type(d) is int for d in raw):  # bool and float are rejected too
        return Reply(None, rationale, "not_integer")
    if not all(-max_step <= d <= max_step for d in raw):
        return Reply(None, rationale, "out_of_range")
    return Reply(list(raw), rationale, "ok")
