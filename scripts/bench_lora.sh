#!/usr/bin/env bash
# LoRA fine-tuning of GPT-2 small (12 layers, E 768, 50,257 ids), or with
# MHA_BENCH_MODEL=smollm2 of SmolLM2-135M's shape (scripts/bench_llama.py's), random weights
# through `mha import`: training steps of 4 x 256 tokens with rank-8 adapters on PEFT's default
# targets (GPT-2 `c_attn`, Llama `q_proj,v_proj`) against our full fine-tuning and against
# PEFT + transformers with the same adapter, optimizer, threads and inputs, in the same run:
# tokens/s (median of steps 2..) and peak RSS (GNU time).
#
#   MHA_BENCH_PYTHON=VENV/bin/python [MHA_BENCH_MODEL=gpt2|smollm2] scripts/bench_lora.sh [WORKDIR]
#
# The Python needs torch, safetensors, transformers and peft. WORKDIR (default
# target/bench-lora) receives the 500 MB model, the runs and the logs.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${MHA_BENCH_PYTHON:?set MHA_BENCH_PYTHON to a Python with torch, transformers and peft}
model=${MHA_BENCH_MODEL:-gpt2}
work=${1:-target/bench-lora-$model}
mha=${MHA:-target/release/mha}
threads=${MHA_BENCH_THREADS:-2}
steps=${MHA_BENCH_STEPS:-6}
rank=${MHA_BENCH_RANK:-8}
[ -x "$mha" ] || cargo build --release -p candle-mha-cli
export RAYON_NUM_THREADS=$threads OMP_NUM_THREADS=$threads
mkdir -p "$work"
rm -rf "$work"/train-*

case $model in
  gpt2) targets=c_attn; vocab=50257 ;;
  smollm2) targets=q_proj,v_proj; vocab=49152
    [ -f "$work/hf/model.safetensors" ] || "$py" scripts/bench_llama.py make "$work/hf" 2>/dev/null ;;
  *) echo "MHA_BENCH_MODEL: gpt2 or smollm2, not $model" >&2; exit 2 ;;
esac
"$py" - "$work" "$vocab" <<'PY'
import os, random, sys, torch
from transformers import GPT2Config, GPT2LMHeadModel
work, vocab = sys.argv[1], int(sys.argv[2])
if not os.path.exists(os.path.join(work, "hf", "model.safetensors")):
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config()).save_pretrained(os.path.join(work, "hf"), safe_serialization=True)
random.seed(0)
open(os.path.join(work, "ids.txt"), "w").write(
    " ".join(str(random.randrange(vocab)) for _ in range(64 * 1024)) + "\n")
PY
[ -f "$work/run/checkpoint.json" ] || "$mha" import "$work/hf" --out "$work/run" > /dev/null

measure() {  # name, command...: prints "name: wall s, peak MiB"
  local name=$1; shift
  /usr/bin/time -f "%e %M" -o "$work/time.txt" "$@" > "$work/$name.out" 2> "$work/$name.err"
  read -r wall kib < "$work/time.txt"
  printf '%-36s %8.2f s %8.0f MiB\n' "$name" "$wall" "$((kib / 1024))"
}
rates() {  # metrics.jsonl: the median tokens/s of steps 2..
  "$py" -c 'import json,statistics,sys; r=[x["tokens_per_s"] for x in map(json.loads, open(sys.argv[1])) if "tokens_per_s" in x]; print(f"  tokens/s (median of steps 2..): {statistics.median(r[1:] or r):.0f}")' "$1"
}

common=(--text "$work/ids.txt" --max-len 256 --batch-size 4 --steps "$steps" --eval-every 0
        --save-every 0 --quiet --init-from "$work/run")
measure "train full (mha)" "$mha" train "${common[@]}" --out "$work/train-full"
rates "$work/train-full/metrics.jsonl"
measure "train LoRA r=$rank $targets (mha)" "$mha" train "${common[@]}" --out "$work/train-lora" \
  --lora-rank "$rank"
rates "$work/train-lora/metrics.jsonl"
measure "train LoRA r=$rank $targets (peft)" "$py" - "$work" "$threads" "$steps" "$rank" "$targets" <<'PY'
import statistics, sys, time, torch
from transformers import AutoModelForCausalLM
from peft import LoraConfig, get_peft_model
work, threads, steps, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
targets = sys.argv[5].split(",")
torch.set_num_threads(threads)
m = AutoModelForCausalLM.from_pretrained(f"{work}/hf", dtype=torch.float32)
m = get_peft_model(m, LoraConfig(r=rank, lora_alpha=8, target_modules=targets, lora_dropout=0.0,
                                 fan_in_fan_out=targets == ["c_attn"], task_type="CAUSAL_LM"))
m.train()
params = [p for p in m.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=2e-3, betas=(0.9, 0.98), weight_decay=0.1)
ids = [int(t) for t in open(f"{work}/ids.txt").read().split()]
g = torch.Generator().manual_seed(0)
rates = []
for step in range(steps):
    starts = torch.randint(0, len(ids) - 258, (4,), generator=g).tolist()
    batch = torch.tensor([ids[s:s + 257] for s in starts])
    t0 = time.perf_counter()
    logits = m(batch[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    rates.append(4 * 256 / (time.perf_counter() - t0))
print(f"  tokens/s (median of steps 2..): {statistics.median(rates[1:] or rates):.0f}", file=sys.stderr)
PY
grep -h "tokens/s" "$work/train LoRA r=$rank $targets (peft).err"
