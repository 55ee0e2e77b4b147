#!/usr/bin/env python3
"""Times PyTorch's nn.MultiheadAttention on the CPU: the side of `benches/attention_cpu/main.rs`.

The Rust bench runs this script with the same shapes, repetitions and thread count and
prints both in one table. By hand:

    VENV/bin/python scripts/bench_attention_reference.py \\
        --shapes '[[32, 128, 256, 8]]' --reps 10 --warmup 3 --threads 2 [--causal] \\
        [--backward sum]

Each shape (N, L, E, H) is a batch_first self-attention, f32, dropout 0, bias on:
- fwd_nw: eval(), torch.no_grad(), need_weights=False (PyTorch's fast path: native MHA with
  its flash-attention CPU kernel);
- fwd_w: the same with need_weights=True (weights averaged over heads);
- step: train(), x.requires_grad, out = mha(x, x, x, need_weights=False)[0], then
  out.backward(r) (backward "grad": the output gradient r, as our side's
  autograd::backward_with) or out.sum().backward() (backward "sum": as a user's
  out.sum_all()?.backward()? on ours), gradients set to None between steps.
A causal shape gives every call attn_mask = the float causal mask (-inf above the diagonal,
nn.Transformer.generate_square_subsequent_mask) and is_causal=True (the hint with which the
training path hands sdpa is_causal instead of the mask); the eval fast path
(_native_multi_head_attention) takes the mask as given.
Output: one JSON line per shape, {"shape": [N, L, E, H], "fwd_nw_s": ..., ...} (medians),
with the fastest call of each measure as "fwd_nw_min_s", "fwd_w_min_s", "step_min_s".

With --serve (what the bench uses), shapes come one per stdin line as JSON
{"shape": [N, L, E, H], "reps": R, "warmup": W, "causal": false, "backward": "grad",
"warmup_ms": 250} (the last three optional; warmup_ms: the warm-up calls go on until this long
has passed, default 0) and each gets its JSON line back, so that the
bench can alternate between our side and PyTorch's for several rounds in one process each.
The module of a shape is built once and reused by later rounds.
"""

import argparse
import json

import torch

from bench_serve import median_time, requests, start


_MODULES = {}


def bench_shape(shape, reps, warmup, causal=False, backward="grad", warmup_ms=0.0):
    n, l, e, h = shape
    if tuple(shape) not in _MODULES:
        mha = torch.nn.MultiheadAttention(e, h, batch_first=True)
        _MODULES[tuple(shape)] = (mha, torch.randn(n, l, e), torch.randn(n, l, e))
    mha, x, r = _MODULES[tuple(shape)]
    # The float mask: PyTorch's eval fast path is faster with it than with the bool one.
    mask = torch.nn.Transformer.generate_square_subsequent_mask(l) if causal else None
    mha.eval()

    def call(inp, need_weights):
        return mha(inp, inp, inp, need_weights=need_weights, attn_mask=mask, is_causal=causal)

    def fwd(need_weights):
        with torch.no_grad():
            return call(x, need_weights)

    fwd_nw = median_time(lambda: fwd(False), reps, warmup, warmup_ms)
    fwd_w = median_time(lambda: fwd(True), reps, warmup, warmup_ms)
    mha.train()
    xg = x.clone().requires_grad_(True)

    def step():
        for p in mha.parameters():
            p.grad = None
        xg.grad = None
        out = call(xg, False)[0]
        if backward == "sum":
            out.sum().backward()
        else:
            out.backward(r)

    step_s = median_time(step, reps, warmup, warmup_ms)
    rec = {
        "shape": [n, l, e, h],
        "causal": causal,
        "backward": backward,
        "fwd_nw_s": fwd_nw[0],
        "fwd_w_s": fwd_w[0],
        "step_s": step_s[0],
        "fwd_nw_min_s": fwd_nw[1],
        "fwd_w_min_s": fwd_w[1],
        "step_min_s": step_s[1],
    }
    print(json.dumps(rec), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", help="JSON list of [N, L, E, H]")
    ap.add_argument("--serve", action="store_true", help="read shapes from stdin")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--warmup-ms", type=float, default=0.0, help="warm up at least this long")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--causal", action="store_true", help="causal attention (--shapes)")
    ap.add_argument("--backward", choices=["grad", "sum"], default="grad", help="(--shapes)")
    args = ap.parse_args()
    start(args.threads)
    if args.serve:
        for req in requests():
            bench_shape(
                req["shape"],
                req["reps"],
                req["warmup"],
                req.get("causal", False),
                req.get("backward", "grad"),
                req.get("warmup_ms", 0.0),
            )
        return
    if args.shapes is None:
        ap.error("--shapes or --serve is required")
    for shape in json.loads(args.shapes):
        bench_shape(shape, args.reps, args.warmup, args.causal, args.backward, args.warmup_ms)


if __name__ == "__main__":
    main()
