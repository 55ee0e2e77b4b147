#!/usr/bin/env bash
# `mha vocab-matrix` on a model of GPT-2's vocabulary size (50,257 ids): a token-file corpus
# of the machine's own text (the copyright files of /usr/share/doc and the licenses of
# /usr/share/common-licenses, the 50,253 most frequent words plus fillers, 32 words a line), a
# small model trained for a few steps, then the matrix over a 5,000-line sample and over the
# run's whole training set: wall time and peak RSS (GNU time). No PyTorch side: PyTorch has
# no such command. Usage: scripts/bench_vocab_matrix.sh [WORKDIR [TEXT_FILE...]]: WORKDIR
# defaults to target/bench-vm; the text files, to Debian's copyright and license files.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-target/bench-vm}
shift $(( $# > 0 ? 1 : 0 ))
mha=${MHA:-target/release/mha}
[ -x "$mha" ] || cargo build --release -p candle-mha-cli
mkdir -p "$work"
python3 - "$work" "$@" <<'PY'
import collections, glob, sys
work, files = sys.argv[1], sys.argv[2:]
if not files:
    files = sorted(glob.glob("/usr/share/doc/*/copyright")) + sorted(glob.glob("/usr/share/common-licenses/*"))
words = []
for f in files:
    with open(f, encoding="utf-8", errors="ignore") as fh:
        words += fh.read().split()
keep = {w for w, _ in collections.Counter(words).most_common(50253)}
ws = [w for w in words if w in keep and not w.startswith("#")]
lines = [" ".join(ws[i:i + 32]) for i in range(0, len(ws), 32)]
# Fillers up to 50,253 symbols: with the 4 specials, 50,257 ids.
missing = 50253 - len(set(ws))
lines.append(" ".join(f"fill{i}" for i in range(missing)))
open(f"{work}/corpus.txt", "w").write("\n".join(lines) + "\n")
open(f"{work}/sample.txt", "w").write("\n".join(lines[:5000]) + "\n")
print(f"{len(ws)} words, {len(lines)} lines, {len(set(ws)) + missing + 4} ids")
PY
rm -rf "$work/run" "$work/vm-sample" "$work/vm-all"
"$mha" train --tokens "$work/corpus.txt" --out "$work/run" --steps 30 --batch-size 16 \
  --embed-dim 64 --num-heads 4 --num-layers 2 --eval-every 0 --quiet 2>&1 | tail -n 3
measure() {
  local name=$1; shift
  /usr/bin/time -f "$name: %e s wall, %M KiB peak RSS" "$mha" vocab-matrix "$@" > /dev/null
}
measure "sample (5,000 lines)" --checkpoint "$work/run" --tokens "$work/sample.txt" --out "$work/vm-sample"
measure "training set" --checkpoint "$work/run" --out "$work/vm-all"
