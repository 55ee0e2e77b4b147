"""PyTorch's side of `benches/products.rs`: matrix products timed one by one with torch.mm.

Each product is `dst[m x n] = lhs[m x k] @ rhs[k x n]` with the layouts PyTorch's own
`nn.Linear` forward and backward use: `lhs_t` means the left operand is stored transposed
(a `k x m` tensor read through `.t()`, as `grad.t() @ x` for a weight gradient), `rhs_t` the
right one (`n x k` through `.t()`, as `x @ weight.t()` in the forward pass). The output is
written into a tensor made once (`out=`), as the Rust side writes into a buffer made once.

With --serve (what the bench uses), requests come one per stdin line as JSON
{"products": [[m, n, k, lhs_t, rhs_t], ...], "reps": R, "warmup": W, "warmup_ms": 250} and
each gets one JSON line back: {"times": [[median_s, min_s], ...]} in the same order. The
warm-up of a product runs at least `warmup` calls and `warmup_ms` milliseconds (the Rust
side's rule).

By hand: python scripts/bench_products_reference.py --product 2048,2048,512,0,1
"""

import argparse
import json

import torch

from bench_serve import median_time, requests, start


def operands(m, n, k, lhs_t, rhs_t):
    lhs = torch.rand(k, m).t() if lhs_t else torch.rand(m, k)
    rhs = torch.rand(n, k).t() if rhs_t else torch.rand(k, n)
    return lhs, rhs, torch.empty(m, n)


def time_product(product, reps, warmup, warmup_ms):
    lhs, rhs, out = operands(*product)
    return list(median_time(lambda: torch.mm(lhs, rhs, out=out), reps, warmup, warmup_ms))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", action="store_true", help="read requests from stdin")
    ap.add_argument("--product", help="m,n,k,lhs_t,rhs_t (by hand)")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--warmup-ms", type=float, default=100.0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    start(args.threads)
    if args.serve:
        for req in requests():
            times = [
                time_product(p, req["reps"], req["warmup"], req.get("warmup_ms", 0.0))
                for p in req["products"]
            ]
            print(json.dumps({"times": times}), flush=True)
        return
    if args.product is None:
        ap.error("--product or --serve is required")
    m, n, k, lt, rt = (int(v) for v in args.product.split(","))
    med, best = time_product((m, n, k, bool(lt), bool(rt)), args.reps, args.warmup, args.warmup_ms)
    flop = 2.0 * m * n * k
    print(f"{m}x{n}x{k}: median {med * 1e3:.2f} ms ({flop / med / 1e9:.0f} GFLOP/s), "
          f"fastest {best * 1e3:.2f} ms ({flop / best / 1e9:.0f} GFLOP/s)")


if __name__ == "__main__":
    main()
