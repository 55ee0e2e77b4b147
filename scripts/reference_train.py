#!/usr/bin/env python3
"""Trains the PyTorch twin (`reference_model.NextTokenPredictor`) on a data directory written
by `mha prepare`, the way `mha train --data` does, and times its steps.

    python3 scripts/reference_train.py DATA_DIR --steps 30 --batch-size 16 --max-len 256 \\
        --embed-dim 256 --num-heads 8 --num-layers 4 [--ff-dim F] [--lr 2e-3] [--threads T]
    python3 scripts/reference_model.py train DATA_DIR ...        (the same)

(`python3`: a Python with torch and numpy; `scripts/bench_text_train.sh` takes it from
`MHA_BENCH_PYTHON`.)

Data: `DATA_DIR/tokens.bin` memory-mapped (np.memmap) with the dtype of `DATA_DIR/meta.json`
(`u16` or `u32`, little-endian); ids [0, train_tokens) are the training part. Each step
draws `batch_size` window offsets uniformly from every offset whose L+1 tokens lie inside
the training part (a seeded numpy Generator; mha draws from its own seeded generator, so
the windows differ, the shape does not): inputs are the first L tokens of a window, targets
the last L. The model's vocabulary is meta.json's `vocab_size`, its max_len is L.

A step, as `Trainer::train_step_accumulated` with one micro-batch and no padding:
model.train(), zero_grad(set_to_none=True), forward (causal mask, key_padding_mask=None;
with `--causal-hint` nn.MultiheadAttention also gets `is_causal=True`, see below),
`masked_loss` over every position, loss.item(), backward, clip_grad_norm_(clip), AdamW
step, in f32 on the CPU. The learning rate follows mha's schedule (linear warmup over
`--warmup` steps, then cosine to lr/10 at `--steps`), set before the step. Optimizer:
torch.optim.AdamW(lr, betas=(0.9, 0.98), eps=1e-8, weight_decay) on every parameter, as
mha's AdamW. Dropout is 0 (attention and residual) unless --dropout / --resid-dropout give it.

Timing: the step above only (perf_counter around it); drawing the offsets, slicing the
memmap and making the tensors come before the timer starts, as mha times
`train_step_accumulated` after `batches_for_step`. tokens/s of a step = N·L / its time,
mha's `tokens_per_s` in metrics.jsonl. Output: one line per step, then

    torch tokens/s median 12345.6 over 20 steps (after 3 warmup), N×L = 16×256, 2 threads

where the median is over the steps after `--timing-warmup`. `--json FILE` also writes the
per-step numbers and the summary as JSON.

`--causal-hint`: nn.MultiheadAttention gets the causal bool mask and `is_causal=True`; with
no key_padding_mask and need_weights=False PyTorch then calls scaled_dot_product_attention
with `is_causal=True` and no mask (the Rust model's attention runs causal without a mask
too). Without it PyTorch gets the mask, as `scripts/bench_reference.py` does.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from reference_model import NextTokenPredictor, masked_loss  # noqa: E402

DTYPES = {"u16": "<u2", "u32": "<u4"}


def load_data(data_dir):
    """(tokens memmap, meta dict) of a data directory written by `mha prepare`."""
    with open(os.path.join(data_dir, "meta.json")) as f:
        meta = json.load(f)
    if meta.get("format") != "candle-mha-tokens":
        raise ValueError(f"{data_dir}/meta.json: format {meta.get('format')!r}, "
                         "expected 'candle-mha-tokens'")
    dtype = meta.get("dtype")
    if dtype not in DTYPES:
        raise ValueError(f"{data_dir}/meta.json: dtype {dtype!r}, expected u16 or u32")
    tokens = np.memmap(os.path.join(data_dir, "tokens.bin"), dtype=DTYPES[dtype], mode="r")
    if len(tokens) != int(meta["num_tokens"]):
        raise ValueError(f"{data_dir}/tokens.bin holds {len(tokens)} ids, meta.json says "
                         f"{meta['num_tokens']}")
    return tokens, meta


def lr_at(step, base_lr, warmup, total):
    """mha's `LrSchedule::lr`: linear warmup, then cosine to base_lr / 10 (step 0-based)."""
    min_lr = base_lr / 10.0
    if step < warmup:
        return base_lr * (step + 1) / warmup
    decay = max(total - warmup, 1)
    progress = min((step - warmup) / decay, 1.0)
    return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def parse_args(argv, prog=None):
    ap = argparse.ArgumentParser(
        prog=prog,
        description="Train and time the PyTorch twin of mha's NextTokenPredictor on a "
                    "data directory written by `mha prepare`.")
    ap.add_argument("data_dir")
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps (default 30)")
    ap.add_argument("--batch-size", type=int, default=32, help="N (default 32, mha's text default)")
    ap.add_argument("--max-len", type=int, default=128, help="L (default 128)")
    ap.add_argument("--embed-dim", type=int, default=128)
    ap.add_argument("--num-heads", type=int, default=4)
    ap.add_argument("--num-layers", type=int, default=3)
    ap.add_argument("--ff-dim", type=int, default=0, help="MLP width (default 4 × embed-dim)")
    ap.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default 2e-3)")
    ap.add_argument("--warmup", type=int, default=100, help="lr warmup steps (default 100)")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0, help="gradient-norm clip (0 = off)")
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="attention dropout (default 0; mha train's text default is 0.1)")
    ap.add_argument("--resid-dropout", type=float, default=0.0,
                    help="dropout on the embeddings and each block's outputs (default 0; "
                         "mha train's text default is 0.2)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch.set_num_threads (default: RAYON_NUM_THREADS if set, else "
                         "the number of cores, as mha)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timing-warmup", type=int, default=3,
                    help="first steps left out of the median (default 3)")
    ap.add_argument("--causal-hint", action="store_true",
                    help="also pass is_causal=True to nn.MultiheadAttention")
    ap.add_argument("--json", metavar="FILE", help="write per-step times and the summary")
    ap.add_argument("--quiet", action="store_true", help="no per-step lines")
    args = ap.parse_args(argv)
    if args.steps <= args.timing_warmup:
        ap.error(f"--steps ({args.steps}) must exceed --timing-warmup ({args.timing_warmup})")
    for name in ("batch_size", "max_len", "embed_dim", "num_heads", "num_layers"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def default_threads():
    raw = os.environ.get("RAYON_NUM_THREADS", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def main(argv=None, prog=None):
    args = parse_args(sys.argv[1:] if argv is None else argv, prog)
    threads = args.threads if args.threads > 0 else default_threads()
    torch.set_num_threads(threads)
    tokens, meta = load_data(args.data_dir)
    n, l = args.batch_size, args.max_len
    train_tokens = int(meta["train_tokens"])
    offsets_count = train_tokens - (l + 1) + 1
    if offsets_count < 1:
        raise SystemExit(f"the training part has {train_tokens} tokens, fewer than a window "
                         f"of {l + 1}")
    vocab = int(meta["vocab_size"])
    ff = args.ff_dim if args.ff_dim > 0 else 4 * args.embed_dim

    torch.manual_seed(args.seed)
    model = NextTokenPredictor(vocab_size=vocab, max_len=l, embed_dim=args.embed_dim,
                               num_heads=args.num_heads, num_layers=args.num_layers,
                               ff_dim=ff, dropout=args.dropout,
                               resid_dropout=args.resid_dropout)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-8,
                            weight_decay=args.weight_decay)
    rng = np.random.default_rng(args.seed)
    loss_mask = torch.ones(n, l, dtype=torch.bool)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; data "
          f"{args.data_dir}: {train_tokens} training tokens of {meta['num_tokens']} "
          f"({meta['dtype']}), vocab {vocab}; model {args.num_layers} blocks, embed_dim "
          f"{args.embed_dim}, {args.num_heads} heads, ff {ff}, context {l}, {params} "
          f"parameters; {args.steps} steps of {n} windows"
          f"{', is_causal hint' if args.causal_hint else ''}; dropout {args.dropout}, "
          f"residual dropout {args.resid_dropout}", flush=True)

    steps = []
    for step in range(args.steps):
        # The batch, outside the timed region (mha: batches_for_step).
        offs = rng.integers(0, offsets_count, size=n)
        windows = np.stack([np.asarray(tokens[o:o + l + 1]) for o in offs]).astype(np.int64)
        batch = torch.from_numpy(windows)
        inp, tgt = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
        lr = lr_at(step, args.lr, args.warmup, args.steps)
        for group in opt.param_groups:
            group["lr"] = lr

        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(inp, key_padding_mask=None, is_causal=args.causal_hint)
        loss = masked_loss(logits, tgt, loss_mask)
        loss_value = loss.item()
        loss.backward()
        clip = args.clip if args.clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item()
        opt.step()
        seconds = time.perf_counter() - t0

        if not math.isfinite(loss_value):
            raise SystemExit(f"training loss is {loss_value} at step {step + 1}")
        rate = n * l / max(seconds, 1e-9)
        steps.append({"step": step + 1, "train_loss": loss_value, "lr": lr,
                      "grad_norm": grad_norm, "seconds": seconds, "tokens_per_s": rate,
                      "tokens": n * l})
        if not args.quiet:
            print(f"step {step + 1:>4}  loss {loss_value:.4f}  lr {lr:.3e}  "
                  f"grad_norm {grad_norm:.3f}  {seconds * 1e3:8.1f} ms  {rate:9.1f} tok/s",
                  flush=True)

    timed = steps[args.timing_warmup:]
    median = statistics.median(s["tokens_per_s"] for s in timed)
    summary = {"tokens_per_s_median": median, "timed_steps": len(timed),
               "warmup_steps": args.timing_warmup, "batch_size": n, "max_len": l,
               "threads": torch.get_num_threads(), "torch": torch.__version__,
               "causal_hint": args.causal_hint, "parameters": params,
               "final_loss": steps[-1]["train_loss"]}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "steps": steps}, f)
    print(f"torch tokens/s median {median:.1f} over {len(timed)} steps (after "
          f"{args.timing_warmup} warmup), N×L = {n}×{l}, {torch.get_num_threads()} threads",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
