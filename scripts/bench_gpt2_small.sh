#!/usr/bin/env bash
# GPT-2 small (12 layers, 12 heads, E 768, context 1024, 50,257 ids; random weights) through
# `mha import`, then greedy generation of 64 tokens with the key/value cache, an evaluation and
# training steps of 4 x 256 tokens, each against transformers' GPT2LMHeadModel on the same
# machine, threads and inputs, in the same run: wall time, tokens/s and peak RSS (GNU time).
#
#   MHA_BENCH_PYTHON=.venv-torch/bin/python scripts/bench_gpt2_small.sh [WORKDIR]
#
# The Python needs torch, safetensors and transformers. WORKDIR (default target/bench-gpt2)
# receives the 500 MB model, the run and the logs.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${MHA_BENCH_PYTHON:?set MHA_BENCH_PYTHON to a Python with torch and transformers}
work=${1:-target/bench-gpt2}
mha=${MHA:-target/release/mha}
threads=${MHA_BENCH_THREADS:-2}
steps=${MHA_BENCH_STEPS:-4}
[ -x "$mha" ] || cargo build --release -p candle-mha-cli
export RAYON_NUM_THREADS=$threads OMP_NUM_THREADS=$threads
mkdir -p "$work"
rm -rf "$work/run" "$work"/train-*

"$py" - "$work" <<'PY'
import os, random, sys, torch
from transformers import GPT2Config, GPT2LMHeadModel
work = sys.argv[1]
if not os.path.exists(os.path.join(work, "hf", "model.safetensors")):
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config()).save_pretrained(os.path.join(work, "hf"), safe_serialization=True)
random.seed(0)
ids = [str(random.randrange(50257)) for _ in range(64 * 1024)]
open(os.path.join(work, "ids.txt"), "w").write(" ".join(ids) + "\n")
open(os.path.join(work, "prompt.txt"), "w").write(" ".join(ids[:16]))
open(os.path.join(work, "eval.txt"), "w").write(" ".join(ids[:4 * 1025]) + "\n")
PY

measure() {  # name, command...: prints "name: wall s, peak MiB"
  local name=$1; shift
  /usr/bin/time -f "%e %M" -o "$work/time.txt" "$@" > "$work/$name.out" 2> "$work/$name.err"
  read -r wall kib < "$work/time.txt"
  printf '%-34s %8.2f s %8.0f MiB\n' "$name" "$wall" "$((kib / 1024))"
}

measure "import (mha)" "$mha" import "$work/hf" --out "$work/run"
prompt=$(cat "$work/prompt.txt")
# Generation in f32, then with the products in bf16 (`--autocast bf16`: each weight rounded
# once, so decoding streams half the bytes) against transformers under `torch.autocast`.
for precision in f32 bf16; do
  flag=(); [ "$precision" = bf16 ] && flag=(--autocast bf16)
  measure "generate 64 $precision (mha, kv cache)" "$mha" generate --checkpoint "$work/run" \
    --prompt "$prompt" --max-new-tokens 64 "${flag[@]}"
  measure "generate 64 $precision (transformers)" "$py" - "$work" "$threads" "$precision" <<'PY'
import contextlib, sys, time, torch
from transformers import GPT2LMHeadModel
work, threads, precision = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.set_num_threads(threads)
m = GPT2LMHeadModel.from_pretrained(f"{work}/hf").eval()
ids = torch.tensor([[int(t) for t in open(f"{work}/prompt.txt").read().split()]])
ctx = (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16"
       else contextlib.nullcontext())
def run(n):
    t0 = time.perf_counter()
    with ctx:
        out = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                         do_sample=False, use_cache=True, pad_token_id=0)
    return out, time.perf_counter() - t0
with torch.no_grad():
    out, t64 = run(64)
    _, t1 = run(1)
