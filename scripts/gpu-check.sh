#!/usr/bin/env bash
# The whole GPU check, in one command on a GPU machine (packed by scripts/build-cuda.sh):
#
#   tar xf gpu-pack.tar.xz && gpu-pack/gpu-check.sh OUT_DIR [TEXT_FILE]
#
# 1. every packed test binary (CUDA against CPU on every fixture, PyTorch parity, training);
# 2. every packed example twice, MHA_DEVICE=cpu and MHA_DEVICE=cuda, and the two outputs
#    compared number by number (compare_outputs.py);
# 3. `mha train` on the built-in recall task on the CPU and on CUDA (both must solve it),
#    `mha generate` and `mha eval` of the CUDA run, on the CPU and on CUDA;
# 4. with TEXT_FILE: `mha train --text` on CUDA and a generation from it;
# 5. a module trained on CUDA, saved, and loaded by PyTorch with load_state_dict(strict=True)
#    (verify_roundtrip.py, when python3 has torch);
# 6. the gpu_attention benchmark against PyTorch (GPU_CHECK_BENCH=0 skips it).
#
# Logs go to OUT_DIR (summary.txt, tests.log, examples.log, train.log, bench.log); the exit
# status is 1 when any part failed. Each part has a time limit (GPU_CHECK_LIMIT seconds, 240 by
# default; the benchmark twice that), so a hang costs minutes, not the machine's whole lease.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$(mkdir -p "${1:?usage: gpu-check.sh OUT_DIR [TEXT_FILE]}" && cd "$1" && pwd)
TEXT=${2:-}
LIMIT=${GPU_CHECK_LIMIT:-240}
RUN="$HERE/run-on-gpu.sh"
WORK=$(mktemp -d)
cd "$WORK" || exit 1
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }
failed=0
part() { # part NAME LOG COMMAND...: runs COMMAND with the time limit, logs, records the result
  local name=$1 log=$2; shift 2
  local t0=$SECONDS
  echo "== $name: $*" >>"$log"
  timeout "${PART_LIMIT:-$LIMIT}" "$@" >>"$log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then summary "ok    $name ($((SECONDS - t0)) s)"; else
    summary "FAIL  $name (exit $rc$([ $rc -eq 124 ] && echo ", time limit"), $((SECONDS - t0)) s; see $(basename "$log"))"
    failed=1
  fi
  return $rc
}

: >"$OUT/summary.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 |
  sed 's/^/gpu: /' | tee -a "$OUT/summary.txt"

# 1. The test binaries.
part "tests" "$OUT/tests.log" "$RUN" tests

# 2. Each example on both devices, each in its own folder (their files go to ./target/…);
#    stdout (the example's product) is compared, stderr goes to the log.
examples() { # NAME ARGS...
  local e=$1; shift
  for dev in cpu cuda; do
    mkdir -p "$dev"
    part "example $e on $dev" "$OUT/examples.log" bash -c 'cd "$1" && shift && exec "$@" >"$0.txt"' \
      "$e" "$dev" env MHA_DEVICE=$dev "$RUN" "$e" "$@" || true
  done
  for dev in cpu cuda; do { echo "-- $e stdout on $dev"; cat "$dev/$e.txt"; } >>"$OUT/examples.log"; done
  # Durations differ; examples that train for many steps drift apart in the last digits
  # (float sums in another order, compounded by the optimizer): 2% for those.
  local rtol=1e-3
  case $e in embedding_fusion | vocab_importance) rtol=2e-2 ;; esac
  part "example $e: cuda output = cpu output" "$OUT/examples.log" \
    python3 "$HERE/compare_outputs.py" --rtol $rtol --mask '[0-9.]+ ?(ms|s)\b' "cpu/$e.txt" "cuda/$e.txt" || true
}
for e in $(ls "$HERE/bin"); do
  case $e in
  mha | gpu_attention) ;;
  # The source tree's files, as packed.
  glove_walkthrough) examples "$e" "$HERE/fixtures/wordllama_l2_1500w_64d.txt" ;;
  import_transformer) examples "$e" "$HERE/fixtures/checkpoints/encoder_bf_module.pt" \
    "$HERE/fixtures/checkpoints/encoder_bf_forward_expected.safetensors" ;;
  export_for_pytorch) examples "$e" export self ;;
  *) examples "$e" ;;
  esac
done

# 3. The CLI's training, generation and evaluation on both devices.
for dev in cpu cuda; do
  part "mha train (recall task) on $dev" "$OUT/train.log" "$RUN" mha train --device $dev --out "runs/$dev"
done
n_solved=$(grep -c "the recall task is solved" "$OUT/train.log")
if [ "$n_solved" -eq 2 ]; then summary "ok    the recall task is solved on cpu and on cuda"; else
  summary "FAIL  the recall task is solved in $n_solved of 2 runs"; failed=1
fi
for dev in cpu cuda; do
  # The CUDA-trained checkpoint on both devices; k5's value in the prompt is v7.
  part "mha generate on $dev (answers v7)" "$OUT/train.log" bash -c \
    "out=\$('$RUN' mha generate --device $dev --checkpoint runs/cuda \
      --prompt 'k3 v1 k5 v7 k0 v2 k9 v4 ? k5' --max-new-tokens 1) && echo \"\$out\" && grep -q '=> v7' <<<\"\$out\""
  part "mha eval on $dev" "$OUT/train.log" "$RUN" mha eval --device $dev --checkpoint runs/cuda
done

# 4. Text training on CUDA.
if [ -n "$TEXT" ]; then
  part "mha train --text on cuda" "$OUT/train.log" "$RUN" mha train --device cuda --text "$TEXT" \
    --out runs/text --steps 400 --quiet &&
    part "mha generate (text) on cuda" "$OUT/train.log" "$RUN" mha generate --device cuda \
      --checkpoint runs/text --prompt "The license" --max-new-tokens 40 --seed 1
fi

# 5. A CUDA-trained module, loaded by PyTorch.
if python3 -c "import torch, safetensors" 2>/dev/null; then
  for case in self cross; do
    part "export_for_pytorch $case (cuda) -> PyTorch load_state_dict(strict=True)" "$OUT/examples.log" \
      bash -c "MHA_DEVICE=cuda '$RUN' export_for_pytorch roundtrip-$case $case && python3 '$HERE/verify_roundtrip.py' roundtrip-$case"
  done
fi

# 6. The benchmark.
if [ "${GPU_CHECK_BENCH:-1}" != 0 ]; then
  PART_LIMIT=$((2 * LIMIT)) part "gpu_attention benchmark" "$OUT/bench.log" \
    env MHA_BENCH_SCRIPT="$HERE/bench_gpu_reference.py" "$RUN" gpu_attention
fi
rm -rf "$WORK"
[ $failed = 0 ] && summary "all parts passed" || summary "some parts FAILED"
exit $failed
