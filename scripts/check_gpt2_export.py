#!/usr/bin/env python3
"""Checks `mha export` against PyTorch itself, on the fixtures of make_gpt2_fixtures.py.

    mha import tests/fixtures/gpt2/hf --out HF_RUN
    mha export HF_RUN --out HF_OUT
    mha import tests/fixtures/gpt2/hf-untied --out UNTIED_RUN
    mha export UNTIED_RUN --out UNTIED_OUT
    mha import tests/fixtures/gpt2/nanogpt --out NANO_RUN
    mha export NANO_RUN --format nanogpt --out NANO_OUT
    mha export NANO_RUN --out NANO_HF
    VENV/bin/python scripts/check_gpt2_export.py --hf HF_OUT --hf-untied UNTIED_OUT \
        --nanogpt NANO_OUT/ckpt.pt --hf-nanogpt NANO_HF

Hugging Face: `GPT2LMHeadModel.from_pretrained` loads the directory with no missing or
unexpected key and gives the fixture's logits (untied: with a head of its own; nanoGPT's
`bias=False` model: with zero biases, nanoGPT's logits). nanoGPT: `torch.load(weights_only=True)` reads
the file, nanoGPT's `GPT` loads its model strictly, its AdamW loads the optimizer state, and
the next training step equals the one nanoGPT takes from its own checkpoint (on the same
machine), bit for bit.
Exit code 0 when every check passes.
"""

import argparse
import os
import sys

import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_gpt2_fixtures as m  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "tests", "fixtures", "gpt2")


def check_hf(path, name="hf"):
    from transformers import GPT2LMHeadModel
    model, info = GPT2LMHeadModel.from_pretrained(path, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    tied = model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    e = load_file(os.path.join(FIXTURES, f"{name}_expected.safetensors"))
    # nanoGPT's fixture holds the logits of each sequence but its last token.
    tokens = e["tokens"][:, :e["logits"].shape[1]]
    with torch.no_grad():
        diff = (model.eval()(tokens).logits - e["logits"]).abs().max().item()
    ok = (not problems and tied == (name != "hf-untied")
          and diff <= 1e-5 * e["logits"].abs().max().item())
    print(f"{name}: loading problems {problems or 'none'}, head tied: {tied}, logits max "
          f"difference {diff:.3g}: {'PASS' if ok else 'FAIL'}")
    return ok


def resume_step(path, tokens):
    """nanoGPT's `train.py --init_from=resume` on `path`, then one step on `tokens`."""
    ck = torch.load(path, weights_only=True)
    model = m.GPT(ck["model_args"])
    sd = {k.removeprefix("_orig_mod."): v for k, v in ck["model"].items()}
    model.load_state_dict(sd, strict=True)
    opt = m.optimizer(model)
    opt.load_state_dict(ck["optimizer"])
    loss, _ = m.train_step(model, opt, model, tokens)
    return loss, dict(model.named_parameters())


def check_nanogpt(path):
    e = load_file(os.path.join(FIXTURES, "nanogpt_expected.safetensors"))
    # The reference is nanoGPT's step from its own checkpoint on this machine and torch: the
    # fixture's numbers can differ in the last bits on another CPU (MKL's kernels).
    want_loss, want = resume_step(os.path.join(FIXTURES, "nanogpt", "ckpt.pt"), e["tokens"])
    loss, got = resume_step(path, e["tokens"])
    same = all(torch.equal(p, want[n]) for n, p in got.items())
    ok = same and loss.item() == want_loss.item()
    print(f"nanogpt: strict load, optimizer loaded, next step loss {loss.item():.7g} "
          f"(nanoGPT's from its own checkpoint {want_loss.item():.7g}), parameters equal: "
          f"{same}: {'PASS' if ok else 'FAIL'}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hf", help="a directory written by `mha export` of the hf fixture")
    ap.add_argument("--hf-untied", help="the same, of the hf-untied fixture")
    ap.add_argument("--nanogpt", help="a ckpt.pt written by `mha export --format nanogpt`")
    ap.add_argument("--hf-nanogpt", help="a directory written by `mha export` of the nanogpt "
                    "fixture (bias=False: zero biases)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    results = []
    if args.hf:
        results.append(check_hf(args.hf))
    if args.hf_untied:
        results.append(check_hf(args.hf_untied, "hf-untied"))
    if args.nanogpt:
        results.append(check_nanogpt(args.nanogpt))
    if args.hf_nanogpt:
        results.append(check_hf(args.hf_nanogpt, "nanogpt"))
    sys.exit(0 if results and all(results) else 1)


if __name__ == "__main__":
    main()
