"""Token counts without a tokenizer: the one prompt-size estimate of the emulator and the gateway.

No tokenizer is downloaded. The estimate: one token per word (a run of letters, digits or underscores) or
punctuation mark, one more for every word of 8 or more characters (long words split into several BPE
pieces), plus one beginning-of-text token, as Llama 3's tokenizer adds. Whitespace is free (BPE attaches
it to the following word). For ordinary English this lands near a BPE tokenizer's count; for the load
generator's prompts (``n`` copies of " hello") it gives exactly ``n + 1``, what a Llama 3 tokenizer gives.
A prompt given as token ids counts exactly.

Chat: the estimate of each message's text plus 4 tokens per message for the role header and end-of-turn
markers, plus 1 beginning-of-text and 4 for the assistant header that starts the answer (Llama 3's chat
template, which wraps every message in header and end-of-turn tokens).

The emulator serves with it (it is its tokenizer); the gateway sizes its token envelopes and the live
Observation's token footprints with it, and corrects both with the backend's ``usage`` when it has one.
"""

from __future__ import annotations

import re
from typing import Any

_PIECE = re.compile(r"\w+|[^\w\s]")
_LONG = re.compile(r"\w{8,}")
BOS_TOKENS = 1
CHAT_TOKENS_PER_MESSAGE = 4
CHAT_ANSWER_HEADER_TOKENS = 4


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
