#!/usr/bin/env python3
"""PyTorch reference twin of candle-mha's `NextTokenPredictor` (a tiny decoder-only LM).

The module tree and state_dict names here match the Rust model exactly:

    token_embedding.weight                      (V, E)
    position_embedding.weight                   (max_len, E)
    blocks.<i>.ln1.{weight,bias}                (E,)
    blocks.<i>.attn.in_proj_weight              (3E, E)   nn.MultiheadAttention
    blocks.<i>.attn.in_proj_bias                (3E,)
    blocks.<i>.attn.out_proj.{weight,bias}      (E, E), (E,)
    blocks.<i>.ln2.{weight,bias}                (E,)
    blocks.<i>.mlp.fc1.{weight,bias}            (ff, E), (ff,)
    blocks.<i>.mlp.fc2.{weight,bias}            (E, ff), (E,)
    ln_f.{weight,bias}                          (E,)
    head.{weight,bias}                          (V, E), (V,)

Each block is pre-LayerNorm: x + MHA(ln1(x)) with a causal bool mask (True = may not
attend) and an optional bool key_padding_mask (True = padding), then x + MLP(ln2(x)) with
an exact (erf) GELU. Residual dropout (`resid_dropout`, nanoGPT's `dropout`; the Rust
config's field of that name) drops on the embedding sum and on each block's attention and
MLP outputs before they are added to the residual stream: identity at 0 and in eval mode.
`masked_loss` is the mean cross-entropy over the positions where the
bool loss mask is True.

Use as a module (`scripts/make_model_fixtures.py` imports it), or from the command line to
check a checkpoint trained by `mha train` in PyTorch:

    python3 scripts/reference_model.py CHECKPOINT_DIR

(`python3`: a Python with torch, numpy and safetensors; the benches take it from
`MHA_BENCH_PYTHON`.) CHECKPOINT_DIR must hold `config.json` (keys vocab_size, max_len,
embed_dim, num_heads, num_layers, ff_dim, dropout; optional resid_dropout, 0 when missing)
and `model.safetensors` (the state_dict above). The weights
are loaded with `load_state_dict(strict=True)`, so a missing, extra or misshapen tensor
is an error. If `CHECKPOINT_DIR/logits_check.safetensors` exists (tensors `tokens` int64
(N, L), optional `key_padding_mask` uint8 (N, L) with 1 = padding, and `logits` f32
(N, L, V)), the logits are recomputed in eval mode (on CPU, with grad enabled so
nn.MultiheadAttention takes its slow path, as the fixtures do) and compared with the
stored ones: the max abs difference is printed, followed by PASS when it is at most
1e-4 * max|stored logits| (exit code 0) or FAIL (exit code 1).

`python3 scripts/reference_model.py train DATA_DIR ...` trains this model on a data
directory written by `mha prepare` and times its steps: see `scripts/reference_train.py`
(`./train` names a checkpoint directory called "train").

A virtual environment for it (CPU only is enough):

    python3 -m venv VENV && VENV/bin/pip install torch numpy safetensors
"""

import argparse
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIG_KEYS = ("vocab_size", "max_len", "embed_dim", "num_heads", "num_layers", "ff_dim",
               "dropout")
REL_TOL = 1e-4


class MLP(nn.Module):
    def __init__(self, embed_dim, ff_dim):
        super().__init__()
        self.fc1 = nn.Linear(embed_dim, ff_dim)
        self.fc2 = nn.Linear(ff_dim, embed_dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))  # exact erf GELU


class Block(nn.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, embed_dim, num_heads, ff_dim, dropout=0.0, resid_dropout=0.0):
        super().__init__()
        self.ln1 = nn.LayerNorm(embed_dim, eps=1e-5)
        self.attn = nn.MultiheadAttention(embed_dim, num_heads, dropout=dropout,
                                          batch_first=True)
        self.ln2 = nn.LayerNorm(embed_dim, eps=1e-5)
        self.mlp = MLP(embed_dim, ff_dim)
        self.resid_drop = nn.Dropout(resid_dropout)  # no parameters: state_dict unchanged

    def forward(self, x, attn_mask, key_padding_mask, is_causal=False):
        h = self.ln1(x)
        a = self.attn(h, h, h, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                      need_weights=False, is_causal=is_causal)[0]
        x = x + self.resid_drop(a)
        return x + self.resid_drop(self.mlp(self.ln2(x)))


