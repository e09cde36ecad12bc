"""Write a tiny byte-level tokenizer directory for the peer tools, so they run offline (no hub download).

guidellm and inference-perf count or synthesise tokens with a Hugging Face tokenizer and otherwise fetch
the served model's tokenizer from the hub. This builds one locally with the ``tokenizers`` library: a
byte-level BPE with the 256 byte symbols and no merges (one token per byte), so that any text encodes
and decodes back to itself (a word-level vocabulary turns guidellm's synthetic corpus into unknown
tokens and then into empty prompts), and saves it with ``PreTrainedTokenizerFast.save_pretrained``.
Run it with a peer's throwaway virtualenv, which has both libraries (they are not dependencies of this
project)::

    /tmp/peer-guidellm/bin/python benchmarks/loadgen/peer_tokenizer.py /tmp/peer-tok
"""

from __future__ import annotations

import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # type: ignore[import-not-found]
from transformers import PreTrainedTokenizerFast  # type: ignore[import-not-found]

SPECIAL = ["<unk>", "<pad>", "<s>", "</s>"]


def main(out: str) -> None:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {t: i for i, t in enumerate([*SPECIAL, *sorted(alphabet)])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(out)
    text = "It is a truth universally acknowledged."
    ids = fast(text)["input_ids"]
    assert fast.decode(ids) == text, "the tokenizer must round-trip any text"
    print(f"{len(vocab)} tokens; {text!r} -> {len(ids)} ids, round-trips; saved to {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/peer-tok")
