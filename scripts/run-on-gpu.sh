#!/usr/bin/env bash
# Runs a packed candle-mha binary on a GPU machine (see scripts/build-cuda.sh), with the
# machine's CUDA 13 libraries (cuBLAS, cuBLASLt, cuRAND, NVRTC, cudart) on LD_LIBRARY_PATH.
#
#   ./run-on-gpu.sh tests                 # every packed test binary (fixtures from ./fixtures)
#   ./run-on-gpu.sh test cuda_fused       # one packed test binary (test-binary args may follow)
#   ./run-on-gpu.sh mha train --device cuda
#   ./run-on-gpu.sh gpu_attention         # the GPU benchmark (PyTorch side via python3)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# The libraries: a system toolkit, else the nvidia-* wheels PyTorch brings.
dirs=()
for d in /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && dirs+=("$d")
done
if command -v python3 >/dev/null; then
  while IFS= read -r d; do [ -n "$d" ] && dirs+=("$d"); done < <(python3 - <<'PY' 2>/dev/null
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
seen = set()
for r in roots:
    for lib in glob.glob(os.path.join(r, "nvidia", "**", "lib"), recursive=True):
        if any(glob.glob(os.path.join(lib, p)) for p in ("libcublas.so*", "libcudart.so*", "libcurand.so*", "libnvrtc.so*")):
            if lib not in seen:
                seen.add(lib); print(lib)
PY
)
fi
LIBS=$(IFS=:; echo "${dirs[*]:-}")
export LD_LIBRARY_PATH="${LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MHA_FIXTURES_DIR="$HERE/fixtures" MHA_BENCH_PYTHON=${MHA_BENCH_PYTHON:-python3}
for lib in libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libnvrtc.so.13 libcudart.so.13; do
  found=no; for d in "${dirs[@]:-}"; do [ -e "$d/$lib" ] && found=yes; done
  [ $found = yes ] || echo "warning: $lib not found in ${LIBS:-(nothing)}" >&2
done
cmd=${1:?usage: run-on-gpu.sh tests | BINARY [ARGS...]}; shift
if [ "$cmd" = tests ]; then
  status=0
  for t in "$HERE"/tests/*; do
    echo "== $(basename "$t")"
    (cd "$HERE" && "$t" --test-threads=1 --nocapture "$@") || status=1
  done
  exit $status
fi
if [ "$cmd" = test ]; then
  t=${1:?usage: run-on-gpu.sh test NAME [ARGS...]}; shift
  cd "$HERE" && exec "$HERE/tests/$t" --test-threads=1 --nocapture "$@"
fi
exec "$HERE/bin/$cmd" "$@"
