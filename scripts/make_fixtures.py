#!/usr/bin/env python3
"""Generate golden fixtures for candle-mha from PyTorch's nn.MultiheadAttention.

PyTorch is the oracle. For every case this script builds a small
`torch.nn.MultiheadAttention`, overwrites all of its parameters with random normal
values * 0.5 (so zero-initialised biases are exercised too), runs it on CPU in eval mode
with dropout 0 and grad enabled (so the "slow path", F.multi_head_attention_forward, runs,
never the inference fast path), backpropagates `(output * R).sum()` for a random R, and
writes everything to `tests/fixtures/<case>.safetensors`. The Rust tests load these
files and compare. The file format is described in tests/fixtures/README.md.

Rerun (CPU only, a throwaway venv is enough):

    python3 -m venv VENV && VENV/bin/pip install torch numpy safetensors
    VENV/bin/python scripts/make_fixtures.py [--out tests/fixtures]

Output is deterministic for a given torch version: every case reseeds with
torch.manual_seed(crc32(case name)).
"""

import argparse
import json
import math
import os
import struct
import warnings
import zlib

import torch
import torch.nn as nn
from safetensors.torch import save_file

DTYPES = {"f32": torch.float32, "f64": torch.float64}


def b(x):
    return "true" if x else "false"


# --------------------------------------------------------------------------------------
# Case definitions
# --------------------------------------------------------------------------------------

def case(name, description, **kw):
    cfg = dict(
        E=8, H=2, kdim=None, vdim=None, bias=True, add_bias_kv=False, add_zero_attn=False,
        batch_first=False, L=5, S=None, N=3,  # N=None means unbatched
        mode="self",  # "self" | "cross" | "kv_same"
        kpm=None,  # None | "bool" | "float"
        attn_mask=None,  # None | "bool2d" | "float2d" | "bool3d" | "float3d"
        need_weights=True, average=True, is_causal=False, dtype="f32", prefix="",
        fully_masked=None,  # None | "kpm_batch" | "mask_row" | "mask3d_head_row"
    )
    for k in kw:
        assert k in cfg, k
    cfg.update(kw)
    cfg["name"] = name
    cfg["description"] = description
    if cfg["mode"] == "self":
        assert cfg["S"] is None or cfg["S"] == cfg["L"]
        assert cfg["kdim"] is None and cfg["vdim"] is None
        cfg["S"] = cfg["L"]
    if cfg["S"] is None:
        cfg["S"] = cfg["L"]
    return cfg


def f64(cfg):
    c = dict(cfg)
    c["name"] = cfg["name"] + "_f64"
    c["dtype"] = "f64"
    c["description"] = cfg["description"].rstrip(".") + " (f64)."
    return c


CASES = []
_c1 = case("self_seq_first", "Default self-attention, sequence-first batched input.",
           E=8, H=2, L=5, N=3)
_c2 = case("self_batch_first", "Default self-attention, batch_first input.",
           E=8, H=2, L=5, N=3, batch_first=True)
_c3 = case("self_unbatched", "Self-attention on an unbatched (L, E) input.", L=4, N=None)
_c4 = case("cross_seq_first", "Cross-attention with L != S, sequence-first.",
           mode="cross", L=4, S=6, N=2)
_c5 = case("cross_key_is_value",
           "Cross-attention where key and value are the same tensor object, query differs.",
           mode="kv_same", L=4, S=6, N=2)
_c6 = case("kdim_vdim_batch_first",
           "Separate q/k/v projection weights (kdim=6, vdim=4), batch_first.",
           mode="cross", E=8, kdim=6, vdim=4, L=4, S=5, N=2, batch_first=True)
_c7 = case("no_bias", "bias=False: no in_proj_bias and no out_proj.bias.", bias=False, N=2)
_c8 = case("add_bias_kv", "add_bias_kv=True: learned bias_k/bias_v appended to keys/values.",
           add_bias_kv=True, N=2)
_c9 = case("add_zero_attn", "add_zero_attn=True: a zero key/value appended per head.",
           add_zero_attn=True, N=2)
_c10 = case("bias_kv_zero_attn_masks_cross",
            "Cross-attention with add_bias_kv, add_zero_attn, bool key_padding_mask and "
            "bool 2-D attn_mask.",
            mode="cross", add_bias_kv=True, add_zero_attn=True, kpm="bool",
            attn_mask="bool2d", L=4, S=5, N=2)
