#!/usr/bin/env python3
"""PyTorch side of benches/gpu_attention.rs: times nn.MultiheadAttention (need_weights True
and False), F.scaled_dot_product_attention and a training step for one shape; prints one JSON
object of median seconds. Run by the bench; by hand:

    python3 scripts/bench_gpu_reference.py --n 8 --l 1024 --e 1024 --h 16 --dtype bf16 --device cuda
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F


def median_time(fn, device, warmup=2, iters=10):
    for _ in range(warmup):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]


def main():
    p = argparse.ArgumentParser()
    for k in ("n", "l", "e", "h", "iters"):
        p.add_argument("--" + k, type=int, default=10)
    p.add_argument("--dtype", default="f32")
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
    torch.backends.cuda.matmul.allow_tf32 = False  # same precision as candle's default
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(a.e, a.h, batch_first=True, device=a.device, dtype=dtype)
    x = torch.randn(a.n, a.l, a.e, device=a.device, dtype=dtype)
    res = {}
    with torch.no_grad():
        mha.eval()
        res["fwd_need_weights_false"] = median_time(lambda: mha(x, x, x, need_weights=False), a.device, iters=a.iters)
        res["fwd_need_weights_true"] = median_time(lambda: mha(x, x, x, need_weights=True), a.device, iters=a.iters)
        hd = a.e // a.h
        q = torch.randn(a.n, a.h, a.l, hd, device=a.device, dtype=dtype)
        res["sdpa_fwd"] = median_time(lambda: F.scaled_dot_product_attention(q, q, q), a.device, iters=a.iters)
    mha.train()
    xg = x.clone().requires_grad_(True)

    def step():
        out = mha(xg, xg, xg, need_weights=False)[0]
        out.float().pow(2).mean().backward()

    res["step"] = median_time(step, a.device, iters=a.iters)
    res["torch"] = torch.__version__
    print(json.dumps(res))


if __name__ == "__main__":
    main()
