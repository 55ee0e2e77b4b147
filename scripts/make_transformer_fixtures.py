#!/usr/bin/env python3
"""Golden fixtures for candle-mha's Transformer layers from PyTorch's nn.TransformerEncoderLayer,
nn.TransformerEncoder, nn.TransformerDecoderLayer, nn.TransformerDecoder and nn.Transformer.

Rerun (CPU only; torch, numpy and safetensors in a venv):

    .venv-torch/bin/python scripts/make_transformer_fixtures.py [--out tests/fixtures/transformer]

For each case: build the module small (d_model 8, 2 heads, feed-forward 16), overwrite every
parameter with random values (layer-norm weights 1 + 0.3·randn, all else 0.5·randn), wrap it
in a model under the prefix `model.` (so the state_dict keys are `model.<PyTorch name>`), run
it in eval() mode (dropout off) with grad enabled -- so PyTorch's slow path runs -- and
backpropagate `(out * R).sum()`. Cases with `fast_path` also run the same module under
torch.inference_mode(), PyTorch's fast path (nested tensors); it zeroes the output at padded
positions (before the final norm, so they hold the norm's bias), which is checked here.

File format (one `<case>.safetensors` per case; metadata values are strings):
- metadata: kind (encoder_layer | encoder | decoder_layer | decoder | transformer), d_model,
  nhead, dim_feedforward, num_layers (num_encoder_layers / num_decoder_layers for transformer),
  final_norm, activation (relu | gelu), layer_norm_eps, batch_first, norm_first, bias,
  is_causal / tgt_is_causal / memory_is_causal, fast_path, dtype (f32 | f64), torch_version,
  description.
- tensors: `param.model.<name>` the state_dict; inputs `src` (encoder, transformer), `tgt`,
  `memory` (decoder); masks by PyTorch's argument names (`mask`, `src_key_padding_mask`,
  `tgt_mask`, `memory_mask`, `tgt_key_padding_mask`, `memory_key_padding_mask`, `src_mask`),
  bool masks as uint8 (1 = True = masked), float masks additive (may hold -inf); `out`; `R`;
  `grad.<input>` and `grad.param.model.<name>` the gradients of `(out * R).sum()`;
  `out_fast` (fast_path cases) the fast path's output.

Reruns with the same torch version give byte-identical files: each case seeds
torch.manual_seed(crc32(name)), one thread, and the metadata keys are sorted.
"""

import argparse
import json
import os
import struct
import zlib

import torch
import torch.nn as nn
from safetensors.torch import save_file

D, H, FF = 8, 2, 16
DTYPES = {"f32": torch.float32, "f64": torch.float64}


def b(x):
    return "true" if x else "false"


