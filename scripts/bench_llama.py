#!/usr/bin/env python3
"""transformers' side of `scripts/bench_llama.sh` (`load`: `from_pretrained` alone): a SmolLM2-135M-shaped LlamaForCausalLM
(random weights, seeded) saved to DIR (`make DIR`), and one phase per process, as the Rust
example measures it: `generate` (64 greedy tokens, cache, 16-token prompt), `eval` (4×1024,
no grad), `train` (steps of 4×256: loss, backward, AdamW); `generate-bf16` and `train-bf16`
inside `torch.autocast("cpu", torch.bfloat16)`. Prints `phase tokens/s peak_rss_mib`.
"""

import contextlib
import resource
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def config():
    return LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                       num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                       max_position_embeddings=2048, rms_norm_eps=1e-5,
                       rope_parameters=dict(rope_type="default", rope_theta=100000.0),
                       tie_word_embeddings=True, bos_token_id=0, eos_token_id=0)


def tokens(n, vocab):
    return torch.tensor([(i * 2654435761 + 12345) % vocab for i in range(n)])


def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main():
    what, d = sys.argv[1], sys.argv[2]
    bf16 = what.endswith("-bf16")
    what = what.removesuffix("-bf16")
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    if what == "make":
        torch.manual_seed(0)
        LlamaForCausalLM(config()).save_pretrained(d)
        return
    torch.manual_seed(0)
    t = time.perf_counter()
    model = LlamaForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="sdpa")
    if what == "load":
        print(f"load {time.perf_counter() - t:.2f} s {peak() * 1024:.0f} KiB")
        return
    v = model.config.vocab_size
    if what == "generate":
        model.eval()
        prompt = tokens(16, v).unsqueeze(0)
        kw = dict(do_sample=False, use_cache=True, eos_token_id=None, pad_token_id=0)
        with torch.no_grad(), ctx:
            model.generate(prompt, max_new_tokens=4, min_new_tokens=4, **kw)
            t = time.perf_counter()
            out = model.generate(prompt, max_new_tokens=64, min_new_tokens=64, **kw)
            s = time.perf_counter() - t
        new = out[0, 16:].tolist()
        print(f"generate {len(new) / s:.2f} {peak():.0f} first={new[:4]}")
    elif what == "eval":
        model.eval()
        ids = tokens(4 * 1024, v).view(4, 1024)
        with torch.no_grad():
            t = time.perf_counter()
            loss = model(ids, labels=ids).loss.item()
            s = time.perf_counter() - t
        print(f"eval {4096 / s:.2f} {peak():.0f} loss={loss:.4f}")
    elif what == "train":
        steps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
        model.train()
        ids = tokens(4 * 256, v).view(4, 256)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            with ctx:
                loss = model(ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t)
        rest = sorted(times[1:] or times)
        print(f"train {1024 / rest[len(rest) // 2]:.2f} {peak():.0f} loss={loss.item():.4f}")


if __name__ == "__main__":
    main()
