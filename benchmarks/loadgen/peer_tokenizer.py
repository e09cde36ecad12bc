"""Write a tiny word-level tokenizer directory for the peer tools, so they run offline (no hub download).

guidellm and inference-perf count or synthesise tokens with a Hugging Face tokenizer and otherwise fetch
the served model's tokenizer from the hub. This builds one locally from a made-up vocabulary (the mock
server's words plus filler) with the ``tokenizers`` library and saves it with
``PreTrainedTokenizerFast.save_pretrained``. Run it with a peer's throwaway virtualenv, which has both
libraries (they are not dependencies of this project)::

    /tmp/peer-guidellm/bin/python benchmarks/loadgen/peer_tokenizer.py /tmp/peer-tok
"""

from __future__ import annotations

import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # type: ignore[import-not-found]
from transformers import PreTrainedTokenizerFast  # type: ignore[import-not-found]

SPECIAL = {"[UNK]": 0, "[PAD]": 1, "</s>": 2, "<s>": 3}
WORDS = ["hello", "tok", "the", "a", "of", "and", "to", "in", "is", "it"] + [f"w{i}" for i in range(990)]


def main(out: str) -> None:
    vocab = dict(SPECIAL)
    for w in WORDS:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with single spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", eos_token="</s>", bos_token="<s>"
    )
    fast.save_pretrained(out)
    print(f"{len(vocab)} tokens; 'hello tok tok' -> {fast('hello tok tok')['input_ids']}; saved to {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/peer-tok")