print(" ".join(map(str, out[0].tolist())))
# As `mha generate` reports it: the prompt and first token, then the rate of the other 63.
print(f"transformers: prompt and first token {t1 * 1e3:.0f} ms, then {63 / (t64 - t1):.1f} tokens/s",
      file=sys.stderr)
PY
  grep -h "tokens/s" "$work/generate 64 $precision (mha, kv cache).err" \
    "$work/generate 64 $precision (transformers).err"
  if [ "$(cat "$work/generate 64 $precision (mha, kv cache).out")" = \
       "$(cat "$work/generate 64 $precision (transformers).out")" ]; then
    echo "generated tokens ($precision): identical"
  else
    echo "generated tokens ($precision): DIFFER"
  fi
done

# Training steps in f32, then with the products in bf16 (`--autocast bf16` against
# `torch.autocast("cpu", torch.bfloat16)`); each side's losses of the same batches too.
for precision in f32 bf16; do
  flag=(); [ "$precision" = bf16 ] && flag=(--autocast bf16)
  measure "train $steps x (4 x 256) $precision (mha)" "$mha" train --init-from "$work/run" \
    --text "$work/ids.txt" --out "$work/train-$precision" --max-len 256 --batch-size 4 \
    --steps "$steps" --eval-every 0 --save-every 0 --quiet "${flag[@]}"
  "$py" - "$work/train-$precision/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "tokens_per_s" in r]
rates = [r["tokens_per_s"] for r in rows]
print(f"  mha tokens/s (median of steps 2..): {statistics.median(rates[1:] or rates):.0f}")
print("  mha losses: " + " ".join(f"{r['train_loss']:.4f}" for r in rows))
PY
  measure "train $steps x (4 x 256) $precision (transformers)" "$py" - "$work" "$threads" "$steps" "$precision" <<'PY'
import contextlib, statistics, sys, time, torch
from transformers import GPT2LMHeadModel
work, threads, steps, precision = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(threads)
m = GPT2LMHeadModel.from_pretrained(f"{work}/hf").train()
params = [p for p in m.parameters() if p.requires_grad]
opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                        lr=2e-3, betas=(0.9, 0.98))
ids = [int(t) for t in open(f"{work}/ids.txt").read().split()]
g = torch.Generator().manual_seed(0)
ctx = (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16"
       else contextlib.nullcontext())
rates, losses = [], []
for step in range(steps):
    starts = torch.randint(0, len(ids) - 258, (4,), generator=g).tolist()
    batch = torch.tensor([ids[s:s + 257] for s in starts])
    t0 = time.perf_counter()
    with ctx:
        logits = m(batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)).float(),
                                                 batch[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    rates.append(4 * 256 / (time.perf_counter() - t0))
    losses.append(loss.item())
print(f"  transformers tokens/s (median of steps 2..): {statistics.median(rates[1:] or rates):.0f}",
      file=sys.stderr)
print("  transformers losses: " + " ".join(f"{l:.4f}" for l in losses), file=sys.stderr)
PY
  grep -h "tokens/s\|losses" "$work/train $steps x (4 x 256) $precision (mha).out" \
    "$work/train $steps x (4 x 256) $precision (transformers).err" || true
done
measure "eval 4 x 1024 (mha)" "$mha" eval --checkpoint "$work/run" --text "$work/eval.txt" --batch-size 4
grep -h "loss" "$work/eval 4 x 1024 (mha).out" | head -n 1
measure "eval 4 x 1024 (transformers)" "$py" - "$work" "$threads" <<'PY'
import sys, torch
from transformers import GPT2LMHeadModel
work, threads = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(threads)
m = GPT2LMHeadModel.from_pretrained(f"{work}/hf").eval()
ids = torch.tensor([int(t) for t in open(f"{work}/eval.txt").read().split()]).view(4, 1025)
with torch.no_grad():
    logits = m(ids[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))
print(f"loss {loss.item():.4f}")
PY
cat "$work/eval 4 x 1024 (transformers).out"
