#!/usr/bin/env bash
# SmolLM2-135M's shape (30 layers, E 576, 9/3 heads, MLP 1536, vocabulary 49152, tied; random
# weights) in our Llama and in transformers, one phase per process, in alternation:
# `mha import` of the directory against transformers' `from_pretrained` (seconds, peak RSS),
# generation (64 greedy tokens, cached), evaluation (4×1024 tokens), training steps (4×256);
# generation and training also with bf16 products (`autocast` against `torch.autocast`).
# Usage: scripts/bench_llama.sh PYTHON [ROUNDS]   (PYTHON: a Python with torch and transformers)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:?usage: scripts/bench_llama.sh PYTHON [ROUNDS]}
rounds=${2:-2}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cargo build --release -q -p candle-mha-train --example llama_bench
cargo build --release -q -p candle-mha-cli
"$py" scripts/bench_llama.py make "$dir/smollm2-135m-shape" 2>/dev/null
bin=target/release/examples/llama_bench
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
for r in $(seq "$rounds"); do
  rm -rf "$dir/run"
  /usr/bin/time -f "round $r ours   import %e s %M KiB" target/release/mha import "$dir/smollm2-135m-shape" --out "$dir/run" >/dev/null 2>"$dir/import.err" || { cat "$dir/import.err" >&2; exit 1; }
  tail -n 1 "$dir/import.err"
  echo "round $r theirs $("$py" scripts/bench_llama.py load "$dir/smollm2-135m-shape" 2>/dev/null)"
  for phase in generate generate-bf16 eval train train-bf16; do
    echo "round $r ours   $("$bin" "$dir/smollm2-135m-shape" "$phase")"
    echo "round $r theirs $("$py" scripts/bench_llama.py "$phase" "$dir/smollm2-135m-shape" 2>/dev/null)"
  done
done
