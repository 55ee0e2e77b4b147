#!/usr/bin/env python3
"""Generate next-token-model and AdamW fixtures for candle-mha from PyTorch.

PyTorch is the oracle. This script writes two files to `tests/fixtures/model/`:

* `next_token.safetensors`: the reference `NextTokenPredictor` of
  `scripts/reference_model.py` (vocab 11, max_len 8, E 16, 4 heads, 2 layers, ff 32,
  dropout 0) with EVERY parameter overwritten by `randn_like * 0.3`, except the LayerNorm
  weights, which get `1 + randn_like * 0.1`. In eval() mode (grad enabled, so
  nn.MultiheadAttention takes its slow path) it runs a padded batch, computes the masked
  cross-entropy loss, its gradients and total grad norm, clips to max_norm 0.5, and takes
  ONE torch.optim.AdamW step. Everything before and after is stored.
* `adamw.safetensors`: a standalone AdamW run, 6 steps on two small tensors with stored
  gradients and a learning rate changed before every step.

The files are described in tests/fixtures/model/README.md.

Rerun (CPU only, a throwaway venv is enough):

    python3 -m venv VENV && VENV/bin/pip install torch numpy safetensors
    VENV/bin/python scripts/make_model_fixtures.py [--out tests/fixtures/model]

Output is deterministic for a given torch version: every file reseeds with
torch.manual_seed(crc32(file stem)), and safetensors metadata keys are sorted
(canonicalize_header from scripts/make_fixtures.py).
"""

import argparse
import os
import sys
import zlib

import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import canonicalize_header  # noqa: E402
from reference_model import NextTokenPredictor, from_config, masked_loss  # noqa: E402

CONFIG = dict(vocab_size=11, max_len=8, embed_dim=16, num_heads=4, num_layers=2, ff_dim=32,
              dropout=0.0)
N = 3
PADDED = {1: 3, 2: 1}  # batch index -> number of padded positions at the end
PAD_ID = 0
CLIP_MAX_NORM = 0.5
NT_OPT = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

ADAMW_STEPS = 6
ADAMW_LR = 3e-3
ADAMW_OPT = dict(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05)


def seed(name):
    torch.manual_seed(zlib.crc32(name.encode()))


def c(t):
    return t.detach().clone().contiguous()


def write(path, tensors, meta):
    save_file(tensors, path, metadata=meta)
    canonicalize_header(path)
    print(f"wrote {path} ({len(tensors)} tensors, {os.path.getsize(path)} bytes)")


# --------------------------------------------------------------------------------------
# next_token.safetensors
# --------------------------------------------------------------------------------------

def randomize(model):
    """Every parameter <- randn_like * 0.3; LayerNorm weights <- 1 + randn_like * 0.1."""
    ln_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.LayerNorm)}
    assert len(ln_weights) == 2 * CONFIG["num_layers"] + 1
    with torch.no_grad():
        for _, p in model.named_parameters():
            if id(p) in ln_weights:
                p.copy_(1 + torch.randn_like(p) * 0.1)
            else:
                p.copy_(torch.randn_like(p) * 0.3)
    model.eval()
    return model


def make_next_token():
    seed("next_token")
    model = randomize(from_config(CONFIG))
    assert isinstance(model, NextTokenPredictor)
    V, L = CONFIG["vocab_size"], CONFIG["max_len"]

    tokens = torch.randint(0, V, (N, L), dtype=torch.int64)
    kpm = torch.zeros(N, L, dtype=torch.bool)
    for i, k in PADDED.items():
        kpm[i, L - k:] = True
    tokens[kpm] = PAD_ID
    targets = torch.randint(0, V, (N, L), dtype=torch.int64)
    loss_mask = ~kpm

    t = {}
    for k, v in model.state_dict().items():
        t["param." + k] = c(v)
    t["tokens"] = tokens.contiguous()
    t["key_padding_mask"] = kpm.to(torch.uint8).contiguous()
    t["targets"] = targets.contiguous()
    t["loss_mask"] = loss_mask.to(torch.uint8).contiguous()

    assert torch.is_grad_enabled() and not model.training
    logits = model(tokens, kpm)
    loss = masked_loss(logits, targets, loss_mask)
    loss.backward()
    t["logits"] = c(logits)
    t["loss"] = c(loss)
    assert t["loss"].shape == ()

    params = list(model.parameters())
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        t["grad." + name] = c(p.grad)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm=CLIP_MAX_NORM)
    t["grad_norm"] = c(grad_norm).to(torch.float32)
    # independent check of the total norm, and that clipping happened
    ref_norm = torch.sqrt(sum((t["grad." + n].double() ** 2).sum()
                              for n, _ in model.named_parameters()))
    assert abs(ref_norm.item() - grad_norm.item()) <= 1e-5 * ref_norm.item()
    assert grad_norm.item() > CLIP_MAX_NORM, "clipping should be active in this fixture"

    opt = torch.optim.AdamW(params, **NT_OPT)
    opt.step()
    for name, p in model.named_parameters():
        t["updated." + name] = c(p)
        st = opt.state[p]
        t["exp_avg." + name] = c(st["exp_avg"])
        t["exp_avg_sq." + name] = c(st["exp_avg_sq"])

    for k, v in t.items():
        if k not in ("tokens", "targets", "key_padding_mask", "loss_mask"):
            assert v.dtype == torch.float32, (k, v.dtype)
            assert torch.isfinite(v).all(), k

    meta = {k: str(v) for k, v in CONFIG.items()}
    meta.update({
        "clip_max_norm": str(CLIP_MAX_NORM), "lr": str(NT_OPT["lr"]),
        "beta1": str(NT_OPT["betas"][0]), "beta2": str(NT_OPT["betas"][1]),
        "eps": str(NT_OPT["eps"]), "weight_decay": str(NT_OPT["weight_decay"]),
        "pad_id": str(PAD_ID), "torch_version": torch.__version__,
        "description": "NextTokenPredictor forward, masked loss, grads, grad-norm clip and "
                       "one AdamW step.",
    })
    return t, meta, model


