#!/usr/bin/env python3
"""Fixtures of the Llama-family building blocks from PyTorch and transformers.

- `tests/fixtures/sdpa/<case>.safetensors`: `F.scaled_dot_product_attention` on random
  q, k, v (f32 and f64) for every mask form, `is_causal`, `scale` and `enable_gqa`; the output
  and the gradients of `sum(out * R)` w.r.t. q, k, v (and a float mask).
- `tests/fixtures/layers/*.safetensors`: `torch.nn.RMSNorm` and transformers' `LlamaRMSNorm`
  (f32 forward and gradients; bf16 forward), the rotary embedding of transformers' Llama
  (default, linear and llama3 `rope_parameters`: `inv_freq`, cos/sin and `apply_rotary_pos_emb`
  with gradients), and `LlamaMLP` (SwiGLU) with gradients.

Metadata (strings) says what each case is. Rerun in a throwaway venv:

    python3 -m venv VENV && VENV/bin/pip install torch numpy safetensors transformers
    VENV/bin/python scripts/make_sdpa_fixtures.py [--out tests/fixtures]
"""

import argparse
import os
import zlib

import torch
import torch.nn.functional as F
from safetensors.torch import save_file


def seed(name):
    torch.manual_seed(zlib.crc32(name.encode()))


def save(path, tensors, meta):
    tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
    meta = {k: str(v) for k, v in meta.items()}
    meta["torch"] = torch.__version__
    save_file(tensors, path, metadata=meta)


def sdpa_case(out, name, B=2, Hq=4, Hk=4, L=5, S=None, E=8, Ev=None, mask=None,
              causal=False, scale=None, gqa=False, dtype=torch.float32, fully_masked=False):
    seed(name)
    S = S or L
    Ev = Ev or E
    lead = (B,) if B else ()
    q = torch.randn(*lead, Hq, L, E, dtype=dtype, requires_grad=True)
    k = torch.randn(*lead, Hk, S, E, dtype=dtype, requires_grad=True)
    v = torch.randn(*lead, Hk, S, Ev, dtype=dtype, requires_grad=True)
    m = None
    if mask == "bool_ls":
        m = torch.rand(L, S) > 0.3
    elif mask == "bool_b1ls":
        m = torch.rand(*lead, 1, L, S) > 0.3
    elif mask == "bool_bhls":
        m = torch.rand(*lead, Hq, L, S) > 0.3
    elif mask == "float_ls":
        m = torch.randn(L, S, dtype=dtype)
    elif mask == "float_bhls":
        m = torch.randn(*lead, Hq, L, S, dtype=dtype)
    elif mask == "float_1s":
        m = torch.randn(1, S, dtype=dtype)
    if m is not None and fully_masked:
        if m.dtype == torch.bool:
            m[..., 1, :] = False
        else:
            m[..., 1, :] = float("-inf")
    if m is not None and m.dtype != torch.bool:
        m.requires_grad_(True)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal, scale=scale,
                                       enable_gqa=gqa)
    r = torch.randn_like(o)
    (o * r).sum().backward()
    t = {"query": q, "key": k, "value": v, "out": o, "grad_out": r,
         "grad.query": q.grad, "grad.key": k.grad, "grad.value": v.grad}
    if m is not None:
        t["attn_mask"] = m.to(torch.uint8) if m.dtype == torch.bool else m
        if m.dtype != torch.bool:
            t["grad.attn_mask"] = m.grad
    meta = dict(is_causal="true" if causal else "false", enable_gqa="true" if gqa else "false",
                scale="none" if scale is None else repr(scale),
                dtype="f32" if dtype == torch.float32 else "f64", mask=mask or "none")
    save(os.path.join(out, "sdpa", name + ".safetensors"), t, meta)


def sdpa_fixtures(out):
    c = sdpa_case
    c(out, "plain")
    c(out, "plain_f64", dtype=torch.float64)
    c(out, "causal", causal=True, L=7)
    c(out, "causal_l_lt_s", causal=True, L=3, S=6)
    c(out, "scale", scale=0.3)
    c(out, "bool_ls", mask="bool_ls", S=6)
    c(out, "bool_b1ls", mask="bool_b1ls")
    c(out, "bool_bhls_gqa", mask="bool_bhls", Hq=6, Hk=2, gqa=True)
    c(out, "float_ls", mask="float_ls")
    c(out, "float_bhls", mask="float_bhls", dtype=torch.float64)
    c(out, "float_1s_gqa", mask="float_1s", Hq=6, Hk=3, gqa=True, S=9)
    c(out, "fully_masked_row_bool", mask="bool_ls", fully_masked=True)
    c(out, "fully_masked_row_float", mask="float_bhls", fully_masked=True)
    c(out, "gqa_1", Hq=4, Hk=4, gqa=True, causal=True, L=6)
    c(out, "gqa_3", Hq=9, Hk=3, gqa=True, causal=True, L=6)
    c(out, "gqa_7", Hq=7, Hk=1, gqa=True, causal=True, L=6)
    c(out, "gqa_3_f64", Hq=6, Hk=2, gqa=True, causal=True, L=33, dtype=torch.float64)
    c(out, "long_gqa", Hq=4, Hk=2, gqa=True, causal=True, L=300, E=16, B=1)
    c(out, "value_dim", Ev=5)
    c(out, "unbatched", B=0, Hq=3, Hk=3)


