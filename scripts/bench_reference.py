#!/usr/bin/env python3
"""Times one training step of the PyTorch twin (`reference_model.NextTokenPredictor`).

The Rust side is `crates/candle-mha-train/benches/train_step.rs` (`cargo bench --bench train_step`), which runs this
script with the same shapes, steps and thread count and prints both in one table. By hand:

    VENV/bin/python scripts/bench_reference.py \\
        --shapes '[{"name": "small", "n": 64, "l": 11, "v": 37, "e": 64, "h": 4, "layers": 2}]' \\
        --steps 10 --warmup 3 --threads 2

--shapes is a JSON list of objects with keys name, n (batch), l (sequence length), v (vocab),
e (embed_dim), h (heads), layers, and optionally ff (default 4 e), max_len (default
max(l, 64)), steps and warmup (override the command-line values for that shape), and
warmup_ms (untimed steps go on until this long has passed; default 0).

One step is what `Trainer::train_step` does: model.train(), forward on random tokens
(N, L) with no padding (key_padding_mask=None), `masked_loss` over every position,
loss.item(), backward, clip_grad_norm_(1.0), AdamW (PyTorch's defaults) step, f32 on CPU;
zero_grad(set_to_none=True) is counted too. Output: one JSON line per shape on stdout,
{"name": ..., "median_s": ..., "tokens_per_s": ..., "phases_s": [...], ...}, with tokens =
N * L and phases_s the median seconds of zero_grad + forward + loss.item(), backward,
clipping and the AdamW step (the Rust side's four phases).

--profile K (not with --serve) runs K more steps per shape under torch.profiler and prints
its operators by self CPU time to stderr: PyTorch's side of a profile of our step.

With --serve (what the bench uses), shapes come one per stdin line as such objects (with
steps and warmup) after a {"ready": version} line, and each gets its JSON line back, so that
the bench can alternate between our side and PyTorch's for several rounds.
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from reference_model import NextTokenPredictor, masked_loss  # noqa: E402


def bench_shape(shape, steps, warmup, seed=0, warmup_ms=0.0, profile_steps=0):
    n, l, v = int(shape["n"]), int(shape["l"]), int(shape["v"])
    e, h, layers = int(shape["e"]), int(shape["h"]), int(shape["layers"])
    ff = int(shape.get("ff", 4 * e))
    max_len = int(shape.get("max_len", max(l, 64)))
    torch.manual_seed(seed)
    model = NextTokenPredictor(vocab_size=v, max_len=max_len, embed_dim=e, num_heads=h,
                               num_layers=layers, ff_dim=ff, dropout=0.0)
    model.train()
    opt = torch.optim.AdamW(model.parameters())  # lr 1e-3, (0.9, 0.999), 1e-8, wd 0.01
    gen = torch.Generator().manual_seed(seed + 1)
    loss_mask = torch.ones(n, l, dtype=torch.bool)
    times, phases = [], [[], [], [], []]
    # Warm-up: at least `warmup` steps and `warmup_ms` milliseconds (the Rust side's rule).
    start, i = time.perf_counter(), -1
    while len(times) < steps:
        i += 1
        timed = i >= warmup and (time.perf_counter() - start) * 1e3 >= warmup_ms
        # A fresh batch per step, drawn outside the timed region.
        tokens = torch.randint(0, v, (n, l + 1), generator=gen, dtype=torch.long)
        inp, tgt = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(inp, key_padding_mask=None)
        loss = masked_loss(logits, tgt, loss_mask)
        loss_value = loss.item()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        t3 = time.perf_counter()
        opt.step()
        t4 = time.perf_counter()
        if not (loss_value == loss_value):  # NaN
            raise RuntimeError(f"{shape['name']}: loss is NaN at step {i}")
        if timed:
            times.append(t4 - t0)
            for k, (a, b) in enumerate([(t0, t1), (t1, t2), (t2, t3), (t3, t4)]):
                phases[k].append(b - a)
    if profile_steps > 0:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(profile_steps):
                tokens = torch.randint(0, v, (n, l + 1), generator=gen, dtype=torch.long)
                inp, tgt = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
                opt.zero_grad(set_to_none=True)
                loss = masked_loss(model(inp, key_padding_mask=None), tgt, loss_mask)
                loss.item()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
        print(f"{shape['name']}: torch.profiler over {profile_steps} steps", file=sys.stderr)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25),
              file=sys.stderr, flush=True)
    median = statistics.median(times)
    return {
        "name": shape["name"],
        "median_s": median,
        "tokens_per_s": n * l / median,
        "min_s": min(times),
        "phases_s": [statistics.median(p) for p in phases],
        "steps": steps,
        "warmup": warmup,
        "final_loss": loss_value,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description="Time a PyTorch training step of the "
                                             "NextTokenPredictor twin (JSON lines out).")
    ap.add_argument("--shapes", help="JSON list of shape objects")
    ap.add_argument("--serve", action="store_true", help="read shape objects from stdin")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per shape")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch.set_num_threads (0 = leave torch's default)")
    ap.add_argument("--profile", type=int, default=0, metavar="K",
                    help="then K steps per shape under torch.profiler (table on stderr)")
    args = ap.parse_args(argv)
    if args.profile and args.serve:
        ap.error("--profile prints to stderr; use it with --shapes, not --serve")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads",
          file=sys.stderr, flush=True)
    if args.serve:
        print(json.dumps({"ready": torch.__version__}), flush=True)
        shapes = (json.loads(line) for line in sys.stdin if line.strip())
    elif args.shapes is None:
        ap.error("--shapes or --serve is required")
    else:
        shapes = json.loads(args.shapes)
    for shape in shapes:
        steps = int(shape.get("steps", args.steps))
        warmup = int(shape.get("warmup", args.warmup))
        if steps < 1:
            raise ValueError(f"{shape['name']}: steps must be at least 1")
        warmup_ms = float(shape.get("warmup_ms", 0.0))
        rec = bench_shape(shape, steps, warmup, warmup_ms=warmup_ms, profile_steps=args.profile)
        print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
