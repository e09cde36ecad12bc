"""Token counts without a tokenizer, and the synthetic text the emulator streams.

Prompt-length estimate (no tokenizer is downloaded): one token per word (a run of letters, digits or
underscores) or punctuation mark, one more for every word of 8 or more characters (long words split
into several BPE pieces), plus one beginning-of-text token, as Llama 3's tokenizer adds. Whitespace is
free (BPE attaches it to the following word). For ordinary English this lands near a BPE tokenizer's
count; for the load generator's prompts (``n`` copies of " hello") it gives exactly ``n + 1``, what a
Llama 3 tokenizer gives. A prompt given as token ids counts exactly.

Chat: the estimate of each message's text plus 4 tokens per message for the role header and end-of-turn
markers, plus 1 beginning-of-text and 4 for the assistant header that starts the answer (Llama 3's chat
template, which wraps every message in header and end-of-turn tokens).

Output text: each output token is one word from a fixed list, a space before it, chosen by the request's
id and the token's index, so the text is deterministic and costs nothing to make.
"""

from __future__ import annotations

import re
from typing import Any

_PIECE = re.compile(r"\w+|[^\w\s]")
_LONG = re.compile(r"\w{8,}")
BOS_TOKENS = 1
CHAT_TOKENS_PER_MESSAGE = 4
CHAT_ANSWER_HEADER_TOKENS = 4

WORDS = (
    "the", "model", "token", "serves", "a", "request", "with", "shared", "batch", "of", "steps", "and",
    "cache", "blocks", "while", "tenants", "wait", "in", "line", "for", "their", "turn", "to", "decode",
)  # fmt: skip
WORD_TEXT = tuple(" " + w for w in WORDS)


def estimate_text_tokens(text: str) -> int:
    """Tokens in ``text`` by the estimate in the module docstring (without the beginning-of-text token)."""
    return len(_PIECE.findall(text)) + len(_LONG.findall(text))


def estimate_prompt_tokens(prompt: str | list[int]) -> int:
    """Prompt tokens of a completions request: exact for token ids, estimated for text."""
    if isinstance(prompt, list):
        return len(prompt)
    return BOS_TOKENS + estimate_text_tokens(prompt)


def estimate_chat_tokens(messages: list[dict[str, Any]]) -> int:
    """Prompt tokens of a chat request (messages already validated: content is text or None)."""
    n = BOS_TOKENS + CHAT_ANSWER_HEADER_TOKENS
    for m in messages:
        n += CHAT_TOKENS_PER_MESSAGE + estimate_text_tokens(m.get("text", ""))
    return n


def word_index(rid: int, i: int) -> int:
    """Which of ``WORD_TEXT`` is output token ``i`` of request ``rid``."""
    return (rid * 7 + i) % len(WORD_TEXT)


def token_text(rid: int, i: int) -> str:
    """The text of output token ``i`` of request ``rid``."""
    return WORD_TEXT[word_index(rid, i)]


def output_text(rid: int, n: int) -> str:
    return "".join(token_text(rid, i) for i in range(n))
