#!/usr/bin/env python3
"""Tiny Llama-family checkpoints saved by transformers, with what transformers computes on them.

`llama_text/` (see `text_fixture`) adds a tokenizer and transformers' greedy text.

For each other case `tests/fixtures/llama/<case>/` holds what `save_pretrained` wrote (config.json,
generation_config.json, model.safetensors or shards with model.safetensors.index.json), random
weights of every parameter, and `expected.safetensors`:
- `input_ids (2, 12)` and `logits (2, 12, V)` in f32 (eval mode);
- `prompt (1, 5)`, `greedy` = `generate(do_sample=False, max_new_tokens=10)` with the cache
  and `greedy_nocache` without it (both new tokens only);
- `loss` = `model(input_ids, labels=input_ids).loss`, `grad.<name>` of every parameter, and
  after one `torch.optim.AdamW(lr=1e-2, weight_decay=0.1)` step, `step.<name>`.

    python3 -m venv VENV && VENV/bin/pip install torch numpy safetensors transformers
    VENV/bin/python scripts/make_llama_fixtures.py [--out tests/fixtures/llama]
"""

import argparse
import os
import shutil
import zlib

import torch
from safetensors.torch import save_file
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

V = 96


def cases():
    common = dict(vocab_size=V, num_hidden_layers=2, max_position_embeddings=128,
                  rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)
    yield "llama_gqa1", LlamaForCausalLM, LlamaConfig(
        hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=4,
        tie_word_embeddings=False, **common), {}
    yield "llama_gqa3_tied", LlamaForCausalLM, LlamaConfig(
        hidden_size=48, intermediate_size=64, num_attention_heads=6, num_key_value_heads=2,
        tie_word_embeddings=True, **common), {}
    yield "llama_gqa7_llama3", LlamaForCausalLM, LlamaConfig(
        hidden_size=56, intermediate_size=80, num_attention_heads=7, num_key_value_heads=1,
        tie_word_embeddings=False,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=16), **common), {}
    yield "llama_head_dim_linear", LlamaForCausalLM, LlamaConfig(
        hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0), **common), {}
    yield "llama_sharded_bf16", LlamaForCausalLM, LlamaConfig(
        hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
        tie_word_embeddings=False, **common), dict(dtype=torch.bfloat16, shard="12KB")
    yield "qwen2", Qwen2ForCausalLM, Qwen2Config(
        hidden_size=48, intermediate_size=64, num_attention_heads=6, num_key_value_heads=2,
        tie_word_embeddings=True, **common), {}
    yield "mistral", MistralForCausalLM, MistralConfig(
        hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
        sliding_window=4096, tie_word_embeddings=False, **common), {}


def randomize(model, name):
    torch.manual_seed(zlib.crc32(name.encode()))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))


def main(out):
    for name, cls, cfg, opts in cases():
        d = os.path.join(out, name)
        shutil.rmtree(d, ignore_errors=True)
        cfg._attn_implementation = "sdpa"
        model = cls(cfg).eval()
        randomize(model, name)
        dtype = opts.get("dtype", torch.float32)
        if dtype != torch.float32:
            model = model.to(dtype)
        kw = {"max_shard_size": opts["shard"]} if "shard" in opts else {}
        model.save_pretrained(d, **kw)
        # What transformers computes on the directory, loaded in f32 as a user would.
        model = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="sdpa").eval()
        torch.manual_seed(zlib.crc32(("inputs" + name).encode()))
        ids = torch.randint(3, V, (2, 12))
        with torch.no_grad():
            logits = model(ids).logits
        prompt = ids[:1, :5]
        with torch.no_grad():
            g1 = model.generate(prompt, do_sample=False, max_new_tokens=10, use_cache=True)
            g2 = model.generate(prompt, do_sample=False, max_new_tokens=10, use_cache=False)
        model.train()
        out_ = model(ids, labels=ids)
        out_.loss.backward()
        t = {"input_ids": ids.to(torch.int64), "logits": logits, "prompt": prompt,
             "greedy": g1[:, 5:], "greedy_nocache": g2[:, 5:], "loss": out_.loss.detach()}
        tied = cfg.tie_word_embeddings
        for n, p in model.named_parameters():
            t["grad." + n] = p.grad
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        opt.step()
        for n, p in model.named_parameters():
            t["step." + n] = p.detach()
        t = {k: v.detach().contiguous().clone() for k, v in t.items()}
        save_file(t, os.path.join(d, "expected.safetensors"),
                  metadata={"torch": torch.__version__, "tied": str(tied).lower()})
        print(name, sorted(os.listdir(d)), float(out_.loss))




def text_fixture(out, text_path, name="llama_text", cls=LlamaForCausalLM, config_cls=LlamaConfig):
    """`<name>/`: a byte-level BPE tokenizer (as SmolLM2's and Qwen's) trained on a license
    text, a model of `cls` over its ids, and transformers' greedy text for a prompt;
    `generation_config.json` lists two end ids, one of which greedy decoding reaches."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    d = os.path.join(out, name)
    shutil.rmtree(d, ignore_errors=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([text_path], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    v = tok.get_vocab_size()
    cfg = config_cls(vocab_size=v, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=True, bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "sdpa"
    model = cls(cfg).eval()
    randomize(model, name)
    prompt = "This License applies to"
    ids = fast(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        free = model.generate(ids, do_sample=False, max_new_tokens=16, eos_token_id=None)
    # The end ids: a token greedy decoding reaches at its fifth step, and one it never makes.
    stop = int(free[0, ids.shape[1] + 4])
    never = next(i for i in range(v) if i not in free[0].tolist())
    model.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=[never, stop])
    model.save_pretrained(d)
    fast.save_pretrained(d)
    model = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="sdpa")
    with torch.no_grad():
        out_ids = model.generate(ids, do_sample=False, max_new_tokens=16)
    new = out_ids[0, ids.shape[1]:]
    with open(os.path.join(d, "expected.json"), "w") as f:
        import json
        json.dump({"prompt": prompt, "prompt_ids": ids[0].tolist(), "new_ids": new.tolist(),
                   "continuation": fast.decode(new), "eos_token_id": [never, stop],
                   "torch": torch.__version__}, f, indent=1)
    print(name, sorted(os.listdir(d)), fast.decode(new))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/llama")
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3",
                    help="the text the tokenizer of llama_text is trained on")
    a = ap.parse_args()
    main(a.out)
    text_fixture(a.out, a.text)
    text_fixture(a.out, a.text, "qwen2_text", Qwen2ForCausalLM, Qwen2Config)
