#!/usr/bin/env python3
"""PyTorch side of benches/gpu_attention.rs: times nn.MultiheadAttention (need_weights True
and False), F.scaled_dot_product_attention (forward and forward + backward, and the forward
on each SDPA backend that takes the shape) and a training step for one shape; prints one JSON
object of median seconds. With --peak: the peak memory of one MHA forward instead. Run by the
bench; by hand:

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
    p.add_argument("--peak", action="store_true")
    a = p.parse_args()
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
    torch.backends.cuda.matmul.allow_tf32 = False  # same precision as candle's default
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(a.e, a.h, batch_first=True, device=a.device, dtype=dtype)
    x = torch.randn(a.n, a.l, a.e, device=a.device, dtype=dtype)
    res = {}
    if a.peak:
        with torch.no_grad():
            mha.eval()
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.max_memory_allocated()
            mha(x, x, x, need_weights=False)
            torch.cuda.synchronize()
            res["peak_bytes"] = torch.cuda.max_memory_allocated() - base
        res["torch"] = torch.__version__
        print(json.dumps(res))
        return
    with torch.no_grad():
        mha.eval()
        res["fwd_need_weights_false"] = median_time(lambda: mha(x, x, x, need_weights=False), a.device, iters=a.iters)
        res["fwd_need_weights_true"] = median_time(lambda: mha(x, x, x, need_weights=True), a.device, iters=a.iters)
        # The module's two projections alone (what the bench times of ours as "proj").
        res["proj"] = median_time(lambda: (F.linear(x, mha.in_proj_weight, mha.in_proj_bias),
                                           mha.out_proj(x)), a.device, iters=a.iters)
        hd = a.e // a.h
        q = torch.randn(a.n, a.h, a.l, hd, device=a.device, dtype=dtype)
        res["sdpa_fwd"] = median_time(lambda: F.scaled_dot_product_attention(q, q, q), a.device, iters=a.iters)
        if a.device == "cuda":
            from torch.nn.attention import SDPBackend, sdpa_kernel
            for name in ("flash", "efficient", "cudnn", "math"):
                backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                           "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[name]
                if name == "math" and a.l > 4096:
                    continue  # N·H·L² scores
                try:
                    with sdpa_kernel([backend]):
                        res["sdpa_fwd_" + name] = median_time(
                            lambda: F.scaled_dot_product_attention(q, q, q), a.device, iters=a.iters)
                except RuntimeError:
                    pass  # the backend does not take this dtype or shape
    qg = q.clone().requires_grad_(True)

    def sdpa_step():
        F.scaled_dot_product_attention(qg, qg, qg).float().pow(2).mean().backward()

    res["sdpa_step"] = median_time(sdpa_step, a.device, iters=a.iters)
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