_c11 = case("kpm_bool", "Bool key_padding_mask (True = padding).", kpm="bool", L=5, N=3)
_c12 = case("kpm_float", "Float additive key_padding_mask with some -inf.", kpm="float",
            L=5, N=3)
_c13 = case("attn_mask_bool_2d", "Bool 2-D (L, S) attn_mask.", mode="cross",
            attn_mask="bool2d", L=4, S=5, N=2)
_c14 = case("attn_mask_float_2d", "Float 2-D (L, S) additive attn_mask with some -inf.",
            mode="cross", attn_mask="float2d", L=4, S=5, N=2)
_c15 = case("attn_mask_bool_3d", "Bool 3-D (N*H, L, S) attn_mask.", mode="cross",
            attn_mask="bool3d", L=4, S=5, N=2)
_c16 = case("attn_mask_float_3d", "Float 3-D (N*H, L, S) additive attn_mask with some -inf.",
            mode="cross", attn_mask="float3d", L=4, S=5, N=2)
_c17 = case("mixed_kpm_bool_mask_float",
            "Bool key_padding_mask combined with a float 2-D attn_mask (mismatched types).",
            kpm="bool", attn_mask="float2d", L=5, N=2)
_c18 = case("mixed_kpm_float_mask_bool",
            "Float key_padding_mask combined with a bool 2-D attn_mask (mismatched types).",
            kpm="float", attn_mask="bool2d", L=5, N=2)
_c19 = case("per_head_weights_masked",
            "average_attn_weights=False (per-head weights) with a bool kpm and float 3-D mask.",
            mode="cross", average=False, kpm="bool", attn_mask="float3d", L=4, S=5, N=2)
_c20 = case("no_need_weights", "need_weights=False (SDPA path) with a bool key_padding_mask.",
            need_weights=False, kpm="bool", L=5, N=2)
_c21 = case("causal_batch_first", "is_causal self-attention, batch_first, no attn_mask.",
            is_causal=True, batch_first=True, L=5, N=2)
_c22 = case("causal_kpm_bool", "is_causal self-attention with a bool key_padding_mask.",
            is_causal=True, kpm="bool", batch_first=True, L=5, N=3)
_c23 = case("single_head", "num_heads=1.", E=6, H=1, L=4, N=2)
_c24 = case("head_dim_3", "E=12, H=4: head_dim 3, so the sqrt(1/3) query scaling is inexact.",
            E=12, H=4, mode="cross", L=4, S=5, N=2)
_c25 = case("unbatched_mask_3d_kpm",
            "Unbatched self-attention with a bool 3-D (H, L, S) attn_mask and 1-D bool kpm.",
            L=5, N=None, attn_mask="bool3d", kpm="bool")
_c26 = case("unbatched_cross_kdim_vdim",
            "Unbatched cross-attention with kdim=5, vdim=3 (separate projection weights).",
            mode="cross", E=8, kdim=5, vdim=3, L=3, S=4, N=None)
_c27 = case("nested_prefix",
            "MHA nested in a small module tree; state_dict names carry the prefix "
            "encoder.layers.0.self_attn.",
            prefix="encoder.layers.0.self_attn", L=4, N=2)
_c28 = case("fully_masked_kpm",
            "Bool key_padding_mask masking every key of batch element 1 (fully masked rows).",
            kpm="bool", fully_masked="kpm_batch", L=4, N=3)
_c29 = case("fully_masked_attn_mask_row",
            "Bool 2-D attn_mask with one all-True row (a fully masked query row).",
            mode="cross", attn_mask="bool2d", fully_masked="mask_row", L=4, S=5, N=2)
_c30 = case("fully_masked_3d_one_head",
            "Bool 3-D attn_mask fully masking one query row of one (batch, head) only; "
            "averaged weights.",
            mode="cross", attn_mask="bool3d", fully_masked="mask3d_head_row", L=4, S=5, N=2)
_c31 = case("all_options",
            "kdim/vdim, add_bias_kv, add_zero_attn, batch_first, float 3-D attn_mask, float "
            "kpm and per-head weights together.",
            mode="cross", E=8, H=2, kdim=6, vdim=5, add_bias_kv=True, add_zero_attn=True,
            batch_first=True, attn_mask="float3d", kpm="float", average=False,
            L=4, S=5, N=2)

