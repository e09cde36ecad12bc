"""The synthetic text the emulator streams, and (from core/tokens.py) its prompt-token estimate.

The prompt estimate is core/tokens.py's, the one the gateway uses too, re-exported here.

Output text: each output token is one word from a fixed list, a space before it, chosen by the request's
id and the token's index, so the text is deterministic and costs nothing to make.
"""

from __future__ import annotations

from admit.core.tokens import (  # noqa: F401  (re-exported: the emulator's estimate is core's)
    BOS_TOKENS,
    CHAT_ANSWER_HEADER_TOKENS,
    CHAT_TOKENS_PER_MESSAGE,
    estimate_chat_tokens,
    estimate_prompt_tokens,
    estimate_text_tokens,
)

WORDS = (
    "the", "model", "token", "serves", "a", "request", "with", "shared", "batch", "of", "steps", "and",
    "cache", "blocks", "while", "tenants", "wait", "in", "line", "for", "their", "turn", "to", "decode",
)  # fmt: skip
WORD_TEXT = tuple(" " + w for w in WORDS)


def word_index(rid: int, i: int) -> int:
    """Which of ``WORD_TEXT`` is output token ``i`` of request ``rid``."""
    return (rid * 7 + i) % len(WORD_TEXT)


def token_text(rid: int, i: int) -> str:
    """The text of output token ``i`` of request ``rid``."""
    return WORD_TEXT[word_index(rid, i)]


def output_text(rid: int, n: int) -> str:
    return "".join(token_text(rid, i) for i in range(n))
