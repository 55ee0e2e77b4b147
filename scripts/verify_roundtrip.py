#!/usr/bin/env python3
"""Check a candle-mha MultiheadAttention export against PyTorch (run by hand).

The Rust side writes two files into DIR:

  DIR/mha.safetensors  the state_dict of an nn.MultiheadAttention, saved by candle-mha.
                       Keys must be exactly PyTorch's, and the header metadata must
                       include {"format": "pt"}.
  DIR/io.safetensors   tensors: `query`, optional `key` and `value` (if absent this is
                       self-attention and the module is called as mha(q, q, q)), `output`,
                       `weights` (averaged attention weights), optional `key_padding_mask`
                       (uint8, 1 = masked; a float additive mask is passed as is).
                       metadata (strings): `embed_dim`, `num_heads`, `kdim`, `vdim`,
                       `bias`, `add_bias_kv`, `add_zero_attn`, `batch_first`
                       ("true"/"false"), and `dtype` ("f32"/"f64").

This script builds nn.MultiheadAttention with that config and dtype on CPU, loads
mha.safetensors with load_state_dict(strict=True), runs it in eval mode with grad enabled
(so the slow path, F.multi_head_attention_forward, runs) with need_weights=True and
average_attn_weights=True, and compares output and weights with the stored ones.

A comparison passes when max|ours - stored| <= tol * max(1, max|stored|), where tol is
1e-5 for f32 and 1e-10 for f64. NaNs must sit in the same places. The script prints a
PASS/FAIL report and exits 0 if everything passes, 1 otherwise (including unreadable or
inconsistent files).

    VENV/bin/python scripts/verify_roundtrip.py DIR

(VENV: a virtual environment with torch, e.g. python3 -m venv VENV && VENV/bin/pip install
torch numpy safetensors.)
"""

import argparse
import os
import sys
import traceback

import torch
import torch.nn as nn
from safetensors import safe_open

DTYPES = {"f32": torch.float32, "f64": torch.float64}
TOL = {"f32": 1e-5, "f64": 1e-10}
REQUIRED_META = ("embed_dim", "num_heads", "kdim", "vdim", "bias", "add_bias_kv",
                 "add_zero_attn", "batch_first", "dtype")


class CheckError(Exception):
    pass


def read_st(path):
    """(tensors, metadata) of a safetensors file."""
    if not os.path.isfile(path):
        raise CheckError(f"missing file {path}")
    with safe_open(path, "pt", device="cpu") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return tensors, meta


def parse_bool(meta, key):
    v = meta[key]
    if v not in ("true", "false"):
        raise CheckError(f"io metadata {key}={v!r}: expected 'true' or 'false'")
    return v == "true"


def parse_int(meta, key):
    try:
        return int(meta[key])
    except ValueError:
        raise CheckError(f"io metadata {key}={meta[key]!r}: expected an integer") from None


def compare(name, ours, stored, tol):
    """Returns (ok, line)."""
    if tuple(ours.shape) != tuple(stored.shape):
        return False, (f"FAIL {name}: shape mismatch, PyTorch {tuple(ours.shape)} vs stored "
                       f"{tuple(stored.shape)}")
    if ours.dtype != stored.dtype:
        return False, f"FAIL {name}: dtype mismatch, PyTorch {ours.dtype} vs stored {stored.dtype}"
    o = ours.detach().to(torch.float64)
    s = stored.to(torch.float64)
    nan_o, nan_s = torch.isnan(o), torch.isnan(s)
    if not torch.equal(nan_o, nan_s):
        return False, (f"FAIL {name}: NaN positions differ (PyTorch {int(nan_o.sum())} NaNs, "
                       f"stored {int(nan_s.sum())})")
    keep = ~nan_o
    o, s = o[keep], s[keep]
    if o.numel() == 0:
        return True, f"PASS {name}: all NaN in both"
    inf_o, inf_s = torch.isinf(o), torch.isinf(s)
    if not torch.equal(inf_o, inf_s) or not torch.equal(o[inf_o], s[inf_s]):
        return False, f"FAIL {name}: infinities differ"
    o, s = o[~inf_o], s[~inf_s]
    if o.numel() == 0:
        return True, f"PASS {name}: all inf, equal"
    diff = (o - s).abs().max().item()
    mag = s.abs().max().item()
    thresh = tol * max(1.0, mag)
    ok = diff <= thresh
    line = (f"{'PASS' if ok else 'FAIL'} {name}: shape {tuple(ours.shape)}, max abs diff "
            f"{diff:.3e}, max |stored| {mag:.3e}, threshold {thresh:.3e}")
    if ok:
        line += f" (diff/threshold {diff / thresh:.3f})"
    return ok, line


