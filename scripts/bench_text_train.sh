#!/usr/bin/env bash
# Training on text, `mha train --data` against the PyTorch twin, and `mha prepare` throughput.
#
#   scripts/bench_text_train.sh TEXT...                (files, directories, globs)
#   MHA_BENCH_TEXT="TEXT..." scripts/bench_text_train.sh
#
# Prints two Markdown tables (see docs/benchmarks.md, "Training on text" and "mha prepare
# throughput"):
#
# 1. Training. The corpus is prepared once (`mha prepare --text TEXT --vocab-size V`) into a
#    temporary data directory. Then, for R rounds, `mha train --data` (ours) and
#    `scripts/reference_train.py` (PyTorch, the same model, optimizer settings, batch shape
#    and data) each train W + S steps of N random windows of L + 1 tokens; the order of the
#    two sides alternates from round to round, so that both see the same machine load. A
#    side's round value is the median tokens/s over its steps after the first W (ours: the
#    `tokens_per_s` of RUN/metrics.jsonl, N·L over the wall time of the optimizer step,
#    batch assembly excluded; PyTorch: the same, timed the same way). A cell is the median
#    over the rounds; "per round" is the range of the ratio ours/torch over the rounds
#    (higher = ours faster). Peak RSS is each process's maximum resident set size (median
#    over the rounds).
# 2. Prepare. A corpus of MHA_BENCH_PREPARE_MB megabytes (10^6 bytes) is made by writing
#    shuffled copies of the lines of TEXT (awk, seeded) into a temporary file; then
#    `mha prepare --text BIG --tokenizer <the tokenizer of step 1>` (encoding only) and, with
#    MHA_BENCH_PREPARE_BPE=1 (default), `mha prepare --text BIG --vocab-size V` (a BPE trained
#    on its default 8 MB sample first) are timed: wall time of the whole process (start to
#    exit: reading, encoding, hashing the sources, writing tokens.bin and meta.json), MB/s
#    = text bytes / wall time, and peak RSS.
#
# Environment (defaults in brackets):
#   MHA_BENCH_TEXT        the corpus when no argument is given (required: one or the other)
#   MHA_BIN               the mha binary [target/release/mha of this repository]
#   MHA_BENCH_PYTHON      a Python with torch and numpy [python3]; without torch the
#                         PyTorch columns read n/a
#   MHA_BENCH_ROUNDS      R [3]            MHA_BENCH_STEPS   S timed steps [30]
#   MHA_BENCH_WARMUP      W [5]            MHA_BENCH_BATCH   N [16]
#   MHA_BENCH_MAX_LEN     L [256]          MHA_BENCH_EMBED   E [256]
#   MHA_BENCH_HEADS       H [8]            MHA_BENCH_LAYERS  layers [4]   (ff = 4E)
#   MHA_BENCH_VOCAB       V, BPE vocabulary [512]
#   MHA_BENCH_DROPOUT     attention dropout, both sides [0]   (mha train's text defaults:
#   MHA_BENCH_RESID_DROPOUT  residual dropout, both sides [0]    0.1 and 0.2)
#   MHA_BENCH_TORCH_CAUSAL=1   PyTorch's attention also gets is_causal=True (SDPA without a
#                         mask; ours always runs causal without a mask); default: the mask
#   MHA_BENCH_TRAIN=0     skip the training table
#   MHA_BENCH_PREPARE_MB  size of the prepare corpus [1000]; 0 skips the prepare table
#   MHA_BENCH_PREPARE_BPE=0    skip the prepare run that trains its BPE
#   MHA_BENCH_TMP         where the temporary directory goes [mktemp's default: $TMPDIR,
#                         else the system's]; it needs about 2 × MHA_BENCH_PREPARE_MB of
#                         free disk (the corpus, then one tokens.bin at a time)
#   MHA_BENCH_KEEP=1      keep the temporary directory (logs, runs, data)
#   RAYON_NUM_THREADS     mha's threads [all cores]; PyTorch gets torch.set_num_threads of
#                         the same number
#
# Both sides keep freed memory: the mha CLI calls mallopt itself (runtime::retain_freed_memory), and PyTorch's
# process runs under the equivalent GLIBC_TUNABLES, as in the Rust benches.
#
# Needs bash, coreutils (sort, paste, date, mktemp, nproc), find, awk, and for peak RSS GNU
# time (`time -v`; on Debian/Ubuntu `apt-get install -y time`); without it the script polls
# VmHWM in /proc/PID/status every 0.1 s instead (the same number, less any growth in the
# last 0.1 s before exit).

