#!/usr/bin/env bash
# Makes Intel MKL available for `cargo build --features mkl` from PyPI's wheels, with no
# system install and no download at build time. Prints the environment to export.
#
#   eval "$(scripts/prepare-mkl.sh [DIR])"    # DIR defaults to ~/.cache/mkl
#   cargo build --release --features mkl
#
# Why each step:
# - candle-core's `mkl` feature links MKL statically through intel-mkl-src
#   (`mkl-static-lp64-iomp`), which finds the libraries under $MKLROOT (it walks the tree for
#   libmkl_core.a, mkl.h and libiomp5.so); without it, it would try to download them from
#   ghcr.io. The wheels `mkl-static` (the .a files), `mkl-include` (mkl.h) and `intel-openmp`
#   (libiomp5.so) hold all three; they are unpacked as they are.
# - libiomp5 is linked dynamically (no static one ships): LD_LIBRARY_PATH finds it at run time.
# - Versions are pinned so that a build is the same on every machine.
set -euo pipefail
DIR=${1:-$HOME/.cache/mkl}
VERSION=${MKL_VERSION:-2026.2.0}
if [ ! -f "$DIR/.complete-$VERSION" ]; then
  mkdir -p "$DIR/wheels"
  python3 -m pip download -q --disable-pip-version-check --no-deps -d "$DIR/wheels" \
    "mkl-static==$VERSION" "mkl-include==$VERSION" "intel-openmp==$VERSION" >&2
  for w in "$DIR"/wheels/*-"$VERSION"-*.whl; do
    python3 -m zipfile -e "$w" "$DIR/root" >&2
  done
  touch "$DIR/.complete-$VERSION"
fi
ROOT=$DIR/root
# -quit, not a pipe into head: under pipefail a pipe's early reader can fail the script.
IOMP=$(dirname "$(find "$ROOT" -name libiomp5.so -print -quit)")
[ -f "$IOMP/libiomp5.so" ] || { echo "libiomp5.so not found under $ROOT" >&2; exit 1; }
[ -n "$(find "$ROOT" -name libmkl_core.a -print -quit)" ] || { echo "libmkl_core.a not found under $ROOT" >&2; exit 1; }
echo "export MKLROOT=\"$ROOT\" LD_LIBRARY_PATH=\"$IOMP\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
