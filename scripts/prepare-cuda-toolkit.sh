#!/usr/bin/env bash
# Builds a CUDA 13.0 build toolkit out of PyPI packages, for `cargo build --features cuda`
# on a machine with no system CUDA and no GPU. Prints the environment to export.
#
#   eval "$(scripts/prepare-cuda-toolkit.sh [DIR])"    # DIR defaults to ~/.cache/cuda13-toolkit
#   cargo build --release --features cuda
#
# Why each step:
# - nvcc, nvvm, crt, cccl and runtime headers are pinned to 13.0: a CUDA 13.0 driver (580)
#   cannot load the PTX a newer nvvm writes (and ptxas 13.0 rejects it: "Unsupported .version
#   9.5"). Pin other versions for other drivers.
# - candle-core's cudarc links dynamically (-lcuda -lcublas -lcublasLt -lcurand -lnvrtc
#   -lcudart): the wheels ship only versioned .so files, so unversioned links are added.
# - libcuda.so is the GPU driver and ships with no wheel: a link-time stub is compiled from
#   the driver symbols cudarc declares. Its soname is libcuda.so.1, so at run time the
#   machine's real driver is loaded, never the stub.
# - CUDA_COMPUTE_CAP=90 (Hopper) because no GPU is here to ask; override it for other cards.
set -euo pipefail
DIR=${1:-$HOME/.cache/cuda13-toolkit}
C=$DIR/nvidia/cu13
if [ ! -x "$C/bin/nvcc" ]; then
  python3 -m pip install -q --disable-pip-version-check --target "$DIR" \
    nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
    nvidia-cuda-cccl==13.0.85 nvidia-cuda-runtime==13.0.96 nvidia-cuda-nvrtc==13.0.88 \
    nvidia-cublas==13.0.2.14 nvidia-curand==10.4.0.35 >&2
fi
L=$C/lib
for n in cudart nvrtc cublas cublasLt; do ln -sf "lib$n.so.13" "$L/lib$n.so"; done
ln -sf libcurand.so.10 "$L/libcurand.so"
if [ ! -f "$L/libcuda.so" ]; then
  REG=${CARGO_HOME:-$HOME/.cargo}/registry/src
  SYS=$(ls -d "$REG"/*/cudarc-0.19.*/src/driver/sys/mod.rs 2>/dev/null | tail -1 || true)
  if [ -z "$SYS" ]; then
    echo "cudarc source not found: run 'cargo fetch' in a crate that enables the cuda feature first" >&2
    exit 1
  fi
  { echo "/* link-time stub of the CUDA driver; the real libcuda.so.1 is loaded at run time */"
    grep -oE 'fn cu[A-Z][A-Za-z0-9_]*\(' "$SYS" | sed -E 's/fn (cu[A-Za-z0-9_]*)\(/void \1(void) {}/' | sort -u
  } > "$DIR/cuda_stub.c"
  gcc -shared -fPIC -o "$L/libcuda.so" -Wl,-soname,libcuda.so.1 "$DIR/cuda_stub.c"
fi
echo "export PATH=\"$C/bin:\$PATH\" CUDA_ROOT=\"$C\" CUDA_PATH=\"$C\" CUDA_COMPUTE_CAP=\"\${CUDA_COMPUTE_CAP:-90}\""