def randomize(module):
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.split(".")[-2].startswith("norm") and name.endswith("weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            else:
                p.copy_(0.5 * torch.randn_like(p))


def layer_kwargs(c):
    return dict(
        dim_feedforward=FF,
        dropout=0.1,
        activation=c["activation"],
        batch_first=c["batch_first"],
        norm_first=c["norm_first"],
        bias=c["bias"],
    )


def build(c):
    kind = c["kind"]
    kw = layer_kwargs(c)
    final_norm = c.get("final_norm", True)
    norm = nn.LayerNorm(D, bias=c["bias"]) if final_norm else None
    if kind == "encoder_layer":
        return nn.TransformerEncoderLayer(D, H, **kw)
    if kind == "encoder":
        layer = nn.TransformerEncoderLayer(D, H, **kw)
        # Nested tensors (the fast path's padding removal) only where the case asks for them.
        nested = bool(c.get("fast_path"))
        return nn.TransformerEncoder(layer, c["num_layers"], norm=norm, enable_nested_tensor=nested)
    if kind == "decoder_layer":
        return nn.TransformerDecoderLayer(D, H, **kw)
    if kind == "decoder":
        layer = nn.TransformerDecoderLayer(D, H, **kw)
        return nn.TransformerDecoder(layer, c["num_layers"], norm=norm)
    if kind == "transformer":
        return nn.Transformer(D, H, c["num_layers"], c["num_layers"], **kw)
    raise ValueError(kind)


def seq(c, length, batch=2):
    """A random input of `length` in the case's layout."""
    if c.get("unbatched"):
        return torch.randn(length, D)
    if c["batch_first"]:
        return torch.randn(batch, length, D)
    return torch.randn(length, batch, D)


def make_mask(spec, length_q, length_k, c, batch=2):
    kind = spec
    if kind == "bool2d":
        m = torch.rand(length_q, length_k) < 0.3
        m[:, 0] = False  # no fully masked row
        return m
    if kind == "float2d":
        return torch.randn(length_q, length_k)
    if kind == "float3d":
        return torch.randn(batch * H, length_q, length_k)
    if kind == "causal":
        assert length_q == length_k
        return nn.Transformer.generate_square_subsequent_mask(length_q)
    if kind == "causal_bool":
        return torch.triu(torch.ones(length_q, length_q, dtype=torch.bool), 1)
    raise ValueError(kind)


def make_kpm(length, c, batch=2):
    """Right padding (left-aligned, as the fast path needs): batch element 1 loses its last 2."""
    if c.get("unbatched"):
        m = torch.zeros(length, dtype=torch.bool)
        m[-1] = True
        return m
    m = torch.zeros(batch, length, dtype=torch.bool)
    m[1, -2:] = True
    return m


def case(name, **c):
    c.setdefault("activation", "relu")
    c.setdefault("batch_first", False)
    c.setdefault("norm_first", False)
    c.setdefault("bias", True)
    c.setdefault("dtype", "f32")
    c["name"] = name
    return c


CASES = [
    # Encoder layers.
    case("enc_layer_post_relu_masks_bool", kind="encoder_layer", mask="bool2d", kpm=True),
    case("enc_layer_pre_gelu_batch_first_float3d", kind="encoder_layer", activation="gelu",
         norm_first=True, batch_first=True, mask="float3d"),
    case("enc_layer_unbatched_f64", kind="encoder_layer", kpm=True, dtype="f64", unbatched=True),
    case("enc_layer_no_bias_pre", kind="encoder_layer", bias=False, norm_first=True, mask="float2d"),
    case("enc_layer_causal_f64", kind="encoder_layer", mask="causal", is_causal=True, dtype="f64"),
    # Encoder stacks.
    case("encoder_post_kpm", kind="encoder", num_layers=2, kpm=True),
    case("encoder_post_kpm_f64", kind="encoder", num_layers=2, kpm=True, dtype="f64"),
    case("encoder_post_gelu_batch_first_fast", kind="encoder", num_layers=2, activation="gelu",
         norm_first=False, batch_first=True, kpm=True, fast_path=True),
    case("encoder_no_final_norm_causal_bool", kind="encoder", num_layers=2, final_norm=False,
         norm_first=True, mask="causal_bool", is_causal=True),
    # Decoder layers.
    case("dec_layer_post_relu_masks", kind="decoder_layer", tgt_mask="bool2d",
         memory_mask="float2d", memory_kpm=True),
    case("dec_layer_pre_gelu_batch_first_causal_f64", kind="decoder_layer", activation="gelu",
         norm_first=True, batch_first=True, tgt_mask="causal", tgt_is_causal=True, tgt_kpm=True,
         memory_mask="float3d", dtype="f64"),
    case("dec_layer_no_bias_unbatched", kind="decoder_layer", bias=False, unbatched=True,
         memory_kpm=True),
    case("dec_layer_memory_causal", kind="decoder_layer", memory_len=4, memory_mask="causal",
         memory_is_causal=True, tgt_mask="float2d"),
    # Decoder stacks.
    case("decoder_post_causal", kind="decoder", num_layers=2, tgt_mask="causal",
         tgt_is_causal=True, memory_kpm=True),
    case("decoder_pre_gelu_f64", kind="decoder", num_layers=2, activation="gelu", norm_first=True,
         batch_first=True, tgt_kpm=True, dtype="f64"),
    # nn.Transformer.
    case("transformer_post", kind="transformer", num_layers=2, src_kpm=True, tgt_mask="causal",
         tgt_is_causal=True, memory_kpm=True),
    case("transformer_pre_gelu_batch_first_f64", kind="transformer", num_layers=1,
         activation="gelu", norm_first=True, batch_first=True, src_mask="bool2d",
         tgt_mask="causal", tgt_is_causal=True, dtype="f64"),
]


def run_case(c):
    torch.manual_seed(zlib.crc32(c["name"].encode()))
    dtype = DTYPES[c["dtype"]]
    torch.set_default_dtype(dtype)
    model = build(c)
    randomize(model)
    model.eval()
    wrapper = nn.Module()
    wrapper.model = model
    kind = c["kind"]
    S, T = c.get("memory_len", 5), 4
    tensors, inputs, kwargs = {}, {}, {}

    def add_mask(arg, m):
        kwargs[arg] = m
        tensors[arg] = m.to(torch.uint8) if m.dtype == torch.bool else m

    if kind in ("encoder_layer", "encoder"):
        inputs["src"] = seq(c, S)
        if c.get("mask"):
            add_mask("src_mask" if kind == "encoder_layer" else "mask", make_mask(c["mask"], S, S, c))
        if c.get("kpm"):
            add_mask("src_key_padding_mask", make_kpm(S, c))
        if c.get("is_causal"):
            kwargs["is_causal"] = True
    elif kind in ("decoder_layer", "decoder"):
        inputs["tgt"] = seq(c, T)
        inputs["memory"] = seq(c, S)
    else:
        inputs["src"] = seq(c, S)
        inputs["tgt"] = seq(c, T)
        if c.get("src_mask"):
            add_mask("src_mask", make_mask(c["src_mask"], S, S, c))
        if c.get("src_kpm"):
            add_mask("src_key_padding_mask", make_kpm(S, c))
    if kind in ("decoder_layer", "decoder", "transformer"):
        if c.get("tgt_mask"):
            add_mask("tgt_mask", make_mask(c["tgt_mask"], T, T, c))
        if c.get("memory_mask"):
            add_mask("memory_mask", make_mask(c["memory_mask"], T, S, c))
        if c.get("tgt_kpm"):
            add_mask("tgt_key_padding_mask", make_kpm(T, c))
        if c.get("memory_kpm"):
            add_mask("memory_key_padding_mask", make_kpm(S, c))
        if c.get("tgt_is_causal"):
            kwargs["tgt_is_causal"] = True
        if c.get("memory_is_causal"):
            kwargs["memory_is_causal"] = True
    # Gradients of the inputs too (and grad mode keeps PyTorch on its slow path).
    for v in inputs.values():
        v.requires_grad_(True)
    args = list(inputs.values())
    out = model(*args, **kwargs)
    R = torch.randn_like(out)
    (out * R).sum().backward()
    for k, v in inputs.items():
        tensors[k] = v.detach()
        tensors[f"grad.{k}"] = v.grad
    for n, p in wrapper.named_parameters():
        tensors[f"param.{n}"] = p.detach()
        tensors[f"grad.param.{n}"] = p.grad
    tensors["out"] = out.detach()
    tensors["R"] = R
    if c.get("fast_path"):
        with torch.inference_mode():
            fast = model(*[a.detach() for a in args], **kwargs)
        kpm = kwargs["src_key_padding_mask"]
        # The fast path ran: its padded positions are zeros put through the final norm,
        # i.e. the norm's bias (nested tensors padded back with 0).
        assert bool((fast[kpm] == model.norm.bias.detach()).all()), "fast path not taken"
        keep = (~kpm).unsqueeze(-1).to(dtype)
        diff = ((fast - out.detach()) * keep).abs().max().item()
        assert diff < 1e-5, diff
        tensors["out_fast"] = fast.clone()
    meta = {
        "kind": kind,
        "d_model": str(D),
        "nhead": str(H),
        "dim_feedforward": str(FF),
        "num_layers": str(c.get("num_layers", 1)),
        "final_norm": b(c.get("final_norm", True)),
        "activation": c["activation"],
        "layer_norm_eps": "1e-05",
        "batch_first": b(c["batch_first"]),
        "norm_first": b(c["norm_first"]),
        "bias": b(c["bias"]),
        "is_causal": b(c.get("is_causal", False)),
        "tgt_is_causal": b(c.get("tgt_is_causal", False)),
        "memory_is_causal": b(c.get("memory_is_causal", False)),
        "fast_path": b(c.get("fast_path", False)),
        "unbatched": b(c.get("unbatched", False)),
        "dtype": c["dtype"],
        "torch_version": torch.__version__,
        "description": c["name"].replace("_", " "),
    }
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    return tensors, dict(sorted(meta.items()))


def canonicalize_header(path):
    """Sort the __metadata__ keys of the header (safetensors keeps them in a hash map, in a
    different order each run) so reruns are byte-identical; the header keeps its length."""
    with open(path, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
        new = json.dumps(header, separators=(",", ":")).encode()
        assert len(new) <= n, (path, len(new), n)
        f.seek(8)
        f.write(new + b" " * (n - len(new)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join("tests", "fixtures", "transformer"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)  # one summation order: reruns give the same bits
    for c in CASES:
        tensors, meta = run_case(c)
        path = os.path.join(args.out, c["name"] + ".safetensors")
        save_file(tensors, path, metadata=meta)
        canonicalize_header(path)
        print(path, os.path.getsize(path))
    torch.set_default_dtype(torch.float32)


if __name__ == "__main__":
    main()