def check(d):
    lines, ok_all = [], True

    def note(ok, line):
        nonlocal ok_all
        ok_all = ok_all and ok
        lines.append(line)
        print(line)

    mha_sd, mha_meta = read_st(os.path.join(d, "mha.safetensors"))
    io, meta = read_st(os.path.join(d, "io.safetensors"))

    # ---- config
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise CheckError(f"io.safetensors metadata lacks {missing}")
    dt_name = meta["dtype"]
    if dt_name not in DTYPES:
        raise CheckError(f"io metadata dtype={dt_name!r}: expected 'f32' or 'f64'")
    dtype, tol = DTYPES[dt_name], TOL[dt_name]
    cfg = dict(
        embed_dim=parse_int(meta, "embed_dim"), num_heads=parse_int(meta, "num_heads"),
        kdim=parse_int(meta, "kdim"), vdim=parse_int(meta, "vdim"),
        bias=parse_bool(meta, "bias"), add_bias_kv=parse_bool(meta, "add_bias_kv"),
        add_zero_attn=parse_bool(meta, "add_zero_attn"),
        batch_first=parse_bool(meta, "batch_first"))
    print("config: " + ", ".join(f"{k}={v}" for k, v in cfg.items()) + f", dtype={dt_name}")
    print(f"torch {torch.__version__}")

    # ---- mha.safetensors header metadata
    fmt = mha_meta.get("format")
    note(fmt == "pt", f"{'PASS' if fmt == 'pt' else 'FAIL'} mha.safetensors metadata "
                      f"format={fmt!r} (want 'pt'); metadata {dict(sorted(mha_meta.items()))}")

    # ---- build and load
    mha = nn.MultiheadAttention(dropout=0.0, dtype=dtype, **cfg)
    expected_keys = sorted(mha.state_dict())
    got_keys = sorted(mha_sd)
    if expected_keys != got_keys:
        note(False, f"FAIL state_dict keys: missing {sorted(set(expected_keys) - set(got_keys))}"
                    f", unexpected {sorted(set(got_keys) - set(expected_keys))}")
    else:
        note(True, f"PASS state_dict keys: {len(got_keys)} keys, exactly PyTorch's "
                   f"({', '.join(got_keys)})")
    bad = [f"{k} {tuple(v.shape)} {v.dtype}" for k, v in mha_sd.items()
           if k in mha.state_dict() and (v.dtype != dtype
                                         or v.shape != mha.state_dict()[k].shape)]
    if bad:
        note(False, f"FAIL state_dict shapes/dtypes (want {dtype}): {bad}")
    else:
        note(True, f"PASS state_dict shapes/dtypes: all {dtype}, shapes match")
    try:
        mha.load_state_dict(mha_sd, strict=True)
    except Exception as e:  # noqa: BLE001
        note(False, f"FAIL load_state_dict(strict=True): {str(e).strip()}")
        return False
    note(True, "PASS load_state_dict(strict=True)")
    mha.eval()

    # ---- inputs
    if "query" not in io or "output" not in io:
        raise CheckError("io.safetensors lacks `query` or `output`")
    q = io["query"]
    has_k, has_v = "key" in io, "value" in io
    if has_k != has_v:
        raise CheckError("io.safetensors has only one of `key` / `value`")
    k, v = (io["key"], io["value"]) if has_k else (q, q)
    for name, t in (("query", q), ("key", k), ("value", v)):
        if t.dtype != dtype:
            note(False, f"FAIL io {name} dtype {t.dtype}, want {dtype}")
    kpm = io.get("key_padding_mask")
    if kpm is not None and kpm.dtype == torch.uint8:
        if not bool(((kpm == 0) | (kpm == 1)).all()):
            raise CheckError("key_padding_mask (uint8) holds values other than 0/1")
        kpm = kpm.bool()
    print(f"inputs: query {tuple(q.shape)}, "
          + (f"key {tuple(k.shape)}, value {tuple(v.shape)}" if has_k
             else "self-attention (key = value = query)")
          + (f", key_padding_mask {tuple(kpm.shape)} {kpm.dtype}" if kpm is not None else ""))

    # ---- run (slow path: eval mode, grad enabled, params require grad)
    assert torch.is_grad_enabled() and not mha.training
    assert all(p.requires_grad for p in mha.parameters())
    out, w = mha(q, k, v, key_padding_mask=kpm, need_weights=True,
                 average_attn_weights=True)
    out, w = out.detach(), w.detach()

    note(*compare("output", out, io["output"], tol))
    if "weights" in io:
        note(*compare("weights", w, io["weights"], tol))
    else:
        note(False, "FAIL weights: not stored in io.safetensors")
    return ok_all


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="folder with mha.safetensors and io.safetensors")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"verify_roundtrip: {os.path.abspath(args.dir)}")
    try:
        ok = check(args.dir)
    except CheckError as e:
        print(f"FAIL: {e}")
        ok = False
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        print("FAIL: unexpected error (see traceback above)")
        ok = False
    print("RESULT: PASS" if ok else "RESULT: FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
