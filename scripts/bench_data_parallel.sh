#!/usr/bin/env bash
# Data-parallel training on one machine: tokens/s of 1 process × 2 threads against 2 MPI
# ranks × 1 thread, for the medium model of crates/candle-mha-train/benches/train_step.rs (E 256, 8 heads, 4 blocks,
# context 128, 512 ids) on CORPUS, global batch 16 × 128 tokens, no dropout; plus 1 process
# × 1 thread on one rank's half batch (a rank's compute alone), and the seconds rank 0
# spends in the all-reduces (`comm_s` of metrics.jsonl). Median over steps 6..STEPS.
#
#   cargo build --release -p candle-mha-cli --features mpi
#   scripts/bench_data_parallel.sh [CORPUS]    # default: Debian's license texts
set -euo pipefail
cd "$(dirname "$0")/.."
M=${MHA:-target/release/mha}
CORPUS=${1:-/usr/share/common-licenses}
STEPS=${STEPS:-25}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$M" prepare --text "$CORPUS" --out "$OUT/data" --vocab-size 512 --quiet 2>/dev/null
common=(train --data "$OUT/data" --embed-dim 256 --num-heads 8 --num-layers 4 --max-len 128
  --dropout 0 --resid-dropout 0 --steps "$STEPS" --warmup 5 --eval-every 0 --save-every 0
  --eval-windows 8 --quiet)
RAYON_NUM_THREADS=2 "$M" "${common[@]}" --batch-size 16 --out "$OUT/p1t2" > "$OUT/p1t2.log" 2>&1
mpirun -n 2 --bind-to core "$M" "${common[@]}" --batch-size 16 --out "$OUT/p2t1" > "$OUT/p2t1.log" 2>&1
RAYON_NUM_THREADS=1 "$M" "${common[@]}" --batch-size 8 --out "$OUT/half" > "$OUT/half.log" 2>&1
python3 - "$OUT" <<'PY'
import json, sys, statistics
out = sys.argv[1]
def rows(name):
    return [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl")]
def med(name):
    r = [x for x in rows(name) if x.get("tokens_per_s") and x["step"] > 5]
    tps = statistics.median(x["tokens_per_s"] for x in r)
    return tps, r[0]["tokens"] / tps * 1000, r[0]["tokens"]
a, b, c = med("p1t2"), med("p2t1"), med("half")
cs = statistics.median(x["comm_s"] for x in rows("p2t1") if "comm_s" in x and x["step"] > 5) * 1000
print(f"1 process x 2 threads, batch 16: {a[0]:.0f} tok/s, step {a[1]:.1f} ms ({a[2]} tokens)")
print(f"2 ranks x 1 thread, batch 16:    {b[0]:.0f} tok/s, step {b[1]:.1f} ms ({b[2]} tokens)")
print(f"1 process x 1 thread, batch 8:   {c[0]:.0f} tok/s, step {c[1]:.1f} ms ({c[2]} tokens, one rank's part)")
print(f"2 ranks: rank 0 in the all-reduces: {cs:.1f} ms of the {b[1]:.1f} ms step ({cs / b[1] * 100:.1f}%)")
print(f"2-rank step minus a rank's compute alone: {b[1] - c[1]:.1f} ms ({(b[1] - c[1]) / b[1] * 100:.1f}%)")
print(f"2 ranks / 1 process: {b[0] / a[0]:.2f}x tokens/s")
PY
grep "data parallel" "$OUT/p2t1.log"
