#!/usr/bin/env python3
"""GPT-2-family fixtures for candle-mha's import of the next-token predictors people already
have: tiny random models in the two formats they come in, with PyTorch's numbers.

1. `tests/fixtures/gpt2/hf/`: a Hugging Face `GPT2LMHeadModel` (GELU tanh, biases, tied head,
   `Conv1D` weights stored (in, out)) written by `save_pretrained` (`config.json`,
   `model.safetensors`); `hf_expected.safetensors`: tokens, eval logits, the greedy
   continuation of `generate(do_sample=False)`, and one training step with nanoGPT's AdamW
   groups (decay on the >= 2-D tensors), betas, clipping: its loss, gradient norm and the
   updated parameters (Hugging Face names). `hf-untied/` and `hf-untied_expected.safetensors`:
   the same with `tie_word_embeddings=False` (`lm_head.weight` a parameter of its own, no bias).
   `slow-tokenizer/`: a GPT-2 byte-level BPE (500 ids, trained on the GPL's text) as the slow
   tokenizer's files (`vocab.json`, `merges.txt`, `added_tokens.json`), and `expected.json`:
   a text and the ids transformers' `GPT2Tokenizer.from_pretrained` of the directory gives it.
2. `tests/fixtures/gpt2/nanogpt/ckpt.pt`: a checkpoint in the format nanoGPT's `train.py` saves
   (`model`, `model_args`, `optimizer`, `iter_num`, `best_val_loss`, `config`), of nanoGPT's
   model with `bias=False` (exact GELU, LayerNorms without bias, tied head) after two
   training steps, its state_dict keys prefixed `_orig_mod.` as `torch.compile` leaves them,
   and `meta.pkl` (a character vocabulary, nanoGPT's `shakespeare_char` format), and a data
   directory `nanogpt/data/` as nanoGPT's `prepare.py` writes one (`train.bin`, `val.bin`,
   uint16 ids, and `meta.pkl`);
   `nanogpt_expected.safetensors`: tokens, eval logits, and the third training step (resumed
   from the checkpoint's optimizer state): loss and updated parameters (nanoGPT names).

`GPT` below is nanoGPT's `model.py` model (the same module tree and names, the same forward),
written out here so that the fixtures need only torch and transformers.

Rerun (CPU only, a throwaway venv):

    python3 -m venv VENV && VENV/bin/pip install torch numpy safetensors transformers
    VENV/bin/python scripts/make_gpt2_fixtures.py [--out tests/fixtures/gpt2]
"""

import argparse
import collections
import math
import os
import pickle

import torch
import torch.nn as nn
from torch.nn import functional as F
from safetensors.torch import save_file

LR, BETAS, WD, EPS, CLIP = 1e-2, (0.9, 0.95), 0.1, 1e-8, 1.0


def randomize(model, std):
    """Every parameter N(0, std) (LayerNorm weights around 1), so biases and norms matter."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * std
            p.copy_(1.0 + noise if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight"))
                    else noise)
    return model


def optimizer(model):
    """nanoGPT's `configure_optimizers`: AdamW, decay on the >= 2-D tensors only."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    groups = [
        {"params": [p for p in params.values() if p.dim() >= 2], "weight_decay": WD},
        {"params": [p for p in params.values() if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS)


def train_step(model, opt, logits_of, tokens):
    """One step on `tokens` (N, L): inputs [:, :-1], targets [:, 1:]; returns loss, norm."""
    opt.zero_grad(set_to_none=True)
    logits = logits_of(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    opt.step()
    return loss.detach(), norm.detach()


# ------------------------------------------------------------------------------------------
# nanoGPT's model (model.py), module for module


class LayerNorm(nn.Module):
    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = nn.Linear(c["n_embd"], 3 * c["n_embd"], bias=c["bias"])
        self.c_proj = nn.Linear(c["n_embd"], c["n_embd"], bias=c["bias"])
        self.n_head, self.n_embd = c["n_head"], c["n_embd"]

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c["n_embd"], 4 * c["n_embd"], bias=c["bias"])
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * c["n_embd"], c["n_embd"], bias=c["bias"])

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = LayerNorm(c["n_embd"], bias=c["bias"])
        self.attn = CausalSelfAttention(c)
        self.ln_2 = LayerNorm(c["n_embd"], bias=c["bias"])
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c["vocab_size"], c["n_embd"]),
            wpe=nn.Embedding(c["block_size"], c["n_embd"]),
            drop=nn.Dropout(c["dropout"]),
            h=nn.ModuleList([Block(c) for _ in range(c["n_layer"])]),
            ln_f=LayerNorm(c["n_embd"], bias=c["bias"]),
        ))
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx):
        pos = torch.arange(0, idx.size(1), dtype=torch.long)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


# ------------------------------------------------------------------------------------------