def layer_fixtures(out):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import (LlamaMLP, LlamaRMSNorm,
                                                          LlamaRotaryEmbedding,
                                                          apply_rotary_pos_emb)

    d = os.path.join(out, "layers")
    # RMSNorm
    seed("rms_norm")
    x = torch.randn(3, 5, 16, requires_grad=True)
    w = torch.randn(16) * 0.5 + 1.0
    t = {"x": x}
    for kind, mod in [("torch", torch.nn.RMSNorm(16, eps=1e-6)),
                      ("torch_default_eps", torch.nn.RMSNorm(16)),
                      ("llama", LlamaRMSNorm(16, eps=1e-5))]:
        with torch.no_grad():
            mod.weight.copy_(w)
        x.grad = None
        y = mod(x)
        r = torch.randn_like(y)
        (y * r).sum().backward()
        t[f"{kind}.y"] = y
        t[f"{kind}.grad_out"] = r
        t[f"{kind}.grad.x"] = x.grad.clone()
        t[f"{kind}.grad.weight"] = mod.weight.grad
        xb = x.detach().to(torch.bfloat16)
        with torch.no_grad():
            if kind == "llama":
                t[f"{kind}.y_bf16"] = mod(xb)  # f32 weight: promoted to f32
                mod_b = LlamaRMSNorm(16, eps=1e-5).to(torch.bfloat16)
                mod_b.weight.copy_(w.to(torch.bfloat16))
                t[f"{kind}.y_bf16_bf16w"] = mod_b(xb)
            else:
                mod_b = torch.nn.RMSNorm(16, eps=mod.eps).to(torch.bfloat16)
                mod_b.weight.copy_(w.to(torch.bfloat16))
                t[f"{kind}.y_bf16"] = mod_b(xb)
    t["weight"] = w
    save(os.path.join(d, "rms_norm.safetensors"), t,
         dict(torch_eps="1e-6", llama_eps="1e-5"))

    # Rotary embeddings
    t = {}
    cases = {
        "default": dict(rope_type="default", rope_theta=10000.0),
        "theta": dict(rope_type="default", rope_theta=500000.0),
        "linear": dict(rope_type="linear", rope_theta=10000.0, factor=4.0),
        "llama3": dict(rope_type="llama3", rope_theta=500000.0, factor=32.0,
                       low_freq_factor=1.0, high_freq_factor=4.0,
                       original_max_position_embeddings=64),
    }
    for name, rp in cases.items():
        cfg = LlamaConfig(hidden_size=64, num_attention_heads=2, head_dim=32,
                          max_position_embeddings=4096, rope_parameters=rp)
        rope = LlamaRotaryEmbedding(cfg)
        seed("rope_" + name)
        q = torch.randn(2, 2, 7, 32, requires_grad=True)
        k = torch.randn(2, 1, 7, 32, requires_grad=True)
        pos = (torch.arange(7) + 1000).unsqueeze(0).expand(2, 7)
        cos, sin = rope(q, pos)
        qe, ke = apply_rotary_pos_emb(q, k, cos, sin)
        r = torch.randn_like(qe)
        (qe * r).sum().backward()
        t.update({f"{name}.inv_freq": rope.inv_freq, f"{name}.cos": cos[0], f"{name}.sin": sin[0],
                  f"{name}.q": q, f"{name}.k": k, f"{name}.q_embed": qe, f"{name}.k_embed": ke,
                  f"{name}.grad_out": r, f"{name}.grad.q": q.grad})
    save(os.path.join(d, "rope.safetensors"), t, dict(offset="1000", head_dim="32"))

    # SwiGLU
    cfg = LlamaConfig(hidden_size=16, intermediate_size=40, hidden_act="silu", num_attention_heads=2)
    seed("swiglu")
    mlp = LlamaMLP(cfg)
    x = torch.randn(2, 3, 16, requires_grad=True)
    y = mlp(x)
    r = torch.randn_like(y)
    (y * r).sum().backward()
    t = {"x": x, "y": y, "grad_out": r, "grad.x": x.grad}
    for n, p in mlp.named_parameters():
        t["param." + n] = p
        t["grad." + n] = p.grad
    save(os.path.join(d, "swiglu.safetensors"), t, dict(hidden="40"))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures")
    a = ap.parse_args()
    os.makedirs(os.path.join(a.out, "sdpa"), exist_ok=True)
    os.makedirs(os.path.join(a.out, "layers"), exist_ok=True)
    sdpa_fixtures(a.out)
    layer_fixtures(a.out)
