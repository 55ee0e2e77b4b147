#!/usr/bin/env python3
"""Checks `mha export` of a Llama-family run with transformers itself: the exported
directory loads in `AutoModelForCausalLM.from_pretrained` with no missing or unexpected key,
and its logits on the given ids equal those of the source directory (for an imported,
untrained run) within `--tol`.

    python scripts/check_llama_export.py SOURCE_DIR EXPORTED_DIR [--ids "1 2 3"] [--tol 1e-5]

Prints PASS or FAIL with the largest logit difference; exits 1 on FAIL.
"""

import argparse
import sys

import torch
from transformers import AutoModelForCausalLM


def load(d):
    m, info = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                   attn_implementation="sdpa",
                                                   output_loading_info=True)
    return m.eval(), info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("source")
    ap.add_argument("exported")
    ap.add_argument("--ids", default="1 5 9 13 17 21 25 29")
    ap.add_argument("--tol", type=float, default=1e-5)
    a = ap.parse_args()
    src, _ = load(a.source)
    out, info = load(a.exported)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys") and v}
    ids = torch.tensor([[int(t) for t in a.ids.split()]])
    with torch.no_grad():
        diff = (src(ids).logits - out(ids).logits).abs().max().item()
    ok = not bad and diff <= a.tol
    print(f"{'PASS' if ok else 'FAIL'}: {type(out).__name__}, max |logit difference| {diff:.3e}"
          + (f", {bad}" if bad else ""))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
