//! Invalid calls return an `Err` (never panic, never `Ok`) whose message names the argument,
//! what was received and what was expected.
//!
//! One table, run in full: every case that does not fail as expected is listed in a single
//! report at the end. PyTorch's messages (spec §7) are used where PyTorch has one.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use candle_mha::candle::{self, DType, Device, ModuleT, Tensor};
use candle_mha::{
    seeded_var_builder, AttentionOptions, MultiheadAttention, MultiheadAttentionConfig,
};
use candle_nn::{VarBuilder, VarMap};

/// Embedding size, heads, target length, source length and batch of the default calls.
const E: usize = 8;
const H: usize = 2;
const L: usize = 3;
const S: usize = 4;
const N: usize = 2;

struct Case {
    name: &'static str,
    /// Builds what it needs and makes one invalid call; setup must not fail.
    run: fn() -> candle::Result<()>,
    /// Substrings the error message must contain.
    expect: &'static [&'static str],
}

fn dev() -> Device {
    Device::Cpu
}

/// A fresh seeded module in f32 on the CPU.
fn module(cfg: MultiheadAttentionConfig) -> candle::Result<MultiheadAttention> {
    MultiheadAttention::new(
        cfg,
        seeded_var_builder(&VarMap::new(), 0, DType::F32, &dev()),
    )
}

/// The default module: `E = 8`, `H = 2`, seq-first.
fn default_module() -> candle::Result<MultiheadAttention> {
    module(MultiheadAttentionConfig::new(E, H))
}

/// An f32 tensor of `shape` (values do not matter: every call here is rejected).
fn t(shape: &[usize]) -> candle::Result<Tensor> {
    Tensor::randn(0f32, 1., shape, &dev())
}

/// A tensor of `shape` in `dtype`.
fn td(shape: &[usize], dtype: DType) -> candle::Result<Tensor> {
    Tensor::zeros(shape, dtype, &dev())
}

/// A forward call whose result is dropped.
fn call(
    m: &MultiheadAttention,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: &AttentionOptions,
) -> candle::Result<()> {
    m.forward(q, k, v, opts).map(|_| ())
}

/// Default module, batched seq-first q `(L, N, E)`, k and v `(S, N, E)`, with `opts`.
fn batched_with(opts: AttentionOptions) -> candle::Result<()> {
    let m = default_module()?;
    call(&m, &t(&[L, N, E])?, &t(&[S, N, E])?, &t(&[S, N, E])?, &opts)
}

/// Default module, unbatched q `(L, E)`, k and v `(S, E)`, with `opts`.
fn unbatched_with(opts: AttentionOptions) -> candle::Result<()> {
    let m = default_module()?;
    call(&m, &t(&[L, E])?, &t(&[S, E])?, &t(&[S, E])?, &opts)
}

fn attn_mask(mask: Tensor) -> AttentionOptions {
    AttentionOptions::new().with_attn_mask(mask)
}

fn kpm(mask: Tensor) -> AttentionOptions {
    AttentionOptions::new().with_key_padding_mask(mask)
}

/// The parameters of a valid module for `cfg`, by state_dict name.
fn state_dict(cfg: &MultiheadAttentionConfig) -> candle::Result<HashMap<String, Tensor>> {
    Ok(module(cfg.clone())?
        .named_parameters()
        .into_iter()
        .collect())
}

/// Loads a module for `cfg` from `tensors`.
fn load(
    cfg: MultiheadAttentionConfig,
    tensors: HashMap<String, Tensor>,
) -> candle::Result<MultiheadAttention> {
    MultiheadAttention::new(cfg, VarBuilder::from_tensors(tensors, DType::F32, &dev()))
}

