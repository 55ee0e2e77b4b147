#!/usr/bin/env python3
"""LoRA fixtures from Hugging Face PEFT, on the tiny bases already committed
(`tests/fixtures/gpt2/hf`, a `GPT2LMHeadModel`; `tests/fixtures/llama/llama_gqa3_tied`, a
`LlamaForCausalLM` with grouped-query attention and a tied head).

For each case `tests/fixtures/lora/<case>/` holds PEFT's `save_pretrained` of the adapter
(`adapter_config.json`, `adapter_model.safetensors`) and `expected.safetensors`:
- `tokens` (2, 12) and the adapted model's eval `logits`;
- one training step on the adapter alone (AdamW lr 1e-2, betas (0.9, 0.95), eps 1e-8, weight
  decay 0.1 on every adapter matrix, `clip_grad_norm_` at 1.0): `step_loss`,
  `step_grad_norm`, and `grad.<PEFT file name>` (clipped) and `updated.<PEFT file name>` for
  each A and B;
- `merged.<Hugging Face name>`: each adapted weight after `merge_and_unload()`.

A and B are drawn from a seeded generator (B nonzero, so that the adapter changes the
outputs) and the dropout is 0 (PyTorch's dropout mask is not reproducible elsewhere).

Rerun (CPU only, a throwaway venv):

    python3 -m venv VENV && VENV/bin/pip install torch numpy safetensors transformers peft
    VENV/bin/python scripts/make_lora_fixtures.py [--fixtures tests/fixtures]
"""

import argparse
import os

import torch
from torch.nn import functional as F
from safetensors.torch import save_file

LR, BETAS, WD, EPS, CLIP = 1e-2, (0.9, 0.95), 0.1, 1e-8, 1.0

CASES = {
    # case: (base fixture, LoraConfig arguments)
    "gpt2": ("gpt2/hf", dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj", "c_fc"],
                             fan_in_fan_out=True)),
    "gpt2_rslora": ("gpt2/hf", dict(r=2, lora_alpha=4, target_modules=["c_attn"],
                                    fan_in_fan_out=True, use_rslora=True)),
    "llama": ("llama/llama_gqa3_tied", dict(
        r=4, lora_alpha=16,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                        "down_proj"])),
}


def plain(name):
    """A PEFT parameter's name as its saved file has it (without the adapter's name)."""
    return name.replace(".default.weight", ".weight")


def make(fixtures, case, base_dir, lora_args):
    from transformers import AutoModelForCausalLM
    from peft import LoraConfig, get_peft_model

    base = AutoModelForCausalLM.from_pretrained(os.path.join(fixtures, base_dir),
                                                dtype=torch.float32)
    cfg = LoraConfig(lora_dropout=0.0, bias="none", task_type="CAUSAL_LM", **lora_args)
    model = get_peft_model(base, cfg)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    out = os.path.join(fixtures, "lora", case)
    model.save_pretrained(out, safe_serialization=True)
    os.remove(os.path.join(out, "README.md"))  # PEFT's model card template
    vocab = base.config.vocab_size
    tokens = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(1))
    model.eval()
    with torch.no_grad():
        logits = model(tokens).logits
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert all("lora_" in n for n in trainable), list(trainable)
    opt = torch.optim.AdamW(list(trainable.values()), lr=LR, betas=BETAS, eps=EPS,
                            weight_decay=WD)
    model.train()
    opt.zero_grad(set_to_none=True)
    lg = model(tokens[:, :-1]).logits
    loss = F.cross_entropy(lg.reshape(-1, lg.size(-1)), tokens[:, 1:].reshape(-1))
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(list(trainable.values()), CLIP)
    grads = {f"grad.{plain(n)}": p.grad.detach().clone() for n, p in trainable.items()}
    opt.step()
    expected = {"tokens": tokens, "logits": logits, "step_loss": loss.detach().reshape(1),
                "step_grad_norm": norm.detach().reshape(1)}
    expected.update({f"updated.{plain(n)}": p.detach().clone() for n, p in trainable.items()})
    expected.update(grads)
    # The merge of the adapter as saved (before the step).
    from peft import PeftModel
    base = AutoModelForCausalLM.from_pretrained(os.path.join(fixtures, base_dir),
                                                dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, out).merge_and_unload()
    targets = tuple(lora_args["target_modules"])
    for n, t in merged.state_dict().items():
        module = n.rsplit(".", 1)[0]
        if n.endswith(".weight") and module.endswith(targets):
            expected[f"merged.{n}"] = t.detach().clone()
    save_file({k: v.contiguous() for k, v in expected.items()},
              os.path.join(out, "expected.safetensors"), metadata={"format": "pt"})
    print(f"{case}: {len(trainable)} adapter tensors, loss {loss.item():.5f}, "
          f"norm {norm.item():.5f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default="tests/fixtures")
    a = ap.parse_args()
    torch.manual_seed(0)
    for case, (base_dir, lora_args) in CASES.items():
        make(a.fixtures, case, base_dir, lora_args)


if __name__ == "__main__":
    main()
