#!/usr/bin/env bash
# A checkpoint written by nanoGPT's own code (not this project's), for `mha import`'s test:
# nanoGPT's `data/shakespeare_char/prepare.py` on the GPL text of tests/fixtures/text, then its
# `train.py` (config/train_shakespeare_char.py, a 1-block model of width 32, 300 iterations on
# the CPU), and the greedy continuation nanoGPT's `GPT.generate(top_k=1)` gives a prompt.
# Writes tests/fixtures/gpt2/nanogpt-own/{ckpt.pt, meta.pkl, greedy.txt}.
#
#   scripts/make_nanogpt_own_fixture.sh NANOGPT_CHECKOUT [PYTHON]
#
# PYTHON (default python3) needs torch, numpy and requests. Nothing of nanoGPT is committed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
nano=$(cd "${1:?give a checkout of github.com/karpathy/nanoGPT}" && pwd)
py=${2:-python3}
out="$root/tests/fixtures/gpt2/nanogpt-own"
mkdir -p "$out"
cp "$root/tests/fixtures/text/gpl-3.0.txt" "$nano/data/shakespeare_char/input.txt"
(cd "$nano/data/shakespeare_char" && "$py" prepare.py > /dev/null)
rm -rf "$nano/out-mha-fixture"
(cd "$nano" && "$py" train.py config/train_shakespeare_char.py --device=cpu --compile=False \
  --dtype=float32 --n_layer=1 --n_head=2 --n_embd=32 --block_size=32 --batch_size=12 \
  --max_iters=300 --lr_decay_iters=300 --eval_interval=100 --eval_iters=5 --log_interval=100 \
  --dropout=0.0 --always_save_checkpoint=True --out_dir=out-mha-fixture > /dev/null)
cp "$nano/out-mha-fixture/ckpt.pt" "$nano/data/shakespeare_char/meta.pkl" "$out/"
(cd "$nano" && "$py" - "$out" <<'PY'
import pickle, sys, torch
from model import GPT, GPTConfig
out = sys.argv[1]
ck = torch.load(f"{out}/ckpt.pt", map_location="cpu")
m = GPT(GPTConfig(**ck["model_args"]))
m.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ck["model"].items()})
m.eval()
meta = pickle.load(open(f"{out}/meta.pkl", "rb"))
prompt = "The licensee"
idx = torch.tensor([[meta["stoi"][c] for c in prompt]])
with torch.no_grad():
    ids = m.generate(idx, 80, temperature=1.0, top_k=1)[0].tolist()
open(f"{out}/greedy.txt", "w").write("".join(meta["itos"][i] for i in ids))
PY
)
ls -la "$out"