fn cases() -> Vec<Case> {
    vec![
        // ---- Configuration -------------------------------------------------------------
        Case {
            name: "config: embed_dim 0",
            run: || module(MultiheadAttentionConfig::new(0, 2)).map(|_| ()),
            expect: &[
                "embed_dim and num_heads must be greater than 0",
                "embed_dim=0",
            ],
        },
        Case {
            name: "config: num_heads 0",
            run: || module(MultiheadAttentionConfig::new(8, 0)).map(|_| ()),
            expect: &[
                "embed_dim and num_heads must be greater than 0",
                "num_heads=0",
            ],
        },
        Case {
            name: "config: embed_dim not divisible by num_heads",
            run: || module(MultiheadAttentionConfig::new(8, 3)).map(|_| ()),
            expect: &[
                "embed_dim must be divisible by num_heads",
                "embed_dim=8",
                "num_heads=3",
            ],
        },
        Case {
            name: "config: num_heads > embed_dim",
            run: || module(MultiheadAttentionConfig::new(2, 4)).map(|_| ()),
            expect: &[
                "embed_dim must be divisible by num_heads",
                "embed_dim=2",
                "num_heads=4",
            ],
        },
        Case {
            name: "config: kdim 0",
            run: || module(MultiheadAttentionConfig::new(E, H).with_kdim(0)).map(|_| ()),
            expect: &["kdim must be greater than 0", "kdim=0"],
        },
        Case {
            name: "config: vdim 0",
            run: || module(MultiheadAttentionConfig::new(E, H).with_vdim(0)).map(|_| ()),
            expect: &["vdim must be greater than 0", "vdim=0"],
        },
        Case {
            name: "config: dropout 1.5",
            run: || module(MultiheadAttentionConfig::new(E, H).with_dropout(1.5)).map(|_| ()),
            expect: &[
                "dropout probability has to be between 0 and 1",
                "but got 1.5",
            ],
        },
        Case {
            name: "config: dropout -0.1",
            run: || module(MultiheadAttentionConfig::new(E, H).with_dropout(-0.1)).map(|_| ()),
            expect: &[
                "dropout probability has to be between 0 and 1",
                "but got -0.1",
            ],
        },
        Case {
            name: "config: dropout NaN",
            run: || module(MultiheadAttentionConfig::new(E, H).with_dropout(f64::NAN)).map(|_| ()),
            expect: &[
                "dropout probability has to be between 0 and 1",
                "but got NaN",
            ],
        },
        Case {
            name: "config: validate() alone, dropout 1.5",
            run: || {
                MultiheadAttentionConfig::new(E, H)
                    .with_dropout(1.5)
                    .validate()
            },
            expect: &["dropout probability has to be between 0 and 1", "1.5"],
        },
        // ---- Ranks ---------------------------------------------------------------------
        Case {
            name: "query rank 1",
            run: || {
                let m = default_module()?;
                call(
                    &m,
                    &t(&[E])?,
                    &t(&[E])?,
                    &t(&[E])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &[
                "query should be unbatched 2D or batched 3D tensor",
                "received 1-D query tensor",
                "[8]",
            ],
        },
        Case {
            name: "query rank 4",
            run: || {
                let m = default_module()?;
                let x = t(&[L, N, 1, E])?;
                call(&m, &x, &x, &x, &AttentionOptions::new())
            },
            expect: &[
                "query should be unbatched 2D or batched 3D tensor",
                "received 4-D query tensor",
                "[3, 2, 1, 8]",
            ],
        },
        Case {
            name: "query rank 0 (scalar)",
            run: || {
                let m = default_module()?;
                let x = Tensor::new(1f32, &dev())?;
                call(&m, &x, &x, &x, &AttentionOptions::new())
            },
            expect: &["received 0-D query tensor"],
        },
        Case {
            name: "ModuleT::forward_t with 4-D input",
            run: || ModuleT::forward_t(&default_module()?, &t(&[L, N, 1, E])?, false).map(|_| ()),
            expect: &["received 4-D query tensor", "[3, 2, 1, 8]"],
        },
        Case {
            name: "batched query, 2-D key",
            run: || {
                let m = default_module()?;
                call(
                    &m,
                    &t(&[L, N, E])?,
                    &t(&[S, E])?,
                    &t(&[S, N, E])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &[
                "For batched (3-D) `query`, expected `key` and `value` to be 3-D",
                "found 2-D and 3-D",
                "[4, 8]",
            ],
        },
        Case {
            name: "batched query, 2-D value",
            run: || {
                let m = default_module()?;
                call(
                    &m,
                    &t(&[L, N, E])?,
                    &t(&[S, N, E])?,
                    &t(&[S, E])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &[
                "For batched (3-D) `query`, expected `key` and `value` to be 3-D",
                "found 3-D and 2-D",
                "[4, 8]",
            ],
        },
        Case {
            name: "unbatched query, 3-D key",
            run: || {
                let m = default_module()?;
                call(
                    &m,
                    &t(&[L, E])?,
                    &t(&[S, N, E])?,
                    &t(&[S, E])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &[
                "For unbatched (2-D) `query`, expected `key` and `value` to be 2-D",
                "found 3-D and 2-D",
                "[4, 2, 8]",
            ],
        },
        Case {
            name: "batched key_padding_mask 1-D",
            run: || batched_with(kpm(td(&[S], DType::U8)?)),
            expect: &[
                "For batched (3-D) `query`, expected `key_padding_mask` to be `None` or 2-D",
                "found 1-D",
                "[4]",
            ],
        },
        Case {
            name: "batched key_padding_mask 3-D",
            run: || batched_with(kpm(td(&[N, 1, S], DType::U8)?)),
            expect: &[
                "`key_padding_mask` to be `None` or 2-D",
                "found 3-D",
                "[2, 1, 4]",
            ],
        },
        Case {
            name: "unbatched key_padding_mask 2-D",
            run: || unbatched_with(kpm(td(&[1, S], DType::U8)?)),
            expect: &[
                "For unbatched (2-D) `query`, expected `key_padding_mask` to be `None` or 1-D",
                "found 2-D",
                "[1, 4]",
            ],
        },
        Case {
            name: "attn_mask 1-D",
            run: || batched_with(attn_mask(td(&[S], DType::U8)?)),
            expect: &[
                "expected `attn_mask` to be `None`, 2-D or 3-D",
                "found 1-D",
                "[4]",
            ],
        },
        Case {
            name: "attn_mask 4-D",
            run: || batched_with(attn_mask(td(&[N, H, L, S], DType::U8)?)),
            expect: &[
                "expected `attn_mask` to be `None`, 2-D or 3-D",
                "found 4-D",
                "[2, 2, 3, 4]",
            ],
        },
        Case {
            name: "unbatched attn_mask 4-D",
            run: || unbatched_with(attn_mask(td(&[1, H, L, S], DType::U8)?)),
            expect: &["For unbatched (2-D) `query`", "`attn_mask`", "found 4-D"],
        },
        // ---- Mask shapes ---------------------------------------------------------------
        Case {
            name: "unbatched 3-D attn_mask (1, L, S) instead of (H, L, S)",
            run: || unbatched_with(attn_mask(td(&[1, L, S], DType::U8)?)),
            expect: &[
                "3D attn_mask is [1, 3, 4]",
                "should be [2, 3, 4]",
                "(num_heads, L, S)",
            ],
        },
        Case {
            name: "2-D attn_mask wrong S",
            run: || batched_with(attn_mask(td(&[L, S + 1], DType::U8)?)),
            expect: &[
                "The shape of the 2D attn_mask is [3, 5], but should be [3, 4]",
                "(L, S)",
            ],
        },
        Case {
            name: "2-D attn_mask with L and S swapped",
            run: || batched_with(attn_mask(td(&[S, L], DType::U8)?)),
            expect: &["The shape of the 2D attn_mask is [4, 3], but should be [3, 4]"],
        },
        Case {
            name: "unbatched 2-D attn_mask wrong shape",
            run: || unbatched_with(attn_mask(td(&[L, L], DType::F32)?)),
            expect: &["2D attn_mask is [3, 3], but should be [3, 4]"],
        },
        Case {
            name: "3-D attn_mask wrong first dim (H instead of N*H)",
            run: || batched_with(attn_mask(td(&[H, L, S], DType::U8)?)),
            expect: &[
                "The shape of the 3D attn_mask is [2, 3, 4], but should be [4, 3, 4]",
                "(N*num_heads, L, S)",
            ],
        },
        Case {
            name: "3-D attn_mask wrong first dim, batch_first",
            run: || {
                let m = module(MultiheadAttentionConfig::new(E, H).with_batch_first(true))?;
                let opts = attn_mask(td(&[N * H + 1, L, S], DType::U8)?);
                call(&m, &t(&[N, L, E])?, &t(&[N, S, E])?, &t(&[N, S, E])?, &opts)
            },
            expect: &["3D attn_mask is [5, 3, 4], but should be [4, 3, 4]"],
        },
        Case {
            name: "batched key_padding_mask wrong S",
            run: || batched_with(kpm(td(&[N, S + 1], DType::U8)?)),
            expect: &[
                "Expected key_padding_mask shape [2, 4]",
                "(N, S)",
                "but got [2, 5]",
            ],
        },
        Case {
            name: "batched key_padding_mask (S, N) instead of (N, S)",
            run: || batched_with(kpm(td(&[S, N], DType::U8)?)),
            expect: &[
                "Expected key_padding_mask shape [2, 4]",
                "(N, S)",
                "but got [4, 2]",
            ],
        },
        Case {
            name: "unbatched key_padding_mask wrong S",
            run: || unbatched_with(kpm(td(&[S + 1], DType::U8)?)),
            expect: &["Expected key_padding_mask shape [4]", "(S)", "but got [5]"],
        },
        // ---- Mask dtypes ---------------------------------------------------------------
        Case {
            name: "attn_mask i64",
            run: || batched_with(attn_mask(td(&[L, S], DType::I64)?)),
            expect: &["floating types of attn_mask are supported", "I64"],
        },
        Case {
            name: "attn_mask u32",
            run: || batched_with(attn_mask(td(&[L, S], DType::U32)?)),
            expect: &["floating types of attn_mask are supported", "U32"],
        },
        Case {
            name: "key_padding_mask i64",
            run: || batched_with(kpm(td(&[N, S], DType::I64)?)),
            expect: &["floating types of key_padding_mask are supported", "I64"],
        },
        Case {
            name: "key_padding_mask u32",
            run: || batched_with(kpm(td(&[N, S], DType::U32)?)),
            expect: &["floating types of key_padding_mask are supported", "U32"],
        },
        Case {
            name: "float attn_mask f64 with f32 query",
            run: || batched_with(attn_mask(td(&[L, S], DType::F64)?)),
            expect: &["float attn_mask has dtype F64 but query has F32"],
        },
        Case {
            name: "float attn_mask f16 with f32 query",
            run: || batched_with(attn_mask(td(&[L, S], DType::F16)?)),
            expect: &["float attn_mask has dtype F16 but query has F32"],
        },
        Case {
            name: "float key_padding_mask f64 with f32 query",
            run: || batched_with(kpm(td(&[N, S], DType::F64)?)),
            expect: &["float key_padding_mask has dtype F64 but query has F32"],
        },
        // ---- Input dtypes --------------------------------------------------------------
        Case {
            name: "query i64",
            run: || {
                let m = default_module()?;
                let x = td(&[L, N, E], DType::I64)?;
                call(&m, &x, &x, &x, &AttentionOptions::new())
            },
            expect: &["query must be a floating tensor", "I64"],
        },
        Case {
            name: "query u8",
            run: || {
                let m = default_module()?;
                let x = td(&[L, N, E], DType::U8)?;
                call(&m, &x, &x, &x, &AttentionOptions::new())
            },
            expect: &["query must be a floating tensor", "U8"],
        },
        Case {
            name: "query f64 with f32 module",
            run: || {
                let m = default_module()?;
                let x = td(&[L, N, E], DType::F64)?;
                call(&m, &x, &x, &x, &AttentionOptions::new())
            },
            expect: &["query has dtype F64 but the module's parameters are F32"],
        },
        Case {
            name: "key dtype differs from query",
            run: || {
                let m = default_module()?;
                let k = td(&[S, N, E], DType::F64)?;
                call(
                    &m,
                    &t(&[L, N, E])?,
                    &k,
                    &t(&[S, N, E])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &["key has dtype F64 but query has F32"],
        },
        Case {
            name: "value dtype differs from query",
            run: || {
                let m = default_module()?;
                let v = td(&[S, N, E], DType::BF16)?;
                call(
                    &m,
                    &t(&[L, N, E])?,
                    &t(&[S, N, E])?,
                    &v,
                    &AttentionOptions::new(),
                )
            },
            expect: &["value has dtype BF16 but query has F32"],
        },
        // ---- Feature sizes and lengths -------------------------------------------------
        Case {
            name: "query last dim != embed_dim",
            run: || {
                let m = default_module()?;
                let x = t(&[L, N, 6])?;
                call(&m, &x, &x, &x, &AttentionOptions::new())
            },
            expect: &[
                "was expecting embedding dimension of 8, but got 6",
                "[3, 2, 6]",
            ],
        },
        Case {
            name: "unbatched query last dim != embed_dim",
            run: || {
                let m = default_module()?;
                call(
                    &m,
                    &t(&[L, 6])?,
                    &t(&[S, E])?,
                    &t(&[S, E])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &[
                "was expecting embedding dimension of 8, but got 6",
                "[3, 6]",
            ],
        },
        Case {
            name: "key last dim != kdim (packed weights)",
            run: || {
                let m = default_module()?;
                call(
                    &m,
                    &t(&[L, N, E])?,
                    &t(&[S, N, 6])?,
                    &t(&[S, N, E])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &["expecting key feature size kdim=8, but got 6", "[4, 2, 6]"],
        },
        Case {
            name: "key last dim != kdim (separate weights)",
            run: || {
                let m = module(MultiheadAttentionConfig::new(E, H).with_kdim(5))?;
                call(
                    &m,
                    &t(&[L, N, E])?,
                    &t(&[S, N, 6])?,
                    &t(&[S, N, E])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &["expecting key feature size kdim=5, but got 6", "[4, 2, 6]"],
        },
        Case {
            name: "key with embed_dim features when kdim differs",
            run: || {
                let m = module(MultiheadAttentionConfig::new(E, H).with_kdim(5))?;
                let x = t(&[L, N, E])?;
                call(&m, &x, &x, &x, &AttentionOptions::new())
            },
            expect: &["expecting key feature size kdim=5, but got 8"],
        },
        Case {
            name: "value last dim != vdim (separate weights)",
            run: || {
                let m = module(MultiheadAttentionConfig::new(E, H).with_vdim(5))?;
                call(
                    &m,
                    &t(&[L, N, E])?,
                    &t(&[S, N, E])?,
                    &t(&[S, N, 6])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &[
                "expecting value feature size vdim=5, but got 6",
                "[4, 2, 6]",
            ],
        },
        Case {
            name: "value last dim != vdim (packed weights)",
            run: || {
                let m = default_module()?;
                call(
                    &m,
                    &t(&[L, N, E])?,
                    &t(&[S, N, E])?,
                    &t(&[S, N, 4])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &["expecting value feature size vdim=8, but got 4"],
        },
        Case {
            name: "key and value lengths differ",
            run: || {
                let m = default_module()?;
                call(
                    &m,
                    &t(&[L, N, E])?,
                    &t(&[S, N, E])?,
                    &t(&[S + 1, N, E])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &["key's sequence and batch dims [4, 2] do not match value's [5, 2]"],
        },
        Case {
            name: "unbatched key and value lengths differ",
            run: || {
                let m = default_module()?;
                call(
                    &m,
                    &t(&[L, E])?,
                    &t(&[S, E])?,
                    &t(&[S + 1, E])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &["key's sequence and batch dims [4] do not match value's [5]"],
        },
        Case {
            name: "key and value batch differ",
            run: || {
                let m = default_module()?;
                call(
                    &m,
                    &t(&[L, N, E])?,
                    &t(&[S, N, E])?,
                    &t(&[S, N + 1, E])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &["key's sequence and batch dims [4, 2] do not match value's [4, 3]"],
        },
        Case {
            name: "query/key batch differ (seq-first)",
            run: || {
                let m = default_module()?;
                let kv = t(&[S, N + 1, E])?;
                call(&m, &t(&[L, N, E])?, &kv, &kv, &AttentionOptions::new())
            },
            expect: &[
                "query batch size 2 does not match key batch size 3",
                "[3, 2, 8]",
                "[4, 3, 8]",
                "batch_first=false",
            ],
        },
        Case {
            name: "query/key batch differ (batch_first)",
            run: || {
                let m = module(MultiheadAttentionConfig::new(E, H).with_batch_first(true))?;
                let kv = t(&[N + 1, S, E])?;
                call(&m, &t(&[N, L, E])?, &kv, &kv, &AttentionOptions::new())
            },
            expect: &[
                "query batch size 2 does not match key batch size 3",
                "[2, 3, 8]",
                "[3, 4, 8]",
                "batch_first=true",
            ],
        },
        // ---- Loading parameters --------------------------------------------------------
        Case {
            name: "VarBuilder: in_proj_weight wrong shape",
            run: || {
                let cfg = MultiheadAttentionConfig::new(E, H);
                let mut sd = state_dict(&cfg)?;
                sd.insert("in_proj_weight".into(), t(&[E, E])?);
                load(cfg, sd).map(|_| ())
            },
            expect: &[
                "shape mismatch for in_proj_weight",
                "expected: [24, 8]",
                "got: [8, 8]",
            ],
        },
        Case {
            name: "VarBuilder: in_proj_weight missing",
            run: || {
                let cfg = MultiheadAttentionConfig::new(E, H);
                let mut sd = state_dict(&cfg)?;
                sd.remove("in_proj_weight");
                load(cfg, sd).map(|_| ())
            },
            expect: &["cannot find tensor in_proj_weight"],
        },
        Case {
            name: "VarBuilder: in_proj_weight missing under a prefix",
            run: || {
                let cfg = MultiheadAttentionConfig::new(E, H);
                let sd: HashMap<String, Tensor> = state_dict(&cfg)?
                    .into_iter()
                    .filter(|(k, _)| k != "in_proj_weight")
                    .map(|(k, v)| (format!("attn.{k}"), v))
                    .collect();
                let vb = VarBuilder::from_tensors(sd, DType::F32, &dev());
                MultiheadAttention::new(cfg, vb.pp("attn")).map(|_| ())
            },
            expect: &["cannot find tensor attn.in_proj_weight"],
        },
        Case {
            name: "VarBuilder: bias_k missing with add_bias_kv",
            run: || {
                let cfg = MultiheadAttentionConfig::new(E, H).with_add_bias_kv(true);
                let mut sd = state_dict(&cfg)?;
                sd.remove("bias_k");
                load(cfg, sd).map(|_| ())
            },
            expect: &["cannot find tensor bias_k"],
        },
        Case {
            name: "VarBuilder: bias_v wrong shape",
            run: || {
                let cfg = MultiheadAttentionConfig::new(E, H).with_add_bias_kv(true);
                let mut sd = state_dict(&cfg)?;
                sd.insert("bias_v".into(), t(&[E])?);
                load(cfg, sd).map(|_| ())
            },
            expect: &[
                "shape mismatch for bias_v",
                "expected: [1, 1, 8]",
                "got: [8]",
            ],
        },
        Case {
            name: "VarBuilder: k_proj_weight wrong shape (separate weights)",
            run: || {
                let cfg = MultiheadAttentionConfig::new(E, H).with_kdim(5);
                let mut sd = state_dict(&cfg)?;
                sd.insert("k_proj_weight".into(), t(&[E, E])?);
                load(cfg, sd).map(|_| ())
            },
            expect: &[
                "shape mismatch for k_proj_weight",
                "expected: [8, 5]",
                "got: [8, 8]",
            ],
        },
        Case {
            name: "VarBuilder: packed checkpoint loaded as separate weights",
            run: || {
                let sd = state_dict(&MultiheadAttentionConfig::new(E, H))?;
                load(MultiheadAttentionConfig::new(E, H).with_vdim(5), sd).map(|_| ())
            },
            expect: &["cannot find tensor q_proj_weight"],
        },
        Case {
            name: "VarBuilder: out_proj.bias missing",
            run: || {
                let cfg = MultiheadAttentionConfig::new(E, H);
                let mut sd = state_dict(&cfg)?;
                sd.remove("out_proj.bias");
                load(cfg, sd).map(|_| ())
            },
            expect: &["cannot find tensor out_proj.bias"],
        },
    ]
}

/// The error's message without the backtrace candle attaches when `RUST_BACKTRACE` is set.
fn message(mut e: candle::Error) -> String {
    while let candle::Error::WithBacktrace { inner, .. } = e {
        e = *inner;
    }
    e.to_string()
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "<non-string panic payload>".to_string()
    }
}

#[test]
fn invalid_calls_return_descriptive_errors() -> anyhow::Result<()> {
    let cases = cases();
    anyhow::ensure!(cases.len() >= 35, "only {} cases", cases.len());
    let mut names: Vec<_> = cases.iter().map(|c| c.name).collect();
    names.sort_unstable();
    names.dedup();
    anyhow::ensure!(names.len() == cases.len(), "case names are not unique");

    let mut failures = Vec::new();
    for case in &cases {
        let outcome = catch_unwind(AssertUnwindSafe(case.run));
        let problem = match outcome {
            Err(payload) => Some(format!("panicked: {}", panic_message(payload.as_ref()))),
            Ok(Ok(())) => Some("returned Ok instead of Err".to_string()),
            Ok(Err(e)) => {
                let msg = message(e);
                let missing: Vec<_> = case.expect.iter().filter(|s| !msg.contains(**s)).collect();
                (!missing.is_empty()).then(|| format!("message {msg:?} lacks {missing:?}"))
            }
        };
        if let Some(problem) = problem {
            failures.push(format!("- {}: {problem}", case.name));
        }
    }
    anyhow::ensure!(
        failures.is_empty(),
        "{} of {} invalid calls did not fail as expected:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    Ok(())
}
