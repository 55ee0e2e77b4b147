#!/usr/bin/env python3
"""Generate checkpoint fixtures for candle-mha's checkpoint loading / discovery tests.

PyTorch is the oracle. This script builds a few small PyTorch models that contain
`nn.MultiheadAttention` modules (an `nn.TransformerEncoder`, an `nn.Transformer`, a small
`nn.ModuleDict` with a kdim/vdim cross-attention, a bare MHA, a small module with buffers),
overwrites EVERY parameter with `randn_like(p) * 0.3` (so zero-initialised biases are
exercised too), switches them to `eval()`, and saves their `state_dict()`s as safetensors and
as `torch.save` .pt files in `tests/fixtures/checkpoints/` (also in the legacy format, and
whole pickled models), plus a .pt of views and dtypes with its contiguous expected copy.
Next to the checkpoints it writes `*_expected.safetensors` files holding inputs and the outputs / averaged attention weights of the MHA modules,
computed on CPU in eval mode with grad enabled (so the slow path,
F.multi_head_attention_forward, runs, never the inference fast path). The files are
described in tests/fixtures/checkpoints/README.md.

Rerun (CPU only, a throwaway venv is enough):

    python3 -m venv VENV && VENV/bin/pip install torch numpy safetensors
    VENV/bin/python scripts/make_checkpoint_fixtures.py [--out tests/fixtures/checkpoints]

Output is deterministic for a given torch version (except encoder_bf_legacy.pt, whose
storage keys are object ids): every model reseeds with
torch.manual_seed(crc32(model name)), safetensors metadata keys are sorted, and
torch.save's zip records carry fixed timestamps and a content-derived serialization id.
"""

import argparse
import os
import sys
import warnings
import zlib

import torch
import torch.nn as nn
from safetensors import safe_open
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import canonicalize_header  # noqa: E402

E_ENC, H_ENC, FF_ENC, LAYERS_ENC = 16, 4, 32, 2
L_ENC, N_ENC = 5, 3


def b(x):
    return "true" if x else "false"


def seed(name):
    torch.manual_seed(zlib.crc32(name.encode()))


def randomize(model):
    """Overwrite every parameter with randn_like * 0.3, then eval()."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    model.eval()
    return model


def plain_sd(model):
    """state_dict as detached, contiguous, independent tensors (safe for save_file)."""
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


class Writer:
    def __init__(self, out):
        self.out = out
        self.written = []

    def _done(self, name, what):
        path = os.path.join(self.out, name)
        self.written.append(name)
        print(f"wrote {path} ({what}, {os.path.getsize(path)} bytes)")

    def st(self, name, tensors, metadata):
        path = os.path.join(self.out, name)
        tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
        save_file(tensors, path, metadata=metadata)
        canonicalize_header(path)
        self._done(name, f"{len(tensors)} tensors")

    def pt(self, name, obj, what, legacy=False):
        path = os.path.join(self.out, name)
        if legacy:
            # The pre-1.6 stream format (still what `_use_new_zipfile_serialization=False`
            # writes).
            torch.save(obj, path, _use_new_zipfile_serialization=False)
        else:
            torch.save(obj, path)
        self._done(name, what)


# --------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------

def build_encoder(batch_first):
    layer = nn.TransformerEncoderLayer(d_model=E_ENC, nhead=H_ENC, dim_feedforward=FF_ENC,
                                       dropout=0.0, batch_first=batch_first)
    model = nn.TransformerEncoder(layer, num_layers=LAYERS_ENC, enable_nested_tensor=False)
    return randomize(model)


class Tagged(nn.Module):
    """A module with what a pickled model carries besides parameters: a submodule, an
    int32 and a bool persistent buffer, a non-persistent buffer and a `None` parameter.
    Its state_dict() holds attn.in_proj_weight, attn.out_proj.weight, steps and mask."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, bias=False)
        self.register_buffer("steps", torch.tensor([7, -3], dtype=torch.int32))
        self.register_buffer("mask", torch.tril(torch.ones(3, 3)).bool())
        self.register_buffer("scratch", torch.ones(2), persistent=False)
        self.register_parameter("unused", None)