def hugging_face(out, name="hf", tie=True):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=61, n_positions=24, n_embd=24, n_layer=2, n_head=3,
                     activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, tie_word_embeddings=tie)
    model = randomize(GPT2LMHeadModel(cfg), 0.2).eval()
    hf = os.path.join(out, name)
    model.save_pretrained(hf, safe_serialization=True)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.vocab_size, (2, 12), generator=g)
    with torch.no_grad():
        logits = model(tokens).logits
        prompt = tokens[:1, :4]
        greedy = model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                max_new_tokens=10, do_sample=False, pad_token_id=0)
    model.train()
    opt = optimizer(model)
    loss, norm = train_step(model, opt, lambda x: model(x).logits, tokens)
    expected = {"tokens": tokens, "logits": logits, "greedy": greedy,
                "step_loss": loss.reshape(1), "step_grad_norm": norm.reshape(1)}
    expected.update({f"updated.{n}": p.detach().clone()
                     for n, p in model.named_parameters()})
    save_file({k: v.contiguous() for k, v in expected.items()},
              os.path.join(out, f"{name}_expected.safetensors"), metadata={"format": "pt"})


def slow_tokenizer(out):
    import json
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Tokenizer

    d = os.path.join(out, "slow-tokenizer")
    os.makedirs(d, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    with open("/usr/share/common-licenses/GPL-3") as f:
        corpus = f.read()
    bpe.train_from_iterator([corpus], trainers.BpeTrainer(
        vocab_size=500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"]))
    bpe.model.save(d)  # vocab.json, merges.txt
    with open(os.path.join(d, "added_tokens.json"), "w") as f:
        json.dump({"<|sep|>": 500}, f)
    # As a user's directory without tokenizer.json is read: transformers converts the files.
    tok = GPT2Tokenizer.from_pretrained(d)
    text = ("Licensed under the Apache License, Version 2.0 (the \"License\");\n"
            "  you may not use this file except in compliance with the License.<|endoftext|>"
            "naïve café — 日本語 <|sep|> tabs\tand   spaces\n\n")
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump({"text": text, "ids": ids}, f, ensure_ascii=False)


def nano_gpt(out):
    torch.manual_seed(0)
    chars = sorted(set("First Citizen: we are accounted poor citizens\n"))
    args = dict(n_layer=2, n_head=2, n_embd=16, block_size=16, bias=False,
                vocab_size=len(chars), dropout=0.0)
    model = randomize(GPT(args), 0.2)
    opt = optimizer(model)
    g = torch.Generator().manual_seed(2)
    batches = [torch.randint(0, args["vocab_size"], (3, 9), generator=g) for _ in range(3)]
    for b in batches[:2]:
        train_step(model, opt, model, b)
    d = os.path.join(out, "nanogpt")
    os.makedirs(d, exist_ok=True)
    # As train.py saves it, from a torch.compile'd model (its keys prefixed `_orig_mod.`).
    # An OrderedDict with state_dict()'s `_metadata` (module versions), as train.py saves it.
    own = model.state_dict()
    sd = collections.OrderedDict((f"_orig_mod.{k}", v) for k, v in own.items())
    sd._metadata = own._metadata
    checkpoint = {
        "model": sd,
        "optimizer": opt.state_dict(),
        "model_args": args,
        "iter_num": 2,
        "best_val_loss": torch.tensor(3.25),
        "config": {"learning_rate": LR, "beta1": BETAS[0], "beta2": BETAS[1],
                   "weight_decay": WD, "grad_clip": CLIP, "batch_size": 3,
                   "block_size": args["block_size"], "dataset": "shakespeare_char"},
    }
    torch.save(checkpoint, os.path.join(d, "ckpt.pt"))
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)),
            "stoi": {c: i for i, c in enumerate(chars)}}
    with open(os.path.join(d, "meta.pkl"), "wb") as f:
        pickle.dump(meta, f)
    nano_gpt_data(os.path.join(d, "data"), chars, meta)
    model.eval()
    with torch.no_grad():
        logits = model(batches[2][:, :-1])
    model.train()
    loss, norm = train_step(model, opt, model, batches[2])
    expected = {"tokens": batches[2], "logits": logits, "step_loss": loss.reshape(1),
                "step_grad_norm": norm.reshape(1)}
    expected.update({f"updated.{n}": p.detach().clone()
                     for n, p in model.named_parameters()})
    save_file({k: v.contiguous() for k, v in expected.items()},
              os.path.join(out, "nanogpt_expected.safetensors"), metadata={"format": "pt"})


def nano_gpt_data(d, chars, meta):
    """A data directory as nanoGPT's `data/shakespeare_char/prepare.py` writes it: the text's
    ids as uint16 in `train.bin` (the first 90%) and `val.bin`, and `meta.pkl`."""
    import numpy as np
    os.makedirs(d, exist_ok=True)
    text = "First Citizen: we are accounted poor citizens\n" * 40
    ids = [meta["stoi"][c] for c in text]
    n = int(len(ids) * 0.9)
    np.array(ids[:n], dtype=np.uint16).tofile(os.path.join(d, "train.bin"))
    np.array(ids[n:], dtype=np.uint16).tofile(os.path.join(d, "val.bin"))
    with open(os.path.join(d, "meta.pkl"), "wb") as f:
        pickle.dump(meta, f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--out", default=os.path.join(root, "tests", "fixtures", "gpt2"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    hugging_face(args.out)
    hugging_face(args.out, "hf-untied", tie=False)
    slow_tokenizer(args.out)
    nano_gpt(args.out)
    for dirpath, _, files in sorted(os.walk(args.out)):
        for f in sorted(files):
            p = os.path.join(dirpath, f)
            print(f"wrote {p} ({os.path.getsize(p)} bytes)")


if __name__ == "__main__":
    main()