CASES = [_c1, _c2, _c3, _c4, _c5, _c6, _c7, _c8, _c9, _c10, _c11, _c12, _c13, _c14, _c15,
         _c16, _c17, _c18, _c19, _c20, _c21, _c22, _c23, _c24, _c25, _c26, _c27, _c28,
         _c29, _c30, _c31]
CASES += [f64(c) for c in (_c1, _c6, _c10, _c17, _c19, _c25)]


# --------------------------------------------------------------------------------------
# Masks
# --------------------------------------------------------------------------------------

def gen_kpm(kind, N, S, dtype):
    shape = (S,) if N is None else (N, S)
    if kind == "bool":
        return torch.rand(shape) < 0.3
    m = (torch.randn(shape) * 2).to(dtype)
    m[torch.rand(shape) < 0.25] = float("-inf")
    return m


def gen_attn_mask(kind, N, H, L, S, dtype):
    if kind.endswith("2d"):
        shape = (L, S)
    else:
        shape = (H, L, S) if N is None else (N * H, L, S)
    if kind.startswith("bool"):
        return torch.rand(shape) < 0.3
    m = (torch.randn(shape) * 2).to(dtype)
    m[torch.rand(shape) < 0.25] = float("-inf")
    return m


def to_additive(m):
    if m is None:
        return None
    if m.dtype == torch.bool:
        return torch.zeros(m.shape, dtype=torch.float64).masked_fill(m, float("-inf"))
    return m.to(torch.float64)


def fully_masked_rows(cfg, kpm, attn_mask):
    """(N', H, L) bool: query rows whose every key ends up at -inf (as PyTorch merges)."""
    N = 1 if cfg["N"] is None else cfg["N"]
    H, L, S = cfg["H"], cfg["L"], cfg["S"]
    total = torch.zeros(N, H, L, S, dtype=torch.float64)
    if kpm is not None:
        total = total + to_additive(kpm).reshape(N, 1, 1, S)
    if attn_mask is not None:
        a = to_additive(attn_mask)
        total = total + (a.reshape(1, 1, L, S) if a.dim() == 2 else a.reshape(N, H, L, S))
    if cfg["is_causal"]:
        causal = torch.triu(torch.ones(L, S, dtype=torch.bool), 1)
        total = total + to_additive(causal)
    if cfg["add_bias_kv"] or cfg["add_zero_attn"]:
        # the extra columns are never masked
        return torch.zeros(N, H, L, dtype=torch.bool)
    return torch.isneginf(total).all(-1)


# --------------------------------------------------------------------------------------
# Model construction
# --------------------------------------------------------------------------------------

class _Layer(nn.Module):
    def __init__(self, mha, E):
        super().__init__()
        self.self_attn = mha
        self.norm = nn.LayerNorm(E)


def build(cfg, dtype):
    mha = nn.MultiheadAttention(
        cfg["E"], cfg["H"], dropout=0.0, bias=cfg["bias"], add_bias_kv=cfg["add_bias_kv"],
        add_zero_attn=cfg["add_zero_attn"], kdim=cfg["kdim"], vdim=cfg["vdim"],
        batch_first=cfg["batch_first"], dtype=dtype)
    if cfg["prefix"]:
        assert cfg["prefix"] == "encoder.layers.0.self_attn", "only this tree is built"
        root = nn.ModuleDict({
            "encoder": nn.ModuleDict({"layers": nn.ModuleList([_Layer(mha, cfg["E"])])}),
            "head": nn.Linear(cfg["E"], 3),
        }).to(dtype)
    else:
        root = mha
    with torch.no_grad():
        for p in root.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    root.eval()
    mha.eval()
    return root, mha


def input_shape(cfg, seq, dim):
    if cfg["N"] is None:
        return (seq, dim)
    if cfg["batch_first"]:
        return (cfg["N"], seq, dim)
    return (seq, cfg["N"], dim)


# --------------------------------------------------------------------------------------
# One case
# --------------------------------------------------------------------------------------