def views_and_dtypes():
    """Tensors as torch.save stores views and dtypes: (readable, unreadable)."""
    base = torch.randn(6, 7)
    readable = {
        "rows": base[1:3],                      # storage offset
        "cols": base[:, ::2],                   # strided
        "transposed": base.t(),                 # column-major
        "expanded": base[2].expand(3, 7),       # stride 0
        "permuted": torch.randn(2, 3, 4).permute(2, 0, 1),
        "flat_slice": base.view(42)[5:9],       # shares base's storage
        "whole": base,
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 3),
        "f64": torch.randn(3, dtype=torch.float64),
        "f16": torch.randn(3).half(),
        "bf16": torch.randn(3).bfloat16(),
        "f8_e4m3": torch.randn(4).to(torch.float8_e4m3fn),
        "i64": torch.tensor([-(2 ** 40), 5]),
        "i32": torch.tensor([-7, 2 ** 30], dtype=torch.int32),
        "i16": torch.tensor([-300, 12], dtype=torch.int16),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "u32": torch.tensor([1, 2 ** 31 + 5], dtype=torch.uint32),
        "bool": torch.tensor([[True, False], [False, True]]),
    }
    unreadable = {
        "i8": torch.tensor([-1, 2], dtype=torch.int8),
        "c64": torch.randn(2, dtype=torch.complex64),
    }
    return readable, unreadable


def contiguous_expected(tensors):
    """What a reader must produce: contiguous copies, bool as uint8 (candle has no bool)."""
    return {k: (v.to(torch.uint8) if v.dtype == torch.bool else v).contiguous().clone()
            for k, v in tensors.items()}


def mha_forward(mha, q, k, v):
    """Slow-path forward: eval mode, grad enabled, params require grad; detached results."""
    assert torch.is_grad_enabled() and not mha.training
    assert any(p.requires_grad for p in mha.parameters())
    out, w = mha(q, k, v, need_weights=True, average_attn_weights=True)
    return out.detach().clone(), w.detach().clone()


def encoder_expected(model, x, batch_first):
    t = {"input": x.clone()}
    for i in range(LAYERS_ENC):
        attn = model.layers[i].self_attn
        out, w = mha_forward(attn, x, x, x)
        assert out.shape == x.shape
        N = x.shape[0] if batch_first else x.shape[1]
        assert w.shape == (N, L_ENC, L_ENC), w.shape
        assert torch.isfinite(out).all() and torch.isfinite(w).all()
        t[f"layers.{i}.self_attn.output"] = out
        t[f"layers.{i}.self_attn.weights"] = w
    return t


def encoder_forward_expected(model, x, meta, padding=None):
    """The whole encoder's output (slow path: eval, grad enabled), plus one with a key
    padding mask (bool (N, L), stored as uint8)."""
    assert torch.is_grad_enabled() and not model.training
    t = {"input": x.clone(), "output": model(x).detach().clone()}
    if padding is not None:
        t["src_key_padding_mask"] = padding.to(torch.uint8)
        t["output_padded"] = model(x, src_key_padding_mask=padding).detach().clone()
    for v in t.values():
        assert torch.isfinite(v.float()).all()
    return t, meta


