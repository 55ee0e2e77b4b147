#!/usr/bin/env python3
"""Times greedy generation of the PyTorch twin (`reference_model.NextTokenPredictor`) with a
key/value cache, for `benches/generate.rs` (`cargo bench --bench generate`).

`nn.MultiheadAttention` has no cache, so the loop here keeps one, as every PyTorch
generation library does (fairseq's `incremental_state`, Hugging Face's `past_key_values`):
per block, preallocated key and value tensors (N, H, max_len, E/H); each step projects only
the new positions with the module's own `in_proj_weight`/`in_proj_bias`, writes their keys
and values into the cache, and attends with `F.scaled_dot_product_attention` over the cached
prefix (`is_causal=True` for the prompt, no mask for one new token), then `out_proj`. The
prompt runs once (prefill), then one token per step; the next token is the argmax of the last
position's logits (`.item()` per step, as a streaming loop reads it). Same arithmetic as
`NextTokenPredictor.forward` position by position.

With --serve (what the bench uses), after a {"ready": version} line, each stdin line is a
JSON request {"weights": PATH, "config": {...config.json keys...}, "prompt": [ids],
"new_tokens": n, "repeats": r, "warmup": w}; the model is built from the config and loaded
from the safetensors file (the Rust model's weights: same names), and the reply is one JSON
line {"median_s": ..., "tokens_per_s": ..., "tokens": [the generated ids]}.
By hand:

    VENV/bin/python scripts/bench_generate_reference.py --serve --threads 2

torch.set_num_threads(--threads); grad is off (torch.inference_mode()).
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from reference_model import from_config  # noqa: E402


class KvCache:
    """Per-block keys and values (N, H, capacity, hd), filled up to `length`."""

    def __init__(self, model, batch, capacity):
        block = model.blocks[0].attn
        self.heads = block.num_heads
        hd = block.embed_dim // block.num_heads
        shape = (batch, self.heads, capacity, hd)
        self.k = [torch.empty(shape) for _ in model.blocks]
        self.v = [torch.empty(shape) for _ in model.blocks]
        self.length = 0


def attend(attn, h, cache, layer, start):
    """The block's self-attention of the new positions `h` (N, T, E) over the cache."""
    n, t, e = h.shape
    heads = cache.heads
    q, k, v = F.linear(h, attn.in_proj_weight, attn.in_proj_bias).split(e, dim=-1)
    split = lambda x: x.view(n, t, heads, e // heads).transpose(1, 2)  # noqa: E731
    q, k, v = split(q), split(k), split(v)
    cache.k[layer][:, :, start:start + t] = k
    cache.v[layer][:, :, start:start + t] = v
    keys = cache.k[layer][:, :, :start + t]
    values = cache.v[layer][:, :, :start + t]
    if start == 0:
        o = F.scaled_dot_product_attention(q, keys, values, is_causal=True)
    elif t == 1:
        o = F.scaled_dot_product_attention(q, keys, values)
    else:  # a block after a prefix: causal within the block, everything before it
        mask = torch.ones(t, start + t, dtype=torch.bool).tril(diagonal=start)
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
    o = o.transpose(1, 2).reshape(n, t, e)
    return attn.out_proj(o)


def forward_incremental(model, tokens, cache):
    """Logits (N, T, V) of the new tokens (N, T), extending the cache."""
    start = cache.length
    t = tokens.shape[1]
    pos = torch.arange(start, start + t)
    x = model.token_embedding(tokens) + model.position_embedding(pos)
    for i, b in enumerate(model.blocks):
        x = x + attend(b.attn, b.ln1(x), cache, i, start)
        x = x + b.mlp(b.ln2(x))
    cache.length = start + t
    return model.head(model.ln_f(x))


def generate(model, prompt, new_tokens):
    """Greedy continuation of `prompt` (a list of ids) through the cache."""
    cache = KvCache(model, 1, len(prompt) + new_tokens)
    tokens = torch.tensor([prompt], dtype=torch.long)
    out = []
    for _ in range(new_tokens):
        logits = forward_incremental(model, tokens, cache)
        nxt = int(logits[0, -1].argmax().item())
        out.append(nxt)
        tokens = torch.tensor([[nxt]], dtype=torch.long)
    return out


def serve_one(req, models):
    from safetensors.torch import load_file

    key = req["weights"]
    if key not in models:
        model = from_config(req["config"])
        model.load_state_dict(load_file(req["weights"]), strict=True)
        model.eval()
        models[key] = model
    model = models[key]
    prompt, n = list(req["prompt"]), int(req["new_tokens"])
    times, tokens = [], None
    with torch.inference_mode():
        for i in range(int(req.get("warmup", 1)) + int(req.get("repeats", 1))):
            t0 = time.perf_counter()
            tokens = generate(model, prompt, n)
            dt = time.perf_counter() - t0
            if i >= int(req.get("warmup", 1)):
                times.append(dt)
    median = statistics.median(times)
    return {"median_s": median, "tokens_per_s": n / median, "tokens": tokens}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serve", action="store_true", help="answer JSON requests on stdin")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: keep)")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if not args.serve:
        ap.error("only --serve is supported (the bench sends the model and prompt)")
    print(json.dumps({"ready": torch.__version__}), flush=True)
    models = {}
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(serve_one(json.loads(line), models)), flush=True)


if __name__ == "__main__":
    main()
