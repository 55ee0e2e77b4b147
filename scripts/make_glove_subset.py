#!/usr/bin/env python3
"""Make weights/wordllama_l2_1500w_64d.txt: a small GloVe-format word-vector file.

Source: the token embeddings that the `wordllama` wheel ships
(`wordllama/weights/l2_supercat_256.safetensors`, a (32000, 256) float16 table over the
Llama-2 SentencePiece vocabulary, trained with Matryoshka losses so that its first 64, 128
or 256 dimensions are each a usable embedding) and its tokenizer vocabulary
(`wordllama/tokenizers/l2_supercat_tokenizer_config.json`).

What is kept:
  1. the most frequent English words by `wordfreq.top_n_list("en", 20000)` (used only to
     choose and order words) that are lowercase ASCII letters and are ONE whole-word token
     "▁word" in the Llama-2 vocabulary, the first N_COMMON of them in frequency order;
  2. then the DEMO_WORDS below (for the walkthrough and tests) that are also single
     whole-word tokens and not already kept;
  3. each word's vector = the first 64 of its 256 dimensions (WordLlama's documented
     Matryoshka truncation, `WordLlama.load(trunc_dim=64)`: no PCA, no rescaling),
     printed with 4 decimals (the source is float16: 4 decimals keep about as many
     significant digits as it has for values from 0.1 up, and the file stays under 1 MB).

Re-run (the wheels are fetched by pip; nothing else is downloaded):
    python3 -m venv VENV
    VENV/bin/pip install numpy safetensors wordfreq==3.1.1
    VENV/bin/pip download --no-deps -d WHEELS wordllama==0.4.0.post1
    VENV/bin/python scripts/make_glove_subset.py WHEELS/wordllama-*.whl
(VENV, WHEELS: any two directories outside the repository.)
"""

import io
import json
import os
import sys
import zipfile

import numpy as np
import wordfreq
from safetensors.numpy import load

N_COMMON = 1500
DIM = 64
DEMO_WORDS = (
    "cat dog mat rug sat king queen prince man woman boy girl apple orange fruit car bus train"
).split()
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "weights",
                   "wordllama_l2_1500w_64d.txt")


def main(wheel_path: str) -> None:
    with zipfile.ZipFile(wheel_path) as whl:
        table = load(whl.read("wordllama/weights/l2_supercat_256.safetensors"))
        vocab = json.loads(
            whl.read("wordllama/tokenizers/l2_supercat_tokenizer_config.json"))["model"]["vocab"]
    emb = table["embedding.weight"]
    assert emb.shape == (32000, 256), emb.shape

    def token_id(word):
        ok = word.isascii() and word.isalpha() and word.islower()
        return vocab.get("\u2581" + word) if ok else None

    kept = []
    for word in wordfreq.top_n_list("en", 20000):
        if len(kept) == N_COMMON:
            break
        # Single letters other than "a" and "i" are initials or fragments, not words.
        if (len(word) > 1 or word in ("a", "i")) and token_id(word) is not None \
                and word not in kept:
            kept.append(word)
    assert len(kept) == N_COMMON, len(kept)
    kept += [w for w in DEMO_WORDS if token_id(w) is not None and w not in kept]

    buf = io.StringIO()
    for word in kept:
        vec = emb[token_id(word), :DIM].astype(np.float64)
        # Values that round to zero print as "0.0000", never "-0.0000".
        vals = " ".join(f"{v:.4f}".replace("-0.0000", "0.0000") for v in vec)
        buf.write(f"{word} {vals}\n")
    tmp = OUT + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(buf.getvalue())
    os.replace(tmp, OUT)
    missing = [w for w in DEMO_WORDS if token_id(w) is None]
    print(f"wrote {os.path.normpath(OUT)}: {len(kept)} words x {DIM} dims, "
          f"{os.path.getsize(OUT)} bytes; demo words not single tokens: {missing}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