def run_case(cfg):
    name = cfg["name"]
    dtype = DTYPES[cfg["dtype"]]
    torch.manual_seed(zlib.crc32(name.encode()))
    E, H, L, S, N = cfg["E"], cfg["H"], cfg["L"], cfg["S"], cfg["N"]
    kdim = cfg["kdim"] or E
    vdim = cfg["vdim"] or E
    prefix = cfg["prefix"] + "." if cfg["prefix"] else ""

    root, mha = build(cfg, dtype)

    # ---- inputs
    if cfg["mode"] == "self":
        x = torch.randn(input_shape(cfg, L, E), dtype=dtype).requires_grad_()
        q_in, k_in, v_in = x, x, x
    elif cfg["mode"] == "kv_same":
        q_in = torch.randn(input_shape(cfg, L, E), dtype=dtype).requires_grad_()
        kv = torch.randn(input_shape(cfg, S, kdim), dtype=dtype).requires_grad_()
        k_in, v_in = kv, kv
    else:
        q_in = torch.randn(input_shape(cfg, L, E), dtype=dtype).requires_grad_()
        k_in = torch.randn(input_shape(cfg, S, kdim), dtype=dtype).requires_grad_()
        v_in = torch.randn(input_shape(cfg, S, vdim), dtype=dtype).requires_grad_()

    # ---- masks (regenerate until no accidental fully masked row)
    kpm = attn_mask = None
    for _attempt in range(200):
        kpm = gen_kpm(cfg["kpm"], N, S, dtype) if cfg["kpm"] else None
        attn_mask = (gen_attn_mask(cfg["attn_mask"], N, H, L, S, dtype)
                     if cfg["attn_mask"] else None)
        if not fully_masked_rows(cfg, kpm, attn_mask).any():
            break
    else:
        raise RuntimeError(f"{name}: could not draw masks without fully masked rows")

    fm = cfg["fully_masked"]
    if fm == "kpm_batch":
        assert kpm is not None and kpm.dtype == torch.bool and N is not None
        kpm[1, :] = True
    elif fm == "mask_row":
        assert attn_mask is not None and attn_mask.dtype == torch.bool and attn_mask.dim() == 2
        attn_mask[1, :] = True
    elif fm == "mask3d_head_row":
        assert attn_mask is not None and attn_mask.dtype == torch.bool and attn_mask.dim() == 3
        attn_mask[1 * H + 0, 2, :] = True  # batch 1, head 0, query row 2
    else:
        assert fm is None
    rows = fully_masked_rows(cfg, kpm, attn_mask)
    fully_masked = bool(rows.any())
    assert fully_masked == (fm is not None), name

    call_mask = attn_mask
    if cfg["is_causal"]:
        assert attn_mask is None, "is_causal cases carry no explicit attn_mask"
        call_mask = torch.triu(torch.ones(L, S, dtype=torch.bool), 1)

    def forward(need_weights, average):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Support for mismatched")
            return mha(q_in, k_in, v_in, key_padding_mask=kpm, need_weights=need_weights,
                       attn_mask=call_mask, average_attn_weights=average, is_causal=False)

    assert torch.is_grad_enabled() and not mha.training
    need_weights = cfg["need_weights"] or fully_masked
    if fully_masked:
        # Output and grads from the SDPA path (safe softmax: zero context for masked rows),
        # weights from the explicit path with NaN -> 0, averaged after zeroing per head.
        out, w = forward(False, cfg["average"])
        assert w is None
        _, w_heads = forward(True, False)
        w_heads = torch.nan_to_num(w_heads.detach(), nan=0.0)
        weights = w_heads.mean(dim=-3) if cfg["average"] else w_heads
    else:
        out, w = forward(cfg["need_weights"], cfg["average"])
        weights = w.detach() if cfg["need_weights"] else None
        if not cfg["need_weights"]:
            assert w is None

    R = torch.randn(out.shape, dtype=dtype)
    (out * R).sum().backward()

    # ---- collect tensors
    t = {}
    for k, v in root.state_dict().items():
        t["param." + k] = v.detach().clone().contiguous()
    t["query"] = q_in.detach().clone().contiguous()
    if cfg["mode"] != "self":
        t["key"] = k_in.detach().clone().contiguous()
        t["value"] = v_in.detach().clone().contiguous()
    if kpm is not None:
        t["key_padding_mask"] = (kpm.to(torch.uint8) if kpm.dtype == torch.bool
                                 else kpm.clone()).contiguous()
    if attn_mask is not None:
        t["attn_mask"] = (attn_mask.to(torch.uint8) if attn_mask.dtype == torch.bool
                          else attn_mask.clone()).contiguous()
    t["output"] = out.detach().clone().contiguous()
    if weights is not None:
        t["weights"] = weights.clone().contiguous()
    t["R"] = R.contiguous()
    t["grad.query"] = q_in.grad.clone().contiguous()
    if cfg["mode"] != "self":
        # key-is-value: one tensor, so grad.key == grad.value == its total gradient
        t["grad.key"] = k_in.grad.clone().contiguous()
        t["grad.value"] = v_in.grad.clone().contiguous()
    for pname, p in mha.named_parameters():
        assert p.grad is not None, pname
        t["grad.param." + prefix + pname] = p.grad.clone().contiguous()
    # only the MHA's parameters get gradients
    for pname, p in root.named_parameters():
        if not pname.startswith(prefix):
            assert p.grad is None

    # ---- sanity checks
    for k, v in t.items():
        if k.startswith("grad.") or k in ("output", "weights", "R") or k.startswith("param."):
            assert torch.isfinite(v).all(), f"{name}: {k} not finite"
        if k not in ("key_padding_mask", "attn_mask") or v.dtype != torch.uint8:
            assert v.dtype == dtype, f"{name}: {k} has dtype {v.dtype}"
    for pname in mha.state_dict():
        assert "param." + prefix + pname in t
    L_out = out.shape
    assert L_out == q_in.shape, (L_out, q_in.shape)
    if weights is not None:
        Sp = S + int(cfg["add_bias_kv"]) + int(cfg["add_zero_attn"])
        if N is None:
            exp = (L, Sp) if cfg["average"] else (H, L, Sp)
        else:
            exp = (N, L, Sp) if cfg["average"] else (N, H, L, Sp)
        assert tuple(weights.shape) == exp, (name, weights.shape, exp)
    if fully_masked:
        # masked rows: zero weights; every other row sums to 1
        per_head = w_heads.reshape(-1, H, L, w_heads.shape[-1])
        sums = per_head.sum(-1)
        r = rows
        assert torch.all(sums[r] == 0)
        assert torch.allclose(sums[~r], torch.ones_like(sums[~r]), atol=1e-5)

    meta = {
        "embed_dim": str(E), "num_heads": str(H), "kdim": str(kdim), "vdim": str(vdim),
        "bias": b(cfg["bias"]), "add_bias_kv": b(cfg["add_bias_kv"]),
        "add_zero_attn": b(cfg["add_zero_attn"]),
        "batch_first": b(cfg["batch_first"]),
        "self_attn": b(cfg["mode"] == "self"),
        "key_is_value": b(cfg["mode"] == "kv_same"),
        "need_weights": b(need_weights),
        "average_attn_weights": b(cfg["average"]),
        "is_causal": b(cfg["is_causal"]),
        "dtype": cfg["dtype"], "prefix": cfg["prefix"],
        "fully_masked": b(fully_masked),
        "torch_version": torch.__version__,
        "description": cfg["description"],
    }
    return t, meta


def canonicalize_header(path):
    """Sort the __metadata__ keys in the file header so reruns are byte-identical.

    safetensors keeps metadata in a hash map, so its key order changes from run to run.
    Tensor data and offsets are untouched; the header keeps its length (space padded,
    as safetensors itself pads it).
    """
    with open(path, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        if "__metadata__" not in header:
            return
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
        new = json.dumps(header, separators=(",", ":")).encode()
        assert len(new) <= n, (path, len(new), n)
        f.seek(8)
        f.write(new + b" " * (n - len(new)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--out", default=os.path.join(root_dir, "tests", "fixtures"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}")
    names = [c["name"] for c in CASES]
    assert len(names) == len(set(names))
    for cfg in CASES:
        tensors, meta = run_case(cfg)
        path = os.path.join(args.out, cfg["name"] + ".safetensors")
        save_file(tensors, path, metadata=meta)
        canonicalize_header(path)
        print(f"wrote {path} ({len(tensors)} tensors, {os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