set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")

die() { echo "bench_text_train: $*" >&2; exit 1; }

# ---- settings -------------------------------------------------------------------------------
if [[ $# -gt 0 ]]; then
    corpus=("$@")
elif [[ -n ${MHA_BENCH_TEXT:-} ]]; then
    # shellcheck disable=SC2206 # split on whitespace and expand globs, as a command line would
    corpus=($MHA_BENCH_TEXT)
else
    die "no corpus: give text files/directories as arguments or in MHA_BENCH_TEXT"
fi

uint() { # NAME DEFAULT: a non-negative integer from the environment
    local v=${!1:-$2}
    [[ $v =~ ^[0-9]+$ ]] || die "$1=$v: expected a non-negative integer"
    echo "$v"
}
rounds=$(uint MHA_BENCH_ROUNDS 3)
steps=$(uint MHA_BENCH_STEPS 30)
warmup=$(uint MHA_BENCH_WARMUP 5)
batch=$(uint MHA_BENCH_BATCH 16)
max_len=$(uint MHA_BENCH_MAX_LEN 256)
embed=$(uint MHA_BENCH_EMBED 256)
heads=$(uint MHA_BENCH_HEADS 8)
layers=$(uint MHA_BENCH_LAYERS 4)
vocab=$(uint MHA_BENCH_VOCAB 512)
prepare_mb=$(uint MHA_BENCH_PREPARE_MB 1000)
do_train=${MHA_BENCH_TRAIN:-1}
do_bpe=${MHA_BENCH_PREPARE_BPE:-1}
torch_causal=${MHA_BENCH_TORCH_CAUSAL:-0}
prob() { # NAME: a probability in [0, 1) from the environment, 0 when unset
    local v=${!1:-0}
    awk -v v="$v" 'BEGIN { exit !(v ~ /^[0-9]*\.?[0-9]+$/ && v < 1) }' ||
        die "$1=$v: expected a number in [0, 1)"
    echo "$v"
}
dropout=$(prob MHA_BENCH_DROPOUT)
resid_dropout=$(prob MHA_BENCH_RESID_DROPOUT)
((rounds >= 1 && steps >= 1)) || die "MHA_BENCH_ROUNDS and MHA_BENCH_STEPS must be at least 1"
total_steps=$((warmup + steps))
ff=$((4 * embed))

mha=${MHA_BIN:-$root/target/release/mha}
[[ -x $mha ]] || die "no mha binary at $mha (cargo build --release --bin mha, or set MHA_BIN)"

if [[ -n ${RAYON_NUM_THREADS:-} ]]; then
    threads=$RAYON_NUM_THREADS
else
    threads=$(nproc)
fi
glibc_tunables="glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=2147483647"

# A Python with torch: MHA_BENCH_PYTHON, else python3 (as candle_mha_test_support::bench::find_torch).
python=${MHA_BENCH_PYTHON:-python3}
torch_version=$("$python" -c 'import numpy, torch; print(torch.__version__)' 2>/dev/null) \
    || torch_version=""

gnu_time=$(type -P time || true)
if [[ -n $gnu_time ]] && ! "$gnu_time" -v -o /dev/null true 2>/dev/null; then
    gnu_time=""
fi

if [[ -n ${MHA_BENCH_TMP:-} ]]; then
    work=$(mktemp -d -p "$MHA_BENCH_TMP" mha-bench-text.XXXXXX)
else
    work=$(mktemp -d -t mha-bench-text.XXXXXX) # in $TMPDIR, else the system's default
fi
cleanup() {
    if [[ ${MHA_BENCH_KEEP:-0} == 1 ]]; then
        echo "kept $work" >&2
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT

# ---- helpers --------------------------------------------------------------------------------
median() { # numbers on stdin, one a line -> their median
    sort -g | awk '{ a[NR] = $1 } END {
        if (NR == 0) { print "nan"; exit }
        if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
minmax() { sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.2f–%.2f", lo, hi }'; }
mib() { awk '{ if ($1 == "n/a") print $1; else printf "%.0f\n", $1 / 1024 }'; } # KiB -> MiB
fmt() { awk -v x="$1" -v f="$2" 'BEGIN { if (x == "nan" || x == "") print "n/a"; else printf f, x }'; }

# run_measured LOG CMD...: runs CMD with stdout+stderr to LOG; sets WALL (s) and RSS_KB.
run_measured() {
    local log=$1 t0 t1 status=0
    shift
    t0=$(date +%s.%N)
    if [[ -n $gnu_time ]]; then
        "$gnu_time" -v -o "$log.time" "$@" >"$log" 2>&1 || status=$?
        RSS_KB=$(awk -F': ' '/Maximum resident set size/ { print $2 }' "$log.time" 2>/dev/null)
        RSS_KB=${RSS_KB:-0}
    else
        "$@" >"$log" 2>&1 &
        local pid=$! v
        RSS_KB=0
        while kill -0 "$pid" 2>/dev/null; do
            v=$(awk '/^VmHWM:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || true)
            [[ -n $v ]] && RSS_KB=$v
            sleep 0.1
        done
        wait "$pid" || status=$?
    fi
    t1=$(date +%s.%N)
    WALL=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
    if ((status != 0)); then
        echo "bench_text_train: command failed (exit $status): $*" >&2
        tail -n 20 "$log" >&2
        exit 1
    fi
}

json_field() { # FILE FIELD: a top-level number or string of a one-line-per-key JSON file
    awk -v k="\"$2\"" 'index($0, k) { sub(/^[^:]*:[ ]*/, ""); sub(/,[ ]*$/, ""); gsub(/"/, ""); print; exit }' "$1"
}

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "machine: $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || echo unknown CPU) | nproc $(nproc) | threads $threads (RAYON_NUM_THREADS ${RAYON_NUM_THREADS:-unset})"
echo "mha: $mha ($("$mha" --version 2>/dev/null || echo '?'); repository $(git -C "$root" describe --always --dirty 2>/dev/null || echo '?'); binary modified $(date -u -r "$mha" '+%Y-%m-%d %H:%M UTC'))"
if [[ -n $torch_version ]]; then
    echo "torch: $torch_version (MHA_BENCH_PYTHON=${MHA_BENCH_PYTHON:-unset}, running $python), torch.set_num_threads($threads)"
else
    echo "torch: not available (set MHA_BENCH_PYTHON to a Python with torch and numpy)"
fi
echo "allocator (both sides): retain freed memory (mha: mallopt; torch: GLIBC_TUNABLES=$glibc_tunables)"
echo "peak RSS: $([[ -n $gnu_time ]] && echo "GNU time -v ($gnu_time)" || echo "VmHWM polled every 0.1 s")"

# ---- the corpus, prepared once --------------------------------------------------------------
data=$work/data
run_measured "$work/prepare_small.log" "$mha" prepare --text "${corpus[@]}" --out "$data" \
    --vocab-size "$vocab" --quiet
num_tokens=$(json_field "$data/meta.json" num_tokens)
train_tokens=$(json_field "$data/meta.json" train_tokens)
source_bytes=$(json_field "$data/meta.json" source_bytes)
vocab_size=$(json_field "$data/meta.json" vocab_size)
echo "corpus: ${corpus[*]} ($source_bytes bytes, $num_tokens tokens of a $vocab_size-id BPE, $train_tokens training tokens)"
echo

# ---- 1. training ----------------------------------------------------------------------------
if [[ $do_train != 0 ]]; then
    ((train_tokens >= max_len + 1)) || die "the training part ($train_tokens tokens) is shorter than a window of $((max_len + 1))"
    : >"$work/ours.tsv"
    : >"$work/torch.tsv"
    torch_args=()
    [[ $torch_causal == 1 ]] && torch_args+=(--causal-hint)
    run_ours() { # ROUND
        local run=$work/run_$1
        run_measured "$work/ours_$1.log" "$mha" train --data "$data" --out "$run" \
            --steps "$total_steps" --batch-size "$batch" --max-len "$max_len" \
            --embed-dim "$embed" --num-heads "$heads" --num-layers "$layers" --ff-dim "$ff" \
            --dropout "$dropout" --resid-dropout "$resid_dropout" --eval-every 0 --save-every 0 --eval-windows 8 --quiet
        local tps
        tps=$(awk -v w="$warmup" '/"tokens_per_s"/ {
                  s = $0; sub(/.*"step":/, "", s); sub(/[,}].*/, "", s)
                  t = $0; sub(/.*"tokens_per_s":/, "", t); sub(/[,}].*/, "", t)
                  if (s + 0 > w) print t }' "$run/metrics.jsonl" | median)
        printf '%s\t%s\t%s\t%s\n' "$1" "$tps" "$RSS_KB" "$WALL" >>"$work/ours.tsv"
        echo "round $1: ours  $(fmt "$tps" '%.1f') tok/s (median of steps $((warmup + 1))-$total_steps), peak RSS $((RSS_KB / 1024)) MiB, process ${WALL} s" >&2
        rm -rf "$run"
    }
    run_torch() { # ROUND
        [[ -n $torch_version ]] || return 0
        run_measured "$work/torch_$1.log" env GLIBC_TUNABLES="$glibc_tunables" "$python" \
            "$here/reference_train.py" "$data" --steps "$total_steps" --batch-size "$batch" \
            --max-len "$max_len" --embed-dim "$embed" --num-heads "$heads" \
            --num-layers "$layers" --ff-dim "$ff" --threads "$threads" \
            --dropout "$dropout" --resid-dropout "$resid_dropout" \
            --timing-warmup "$warmup" --quiet ${torch_args[@]+"${torch_args[@]}"}
        local tps
        tps=$(awk '/^torch tokens\/s median/ { print $4 }' "$work/torch_$1.log")
        [[ -n $tps ]] || die "no summary line in $work/torch_$1.log"
        printf '%s\t%s\t%s\t%s\n' "$1" "$tps" "$RSS_KB" "$WALL" >>"$work/torch.tsv"
        echo "round $1: torch $(fmt "$tps" '%.1f') tok/s, peak RSS $((RSS_KB / 1024)) MiB, process ${WALL} s" >&2
    }
    for ((r = 1; r <= rounds; r++)); do
        if ((r % 2)); then run_ours "$r"; run_torch "$r"; else run_torch "$r"; run_ours "$r"; fi
    done

    ours=$(cut -f2 "$work/ours.tsv" | median)
    ours_rss=$(cut -f3 "$work/ours.tsv" | median)
    if [[ -n $torch_version ]]; then
        torch=$(cut -f2 "$work/torch.tsv" | median)
        torch_rss=$(cut -f3 "$work/torch.tsv" | median)
        ratio=$(awk -v a="$ours" -v b="$torch" 'BEGIN { printf "%.2f", a / b }')
        range=$(paste "$work/ours.tsv" "$work/torch.tsv" | awk -F'\t' '{ print $2 / $6 }' | minmax)
    else
        torch=nan torch_rss=nan ratio=n/a range=n/a
    fi
    torch_mode=$([[ $torch_causal == 1 ]] && echo "mask + is_causal hint" || echo "causal mask")
    echo
    echo "Training on text: $rounds rounds of $warmup warmup + $steps timed steps per side (order alternating), f32, dropout $dropout, residual dropout $resid_dropout; torch attention: $torch_mode"
    echo
    echo "| shape (N×L, V, E/H/layers, ff) | ours tok/s | torch tok/s | ratio ours/torch | per round | ours peak RSS MiB | torch peak RSS MiB |"
    echo "|---|--:|--:|--:|--:|--:|--:|"
    printf '| %s×%s (%s tokens), V %s, %s/%s/%s, ff %s | %s | %s | %s | %s | %s | %s |\n' \
        "$batch" "$max_len" "$((batch * max_len))" "$vocab_size" "$embed" "$heads" "$layers" "$ff" \
        "$(fmt "$ours" '%.0f')" "$(fmt "$torch" '%.0f')" "$ratio" "$range" \
        "$(fmt "$ours_rss" '%.0f' | mib)" "$(fmt "$torch_rss" '%.0f' | mib)"
    echo
    echo "tok/s: median over rounds of each round's median over its timed steps; ratio > 1: mha faster."
    echo
fi

# ---- 2. prepare throughput ------------------------------------------------------------------
if ((prepare_mb > 0)); then
    big=$work/big.txt
    target=$((prepare_mb * 1000000))
    # Every file of the corpus (directories walked, sorted), then shuffled copies of its lines.
    files=()
    while IFS= read -r -d '' f; do files+=("$f"); done < <(find "${corpus[@]}" -type f -print0 | sort -z)
    t0=$(date +%s.%N)
    for f in "${files[@]}"; do cat "$f"; echo; done |
        LC_ALL=C awk -v target="$target" '
            { line[n++] = $0 }
            END {
                srand(1); total = 0
                while (total < target) {
                    for (i = n - 1; i > 0; i--) { j = int(rand() * (i + 1)); t = line[i]; line[i] = line[j]; line[j] = t }
                    for (i = 0; i < n && total < target; i++) { print line[i]; total += length(line[i]) + 1 }
                }
            }' >"$big"
    big_bytes=$(wc -c <"$big")
    gen_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    echo "prepare corpus: $big_bytes bytes of shuffled lines of the corpus (made in $gen_s s)" >&2

    rows=()
    prepare_row() { # LABEL OUTDIR ARGS...
        local label=$1 out=$2
        shift 2
        run_measured "$out.log" "$mha" prepare --text "$big" --out "$out" --quiet "$@"
        local toks
        toks=$(json_field "$out/meta.json" num_tokens)
        rows+=("$(printf '| %s | %.1f | %.1f | %.1f | %.2f | %d |' "$label" \
            "$(awk -v b="$big_bytes" 'BEGIN { print b / 1e6 }')" \
            "$(awk -v t="$toks" 'BEGIN { print t / 1e6 }')" "$WALL" \
            "$(awk -v b="$big_bytes" -v s="$WALL" 'BEGIN { print b / 1e6 / s }')" \
            "$((RSS_KB / 1024))")")
        echo "$label: $(tail -n 1 "$out.log")" >&2
        rm -rf "$out"
    }
    prepare_row "encode (--tokenizer of the corpus, $vocab_size ids)" "$work/prep_enc" \
        --tokenizer "$data/tokenizer.json"
    if [[ $do_bpe != 0 ]]; then
        prepare_row "train a BPE (--vocab-size $vocab, 8 MB sample) + encode" "$work/prep_bpe" \
            --vocab-size "$vocab"
    fi
    rm -f "$big"
    echo
    echo "mha prepare throughput ($threads threads)"
    echo
    echo "| run | text MB | tokens (M) | wall s | MB/s | peak RSS MiB |"
    echo "|---|--:|--:|--:|--:|--:|"
    printf '%s\n' "${rows[@]}"
    echo
    echo "MB = 10^6 bytes; wall: the whole mha prepare process; MB/s = text MB / wall s."
fi