class NextTokenPredictor(nn.Module):
    def __init__(self, vocab_size, max_len, embed_dim, num_heads, num_layers, ff_dim,
                 dropout=0.0, resid_dropout=0.0):
        super().__init__()
        self.vocab_size = vocab_size
        self.max_len = max_len
        self.token_embedding = nn.Embedding(vocab_size, embed_dim)
        self.position_embedding = nn.Embedding(max_len, embed_dim)
        self.embed_drop = nn.Dropout(resid_dropout)
        self.blocks = nn.ModuleList(
            [Block(embed_dim, num_heads, ff_dim, dropout, resid_dropout)
             for _ in range(num_layers)])
        self.ln_f = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, vocab_size)

    def forward(self, tokens, key_padding_mask=None, is_causal=False):
        """tokens: (N, L) long, L <= max_len; key_padding_mask: (N, L) bool, True = padding.

        is_causal: passed on to nn.MultiheadAttention with the causal mask, a hint that
        lets it hand `is_causal=True` instead of the mask to scaled_dot_product_attention
        when there is no key_padding_mask (the same result; what the Rust model does).

        Returns logits (N, L, vocab_size)."""
        L = tokens.shape[1]
        assert L <= self.max_len, (L, self.max_len)
        pos = torch.arange(L, device=tokens.device)
        x = self.embed_drop(self.token_embedding(tokens) + self.position_embedding(pos))
        # True = may not attend (causal)
        mask = torch.triu(torch.ones(L, L, dtype=torch.bool, device=tokens.device), 1)
        for b in self.blocks:
            x = b(x, mask, key_padding_mask, is_causal=is_causal)
        return self.head(self.ln_f(x))


def masked_loss(logits, targets, loss_mask):
    """Mean cross-entropy over the positions where loss_mask (bool) is True."""
    m = loss_mask.bool()
    return F.cross_entropy(logits[m], targets[m])


def from_config(cfg):
    missing = [k for k in CONFIG_KEYS if k not in cfg]
    if missing:
        raise KeyError(f"config lacks {missing}")
    # The GPT-2 family's options (an imported checkpoint) are not this twin's: its PyTorch
    # side is transformers' GPT2LMHeadModel or nanoGPT's GPT (scripts/make_gpt2_fixtures.py).
    gpt2 = {k: cfg[k] for k in ("bias", "tie_embeddings", "gelu", "layer_norm_eps",
                                "embed_dropout") if k in cfg}
    if gpt2:
        raise ValueError(f"config has GPT-2-family options {gpt2}: check it against "
                         "transformers or nanoGPT (docs/bring-your-own-gpt.md), not this twin")
    return NextTokenPredictor(
        vocab_size=int(cfg["vocab_size"]), max_len=int(cfg["max_len"]),
        embed_dim=int(cfg["embed_dim"]), num_heads=int(cfg["num_heads"]),
        num_layers=int(cfg["num_layers"]), ff_dim=int(cfg["ff_dim"]),
        dropout=float(cfg["dropout"]),
        resid_dropout=float(cfg.get("resid_dropout", 0.0)))  # older configs lack it


def config_from_json(path):
    with open(path) as f:
        return json.load(f)


def load_checkpoint(ckpt_dir):
    """Build the model from CKPT_DIR/config.json and load CKPT_DIR/model.safetensors
    strictly; returns the model in eval() mode."""
    from safetensors.torch import load_file

    model = from_config(config_from_json(os.path.join(ckpt_dir, "config.json")))
    sd = load_file(os.path.join(ckpt_dir, "model.safetensors"))
    model.load_state_dict(sd, strict=True)
    model.eval()
    return model


def check_logits(model, path):
    """Recompute logits for the tokens in `path`; returns (max_abs_diff, max_abs_ref, ok)."""
    from safetensors.torch import load_file

    t = load_file(path)
    tokens = t["tokens"].long()
    kpm = t["key_padding_mask"].bool() if "key_padding_mask" in t else None
    ref = t["logits"].float()
    with torch.enable_grad():  # parameters require grad -> MHA slow path
        got = model(tokens, kpm).detach()
    if got.shape != ref.shape:
        raise ValueError(f"logits shape {tuple(got.shape)} != stored {tuple(ref.shape)}")
    diff = (got - ref).abs().max().item()
    scale = ref.abs().max().item()
    ok = bool(diff <= REL_TOL * scale)
    return diff, scale, ok


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train"]:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import reference_train

        return reference_train.main(argv[1:], prog="reference_model.py train")
    ap = argparse.ArgumentParser(
        description="Load an `mha train` checkpoint into the PyTorch reference model and "
                    "check its logits.",
        epilog="`reference_model.py train DATA_DIR ...` trains and times the model on data "
               "written by `mha prepare` (see reference_train.py).")
    ap.add_argument("checkpoint_dir")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model = load_checkpoint(args.checkpoint_dir)
    n = sum(p.numel() for p in model.parameters())
    print(f"torch {torch.__version__}: loaded {args.checkpoint_dir} strictly "
          f"({len(model.state_dict())} tensors, {n} parameters)")
    check = os.path.join(args.checkpoint_dir, "logits_check.safetensors")
    if not os.path.exists(check):
        print(f"no {check}; nothing to compare")
        return 0
    diff, scale, ok = check_logits(model, check)
    print(f"logits max abs diff {diff:.3e} (tol {REL_TOL:g} * max|logits| "
          f"= {REL_TOL * scale:.3e}): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