def transformer_forward_expected(model, src, tgt):
    """nn.Transformer's output with and without a causal tgt_mask, and the encoder's memory."""
    assert torch.is_grad_enabled() and not model.training
    causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[0])
    return {
        "src": src.clone(),
        "tgt": tgt.clone(),
        "memory": model.encoder(src).detach().clone(),
        "output": model(src, tgt).detach().clone(),
        "tgt_mask": causal.clone(),
        "output_causal": model(src, tgt, tgt_mask=causal).detach().clone(),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--out", default=os.path.join(root_dir, "tests", "fixtures", "checkpoints"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}")
    w = Writer(args.out)
    enc_meta = lambda bf: {"num_heads": str(H_ENC), "batch_first": b(bf),  # noqa: E731
                           "embed_dim": str(E_ENC)}

    # ---- encoder, sequence-first
    seed("encoder_seq")
    enc_seq = build_encoder(batch_first=False)
    sd_seq = plain_sd(enc_seq)
    w.st("encoder_seq.safetensors", sd_seq, {"format": "pt"})
    w.pt("encoder_seq.pt", sd_seq, f"{len(sd_seq)} tensors")
    x_seq = torch.randn(L_ENC, N_ENC, E_ENC)
    w.st("encoder_seq_expected.safetensors", encoder_expected(enc_seq, x_seq, False),
         enc_meta(False))
    # The whole stack's output (a forward consumes no random numbers: dropout is 0).
    w.st("encoder_seq_forward_expected.safetensors",
         *encoder_forward_expected(enc_seq, x_seq, enc_meta(False)))

    # ---- encoder, batch_first
    seed("encoder_bf")
    enc_bf = build_encoder(batch_first=True)
    sd_bf = plain_sd(enc_bf)
    w.st("encoder_bf.safetensors", sd_bf, {"format": "pt"})
    w.pt("encoder_bf.pt", sd_bf, f"{len(sd_bf)} tensors")
    w.pt("encoder_bf_nested_state_dict.pt", {"state_dict": sd_bf, "epoch": 3},
         "{'state_dict': sd, 'epoch': 3}")
    w.pt("encoder_bf_nested_model.pt", {"model": sd_bf, "step": 10},
         "{'model': sd, 'step': 10}")
    w.pt("encoder_bf_legacy.pt", sd_bf, f"{len(sd_bf)} tensors, legacy format", legacy=True)
    w.pt("encoder_bf_module.pt", enc_bf, "the whole nn.TransformerEncoder: torch.save(model)")
    x_bf = torch.randn(N_ENC, L_ENC, E_ENC)
    exp_bf = encoder_expected(enc_bf, x_bf, True)
    pad_bf = torch.tensor([[False] * L_ENC, [False] * (L_ENC - 2) + [True] * 2,
                           [False] * (L_ENC - 1) + [True]])
    w.st("encoder_bf_forward_expected.safetensors",
         *encoder_forward_expected(enc_bf, x_bf, enc_meta(True), pad_bf))
    for dt_name, dt in (("f16", torch.float16), ("bf16", torch.bfloat16),
                        ("f64", torch.float64)):
        sd_dt = {k: v.to(dt) for k, v in sd_bf.items()}
        w.st(f"encoder_bf_{dt_name}.safetensors", sd_dt, {"format": "pt"})
        # f32 model holding the values rounded to dt
        seed(f"encoder_bf_{dt_name}")
        m = build_encoder(batch_first=True)
        m.load_state_dict({k: v.to(torch.float32) for k, v in sd_dt.items()}, strict=True)
        for i in range(LAYERS_ENC):
            out, _ = mha_forward(m.layers[i].self_attn, x_bf, x_bf, x_bf)
            exp_bf[f"{dt_name}.layers.{i}.self_attn.output"] = out
    w.st("encoder_bf_expected.safetensors", exp_bf, enc_meta(True))

    # ---- nn.Transformer (for attention-module discovery)
    seed("transformer")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
        tr = randomize(nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1,
                                      num_decoder_layers=1, dim_feedforward=16, dropout=0.0))
    w.st("transformer.safetensors", plain_sd(tr), {"format": "pt"})
    w.pt("transformer_module.pt", tr, "the whole nn.Transformer: torch.save(model)")
    w.st("transformer_forward_expected.safetensors",
         transformer_forward_expected(tr, torch.randn(4, 2, 8), torch.randn(3, 2, 8)),
         {"nhead": "2", "d_model": "8", "batch_first": "false"})

    # ---- cross-attention with kdim/vdim and add_bias_kv under a prefix
    seed("cross_kv")
    ck = randomize(nn.ModuleDict({
        "decoder": nn.ModuleDict({"cross_attn": nn.MultiheadAttention(
            8, 2, kdim=6, vdim=4, add_bias_kv=True)}),
        "head": nn.Linear(8, 3),
    }))
    sd_ck = plain_sd(ck)
    for k in ("q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias", "bias_k",
              "bias_v", "out_proj.weight", "out_proj.bias"):
        assert "decoder.cross_attn." + k in sd_ck, k
    w.st("cross_kv.safetensors", sd_ck, {"format": "pt"})
    q = torch.randn(3, 2, 8)
    k = torch.randn(4, 2, 6)
    v = torch.randn(4, 2, 4)
    out, wt = mha_forward(ck["decoder"]["cross_attn"], q, k, v)
    assert out.shape == (3, 2, 8) and wt.shape == (2, 3, 5), (out.shape, wt.shape)
    w.st("cross_kv_expected.safetensors",
         {"query": q, "key": k, "value": v, "output": out, "weights": wt},
         {"num_heads": "2"})

    # ---- a .pt with no tensors at all
    w.pt("no_tensors.pt", {"epoch": 3, "name": "run-1", "lr": 0.001}, "no tensors")

    # ---- a bare MHA state_dict (no prefix), bias=False
    seed("mha_bias_false")
    mb = randomize(nn.MultiheadAttention(8, 2, bias=False))
    sd_mb = plain_sd(mb)
    assert sorted(sd_mb) == ["in_proj_weight", "out_proj.weight"], sorted(sd_mb)
    w.pt("mha_bias_false.pt", sd_mb, f"{len(sd_mb)} tensors")

    # ---- views, shared storages and dtypes
    seed("views_dtypes")
    readable, unreadable = views_and_dtypes()
    w.pt("views_dtypes.pt", {**readable, **unreadable}, "views and dtypes")
    w.st("views_dtypes_expected.safetensors", contiguous_expected(readable), {"format": "pt"})

    # ---- an archive whose name (the file's stem) is 21 characters: its first central
    # directory record is exactly as long as PyTorch's zip64 records, which misled the zip
    # crate's search for the directory
    w.pt("ckpt_iter_000400_best.pt", {"w": torch.arange(6.0).reshape(2, 3)},
         "a 21-character archive name")

    # ---- a view far larger than its storage: one float expanded to 2**29 elements (2 GiB if
    # materialised, 1.5 KB on disk)
    w.pt("expanded_view.pt", {"x": torch.zeros(1).expand(2 ** 29)},
         "one float expanded to 2**29 elements")

    # ---- a pickled custom module with buffers
    seed("tagged_module")
    tagged = randomize(Tagged())
    w.pt("tagged_module.pt", tagged, "torch.save(Tagged())")
    w.st("tagged_module_expected.safetensors", contiguous_expected(tagged.state_dict()),
         {"format": "pt"})
    # The same state dict as safetensors with its bool buffer kept bool, plus an int8 tensor.
    w.st("tagged_module_bool_i8.safetensors",
         {**tagged.state_dict(), "q8": torch.tensor([-1, 2], dtype=torch.int8)},
         {"format": "pt"})

    # ---- a pre-norm GELU encoder without biases, with a final norm
    seed("encoder_nf_gelu")
    nf_layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=12, dropout=0.0,
                                          activation="gelu", norm_first=True, bias=False,
                                          batch_first=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
        nf = randomize(nn.TransformerEncoder(nf_layer, num_layers=2,
                                             norm=nn.LayerNorm(8, bias=False),
                                             enable_nested_tensor=False))
    w.st("encoder_nf_gelu.safetensors", plain_sd(nf), {"format": "pt"})
    w.st("encoder_nf_gelu_forward_expected.safetensors",
         *encoder_forward_expected(nf, torch.randn(2, 6, 8),
                                   {"nhead": "2", "d_model": "8", "batch_first": "true",
                                    "norm_first": "true", "activation": "gelu"}))

    verify(args.out, w.written, sd_seq, sd_bf)


