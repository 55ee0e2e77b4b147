#!/usr/bin/env python3
"""A LoRA run's PEFT export against its merged export, in PEFT itself (CI has no torch):

    mha export RUN --format peft --out ADAPTER
    mha export RUN --out MERGED
    VENV/bin/python scripts/check_peft_export.py BASE_HF ADAPTER MERGED

BASE_HF is the base as a Hugging Face directory (a transformers `save_pretrained`, or the base
run's `mha export`). Loads `PeftModel.from_pretrained(base, ADAPTER)` and compares its logits
on random ids with MERGED's and with its own `merge_and_unload()`'s; exits 1 beyond 1e-5 of the
largest logit.
"""

import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM


def main():
    base_hf, adapter, merged_hf = sys.argv[1:4]
    base = AutoModelForCausalLM.from_pretrained(base_hf, dtype=torch.float32).eval()
    peft = PeftModel.from_pretrained(base, adapter).eval()
    merged = AutoModelForCausalLM.from_pretrained(merged_hf, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, base.config.vocab_size, (2, 32), generator=g)
    with torch.no_grad():
        ours = merged(ids).logits
        theirs = peft(ids).logits
        unloaded = peft.merge_and_unload()(ids).logits
    scale = ours.abs().max().item()
    d1, d2 = (theirs - ours).abs().max().item(), (unloaded - ours).abs().max().item()
    print(f"PEFT's adapted logits vs our merged export: max difference {d1:.3e} "
          f"(largest logit {scale:.3f}); merge_and_unload vs ours: {d2:.3e}")
    sys.exit(0 if max(d1, d2) <= 1e-5 * max(scale, 1.0) else 1)


if __name__ == "__main__":
    main()
