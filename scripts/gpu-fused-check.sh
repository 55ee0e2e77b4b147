#!/usr/bin/env bash
# The fused CUDA attention's check in one short GPU call (packed by scripts/build-cuda.sh):
#
#   scripts/gpu-fused-check.sh PACK.tar.xz OUT_DIR
#
# 1. the fused kernel's tests (tests/cuda_fused.rs) and the CUDA parity tests;
# 2. the gpu_attention benchmark (fused and reference paths, PyTorch MHA and SDPA; the peak
#    memory of an L = 16384 forward);
# 3. `mha train` on the text defaults, tokens/s on CUDA and on the machine's CPU cores.
#
# Logs go to OUT_DIR (tests.log, bench.log, train.log, summary.txt). Each part has a time limit
# (FUSED_CHECK_LIMIT seconds, 150 by default), so a hang costs minutes, not the lease.
set -uo pipefail
PACK=${1:?usage: gpu-fused-check.sh PACK.tar.xz OUT_DIR}
OUT=$(mkdir -p "${2:?usage: gpu-fused-check.sh PACK.tar.xz OUT_DIR}" && cd "$2" && pwd)
LIMIT=${FUSED_CHECK_LIMIT:-150}
WORK=$(mktemp -d)
tar -C "$WORK" -xJf "$PACK" || exit 1
RUN="$WORK/gpu-pack/run-on-gpu.sh"
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }
part() { # part NAME LOG LIMIT COMMAND...
  local name=$1 log=$2 limit=$3; shift 3
  local t0=$SECONDS
  echo "== $name: $*" >>"$log"
  timeout "$limit" "$@" >>"$log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then summary "ok    $name ($((SECONDS - t0)) s)"; else
    summary "FAIL  $name (exit $rc$([ $rc -eq 124 ] && echo ", time limit"), $((SECONDS - t0)) s)"
  fi
}
: >"$OUT/summary.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$OUT/summary.txt"
python3 -c 'import torch; print("torch", torch.__version__)' 2>&1 | tee -a "$OUT/summary.txt"

part "cuda_fused tests" "$OUT/tests.log" "$LIMIT" "$RUN" test cuda_fused
part "cuda_parity tests" "$OUT/tests.log" "$LIMIT" "$RUN" test cuda_parity
part "transformer tests" "$OUT/tests.log" "$LIMIT" "$RUN" test transformer
grep -E "^test |panicked|failures:|relative error|peak GPU|checked" "$OUT/tests.log" | head -60

cd "$WORK" || exit 1
part "gpu_attention benchmark" "$OUT/bench.log" $((2 * LIMIT)) env \
  MHA_BENCH_SCRIPT="$WORK/gpu-pack/bench_gpu_reference.py" \
  MHA_BENCH_SHAPES="${BENCH_SHAPES:-512,1024,2048,4096,8192}" "$RUN" gpu_attention
grep -v "^==" "$OUT/bench.log" | tail -40
# A control build of the benchmark (another kernel version), when packed: the same shapes'
# times in the same call.
if [ -x "$WORK/gpu-pack/bin/gpu_attention_control" ]; then
  part "gpu_attention control build" "$OUT/bench.log" "$LIMIT" env MHA_BENCH_PYTHON=none \
    MHA_BENCH_LONG_L=0 MHA_BENCH_REF_MAX_L=0 MHA_BENCH_SHAPES="${CONTROL_SHAPES:-1024,4096}" \
    "$RUN" gpu_attention_control
  grep -A12 "== gpu_attention control" "$OUT/bench.log" | grep -E "^ *(bf16|f32)"
fi

# Two examples on both devices, their outputs compared number by number.
F="$WORK/gpu-pack/fixtures"
for ex in "quickstart" "import_transformer $F/checkpoints/encoder_bf_module.pt $F/checkpoints/encoder_bf_forward_expected.safetensors"; do
  name=${ex%% *}
  for dev in cpu cuda; do
    MHA_DEVICE=$dev timeout "$LIMIT" "$RUN" $ex >"$WORK/$name.$dev.txt" 2>>"$OUT/tests.log"
  done
  part "example $name: cuda = cpu" "$OUT/tests.log" "$LIMIT" python3 "$WORK/gpu-pack/compare_outputs.py" \
    --rtol 1e-3 --mask '[0-9.]+ ?(ms|s)\b' "$WORK/$name.cpu.txt" "$WORK/$name.cuda.txt"
done

# Text from the machine's own files (license and documentation texts of its Python packages).
python3 - "$WORK/text.txt" <<'PY'
import glob, sys, site
roots = site.getsitepackages() + ["/usr/share/common-licenses", "/usr/share/doc"]
out, size = open(sys.argv[1], "w", encoding="utf-8"), 0
for root in roots:
    for path in sorted(glob.glob(root + "/**/*", recursive=True)):
        name = path.rsplit("/", 1)[-1]
        if size < 8_000_000 and (name.startswith(("LICENSE", "COPYING")) or name in ("copyright", "METADATA")):
            try:
                text = open(path, encoding="utf-8").read()
            except (OSError, UnicodeDecodeError):
                continue
            out.write(text + "\n")
            size += len(text)
PY
echo "text: $(wc -c <"$WORK/text.txt") bytes" | tee -a "$OUT/summary.txt"
part "mha prepare" "$OUT/train.log" "$LIMIT" "$RUN" mha prepare --text "$WORK/text.txt" --out "$WORK/data"
for dev in cuda cpu; do
  part "mha train --device $dev (text defaults, 200 steps)" "$OUT/train.log" "$LIMIT" "$RUN" mha train \
    --device "$dev" --data "$WORK/data" --out "$WORK/runs/$dev" --steps 200 --eval-every 1000 \
    --save-every 1000 --quiet
  grep "step 200:" "$OUT/train.log" | tail -1 | sed "s/^/$dev: /" | tee -a "$OUT/summary.txt"
done
rm -rf "$WORK"