# --------------------------------------------------------------------------------------
# adamw.safetensors
# --------------------------------------------------------------------------------------

def make_adamw():
    seed("adamw")
    p0 = torch.randn(5, 3).requires_grad_()
    p1 = torch.randn(4).requires_grad_()
    grads = [(torch.randn(5, 3), torch.randn(4)) for _ in range(ADAMW_STEPS)]
    t = {"init.p0": c(p0), "init.p1": c(p1)}
    opt = torch.optim.AdamW([p0, p1], lr=ADAMW_LR, **ADAMW_OPT)
    for step, (g0, g1) in enumerate(grads):
        lr_t = ADAMW_LR * (step + 1) / ADAMW_STEPS
        for g in opt.param_groups:
            g["lr"] = lr_t
        p0.grad = g0.clone()
        p1.grad = g1.clone()
        opt.step()
        t[f"grad.t{step}.p0"] = c(g0)
        t[f"grad.t{step}.p1"] = c(g1)
        t[f"lr.t{step}"] = torch.tensor(lr_t, dtype=torch.float64)
        t[f"after.t{step}.p0"] = c(p0)
        t[f"after.t{step}.p1"] = c(p1)
    for n, p in (("p0", p0), ("p1", p1)):
        t["exp_avg." + n] = c(opt.state[p]["exp_avg"])
        t["exp_avg_sq." + n] = c(opt.state[p]["exp_avg_sq"])
    for k, v in t.items():
        assert v.dtype == (torch.float64 if k.startswith("lr.") else torch.float32), k
    meta = {
        "steps": str(ADAMW_STEPS), "base_lr": str(ADAMW_LR),
        "lr_schedule": "lr_t = base_lr * (t+1) / steps, set before step t",
        "beta1": str(ADAMW_OPT["betas"][0]), "beta2": str(ADAMW_OPT["betas"][1]),
        "eps": str(ADAMW_OPT["eps"]), "weight_decay": str(ADAMW_OPT["weight_decay"]),
        "torch_version": torch.__version__,
        "description": "torch.optim.AdamW, 6 steps on p0 (5,3) and p1 (4,) with stored "
                       "gradients and a varying lr.",
    }
    return t, meta


# --------------------------------------------------------------------------------------

def reload_check(path, tensors, meta):
    from safetensors import safe_open

    back = load_file(path)
    assert sorted(back) == sorted(tensors), path
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape, k
        assert torch.equal(back[k], v), k
    with safe_open(path, "pt") as f:
        assert f.metadata() == meta, path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--out", default=os.path.join(root_dir, "tests", "fixtures", "model"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}")

    t, meta, model = make_next_token()
    path = os.path.join(args.out, "next_token.safetensors")
    write(path, t, meta)
    reload_check(path, t, meta)
    # the stored params rebuild the same logits through a fresh model (strict load)
    fresh = from_config(CONFIG)
    back = load_file(path)
    fresh.load_state_dict({k[len("param."):]: v for k, v in back.items()
                           if k.startswith("param.")}, strict=True)
    fresh.eval()
    again = fresh(back["tokens"], back["key_padding_mask"].bool())
    assert torch.equal(again.detach(), back["logits"]), "logits not reproducible"

    t, meta = make_adamw()
    path = os.path.join(args.out, "adamw.safetensors")
    write(path, t, meta)
    reload_check(path, t, meta)


if __name__ == "__main__":
    main()
