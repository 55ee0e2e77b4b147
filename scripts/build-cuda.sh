#!/usr/bin/env bash
# Builds candle-mha with `--features cuda` on a machine with no CUDA and no GPU, and packs the
# binaries a GPU machine needs into one compressed archive.
#
#   scripts/build-cuda.sh                 # -> target/gpu-pack.tar.xz (CLI, examples, GPU tests, bench)
#   scripts/build-cuda.sh --check         # only `cargo check --workspace --features cuda,nccl --all-targets` (run by CI;
#                                         #  `cuda` alone when Open MPI, which `nccl` needs, is missing)
#
# On the GPU machine (CUDA 13 driver; no Rust needed):
#   tar xf gpu-pack.tar.xz && gpu-pack/gpu-check.sh OUT_DIR [TEXT]     # the whole check (tests,
#                                                  examples on CPU and CUDA compared, CLI, bench)
#   cd gpu-pack && ./run-on-gpu.sh tests                                 # every packed test
#   ./run-on-gpu.sh mha train --device cuda                              # any packed binary
#
# Why: the toolkit comes from PyPI wheels via scripts/prepare-cuda-toolkit.sh (nvcc 13.0 and
# a link-time libcuda stub; CUDA_COMPUTE_CAP defaults to 90, the H100/H200). The build goes to
# target/cuda so the CPU build in target/ is not invalidated. Binaries are stripped and the
# archive is xz-compressed to stay under the 64 MB a device call can carry.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLKIT_SCRIPT=${TOOLKIT_SCRIPT:-scripts/prepare-cuda-toolkit.sh}
[ -f "$TOOLKIT_SCRIPT" ] || { echo "missing $TOOLKIT_SCRIPT (set TOOLKIT_SCRIPT)" >&2; exit 3; }
cargo fetch --features cuda >/dev/null 2>&1 || cargo fetch >/dev/null  # cudarc source for the stub
# Exit 3 (not 1) when the toolkit itself cannot be had (no PyPI access): CI tells the two apart.
toolkit_env=$(bash "$TOOLKIT_SCRIPT" "${CUDA_TOOLKIT_DIR:-$HOME/.cache/cuda13-toolkit}") || {
  echo "cannot prepare the CUDA toolkit with $TOOLKIT_SCRIPT" >&2; exit 3; }
eval "$toolkit_env"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/cuda}

if [ "${1:-}" = "--check" ]; then
  # `nccl` (data-parallel training's GPU all-reduce) includes `cuda` and `mpi`: one check
  # covers both. It needs the MPI headers (mpicc; Debian: libopenmpi-dev libclang-dev).
  features=cuda
  if command -v mpicc >/dev/null; then
    features=cuda,nccl
  else
    echo "mpicc not found (apt install libopenmpi-dev libclang-dev): checking --features cuda without nccl" >&2
  fi
  cargo check --release --workspace --features "$features" --all-targets
  exit 0
fi

TESTS=${GPU_TESTS:-"cuda_fused cuda_parity transformer pytorch_parity golden model training"}
# The examples that take their device from MHA_DEVICE (gpu-check.sh runs each on both).
EXAMPLES=${GPU_EXAMPLES:-"quickstart attention_graph embedding_fusion export_for_pytorch glove_walkthrough import_transformer vocab_importance"}
cargo build --release -p candle-mha-cli --features cuda --bin mha
for e in $EXAMPLES; do cargo build --release --features cuda --example "$e"; done
cargo build --release --features cuda --bench gpu_attention
test_args=(); for t in $TESTS; do test_args+=(--test "$t"); done
json=$(cargo test --release --features cuda --no-run --message-format=json "${test_args[@]}")

PACK=$CARGO_TARGET_DIR/gpu-pack
rm -rf "$PACK" && mkdir -p "$PACK/bin" "$PACK/tests" "$PACK/fixtures"
cp "$CARGO_TARGET_DIR/release/mha" "$PACK/bin/"
for e in $EXAMPLES; do cp "$CARGO_TARGET_DIR/release/examples/$e" "$PACK/bin/"; done
cp "$(ls -t "$CARGO_TARGET_DIR"/release/deps/gpu_attention-* | grep -v '\.d$' | head -1)" "$PACK/bin/gpu_attention"
echo "$json" | python3 -c '
import json, sys, shutil
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        shutil.copy(m["executable"], sys.argv[1] + "/" + m["target"]["name"])
' "$PACK/tests"
strip "$PACK"/bin/* "$PACK"/tests/*
cp -r tests/fixtures/. "$PACK/fixtures/"
cp weights/wordllama_l2_1500w_64d.txt "$PACK/fixtures/"
cp scripts/run-on-gpu.sh scripts/gpu-check.sh scripts/compare_outputs.py scripts/verify_roundtrip.py \
  scripts/bench_gpu_reference.py scripts/reference_model.py "$PACK/"
# Every binary carries the same ~45 MB of candle's CUDA kernels: a dictionary larger than one
# binary stores them once (17 MB in all instead of 87 MB with xz's default; ~40 s).
XZ_OPT='-T1 --lzma2=preset=1,dict=256MiB' tar -C "$CARGO_TARGET_DIR" -cJf target/gpu-pack.tar.xz gpu-pack
ls -l target/gpu-pack.tar.xz