def readable_names():
    return list(views_and_dtypes()[0])


def verify(out, written, sd_seq, sd_bf):
    """Reload every file with safetensors / torch.load(weights_only=True)."""
    def same(a, b_):
        assert sorted(a) == sorted(b_)
        for k in a:
            assert a[k].dtype == b_[k].dtype and torch.equal(a[k], b_[k]), k

    total = 0
    for name in written:
        path = os.path.join(out, name)
        total += os.path.getsize(path)
        if name.endswith(".safetensors"):
            t = load_file(path)
            with safe_open(path, "pt") as f:
                meta = f.metadata()
            if not name.endswith("_expected.safetensors"):
                assert meta == {"format": "pt"}, (name, meta)
            assert t, name
        elif name in ("encoder_bf_module.pt", "tagged_module.pt", "transformer_module.pt"):
            # Pickled modules: only a full unpickling (trusted file, classes importable).
            t = torch.load(path, weights_only=False).state_dict()
        else:
            t = torch.load(path, weights_only=True)
        if name == "encoder_seq.safetensors" or name == "encoder_seq.pt":
            same(t, sd_seq)
        elif name in ("encoder_bf.safetensors", "encoder_bf.pt", "encoder_bf_legacy.pt",
                      "encoder_bf_module.pt"):
            same(t, sd_bf)
        elif name == "views_dtypes.pt":
            assert sorted(t) == sorted([*readable_names(), "i8", "c64"]), sorted(t)
        elif name == "tagged_module.pt":
            assert sorted(t) == ["attn.in_proj_weight", "attn.out_proj.weight", "mask",
                                 "steps"], sorted(t)
        elif name == "encoder_bf_nested_state_dict.pt":
            assert t["epoch"] == 3
            same(t["state_dict"], sd_bf)
        elif name == "encoder_bf_nested_model.pt":
            assert t["step"] == 10
            same(t["model"], sd_bf)
        elif name == "no_tensors.pt":
            assert t == {"epoch": 3, "name": "run-1", "lr": 0.001}
    assert total < 1_500_000, total
    print(f"verified {len(written)} files reload ({total} bytes in all)")


if __name__ == "__main__":
    main()
