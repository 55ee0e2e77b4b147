"""The user's own files the guides' commands name, made small, for the guide test
(`crates/candle-mha-cli/tests/guide_blocks.rs`):

- `tests/fixtures/guides/gpt2-dir/`: a Hugging Face `GPT2LMHeadModel` directory as
  `save_pretrained` writes it, with a `tokenizer.json` (a byte-level BPE of 300 ids trained with
  `tokenizers` on the GPL's text, `<|endoftext|>` id 0); random weights, context 64, width 32,
  2 heads, 2 blocks.
- `tests/fixtures/guides/gpt2-adapter/`: a PEFT LoRA adapter (rank 4 on `c_attn`, `lora_B`
  drawn at random so that it changes the model) on `gpt2-dir`, as `save_pretrained` writes it.
- `tests/fixtures/guides/SmolLM2-135M/`: a `LlamaForCausalLM` of SmolLM2's kind (grouped-query
  attention, tied head) but small (width 32, 2 blocks, 4 query / 2 key-value heads, context
  512), with the byte-level BPE of `tests/fixtures/llama/llama_text`.
- `tests/fixtures/guides/shakespeare_char/`: nanoGPT's `data/shakespeare_char` as its
  `prepare.py` writes it (`train.bin`, `val.bin` as uint16, `meta.pkl`), for the vocabulary of
  `tests/fixtures/gpt2/nanogpt-own/meta.pkl`, on the GPL's text.

    python scripts/make_guide_fixtures.py   # torch, transformers, tokenizers
"""
import json
import os
import pickle
import shutil

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

ROOT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
TEXT = open(os.path.join(ROOT, "text", "gpl-3.0.txt"), encoding="utf-8").read()
OUT = os.path.join(ROOT, "guides")


def gpt2_dir():
    out = os.path.join(OUT, "gpt2-dir")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT], trainer)
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2,
                     n_head=2, bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(cfg).save_pretrained(out, safe_serialization=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    return GPT2LMHeadModel.from_pretrained(out)


def gpt2_adapter(base):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"],
                                            fan_in_fan_out=True, task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    out = os.path.join(OUT, "gpt2-adapter")
    model.save_pretrained(out)
    # The base as the guide names it, not this machine's path; no model card.
    path = os.path.join(out, "adapter_config.json")
    config = json.load(open(path))
    config["base_model_name_or_path"] = "gpt2-dir"
    json.dump(config, open(path, "w"), indent=2)
    os.remove(os.path.join(out, "README.md"))


def smollm2():
    out = os.path.join(OUT, "SmolLM2-135M")
    src = os.path.join(ROOT, "llama", "llama_text")
    vocab = Tokenizer.from_file(os.path.join(src, "tokenizer.json")).get_vocab_size()
    torch.manual_seed(2)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=0, eos_token_id=0)
    LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    for f in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(os.path.join(src, f), os.path.join(out, f))


def shakespeare_char():
    out = os.path.join(OUT, "shakespeare_char")
    os.makedirs(out, exist_ok=True)
    meta_path = os.path.join(ROOT, "gpt2", "nanogpt-own", "meta.pkl")
    stoi = pickle.load(open(meta_path, "rb"))["stoi"]
    ids = np.array([stoi[c] for c in TEXT if c in stoi], dtype=np.uint16)
    n = int(0.9 * len(ids))
    ids[:n].tofile(os.path.join(out, "train.bin"))
    ids[n:].tofile(os.path.join(out, "val.bin"))
    shutil.copy(meta_path, os.path.join(out, "meta.pkl"))


if __name__ == "__main__":
    shutil.rmtree(OUT, ignore_errors=True)
    gpt2_adapter(gpt2_dir())
    smollm2()
    shakespeare_char()
