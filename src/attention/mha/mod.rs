//! [`MultiheadAttention`]: the module, its parameters and its forward pass.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use candle::{DType, ModuleT, Result, Tensor};
use candle_nn::{Init, VarBuilder};

use super::checks::{check_inputs, Dims};
use super::fused::{linear, projected_self_attention, projected_self_attention_output};
use super::{AttentionKernel, AttentionOptions, AttentionOutput, MultiheadAttentionConfig};
use crate::init::{linear_weight, xavier_normal, xavier_uniform};
use crate::nn::{Linear, Lora};
use crate::rng::derive_seed;

mod fused_path;
mod incremental;
mod lora;
mod projection;
mod reference_path;

/// The input projection weights: packed `[3E, E]` when `kdim == vdim == E`, else three.
#[derive(Clone, Debug)]
enum InProjWeight {
    Packed(Tensor),
    Separate { q: Tensor, k: Tensor, v: Tensor },
}

/// Multi-head attention, equal to PyTorch's in outputs, weights, gradients and parameter names.
///
/// PyTorch equivalent: `torch.nn.MultiheadAttention`, forward as in
/// `F.multi_head_attention_forward` (the explicit "slow path"; the inference fast path gives
/// the same numbers).
///
/// # Parameters (PyTorch's state_dict names, under the `VarBuilder` prefix)
/// - `in_proj_weight [3E, E]` (q | k | v row blocks), or `q_proj_weight [E, E]`,
///   `k_proj_weight [E, kdim]`, `v_proj_weight [E, vdim]` when `kdim` or `vdim` ≠ `E`;
/// - `in_proj_bias [3E]` (packed in both cases) and `out_proj.bias [E]` when `bias`;
/// - `bias_k`, `bias_v [1, 1, E]` when `add_bias_kv`; `out_proj.weight [E, E]`.
///
/// New parameters are initialised as PyTorch does: xavier-uniform over the whole packed
/// `[3E, E]` (bound √(6/4E)) or per matrix, `out_proj.weight` U(±1/√E), zero biases,
/// xavier-normal `bias_k`/`bias_v`. Use [`seeded_var_builder`](crate::seeded_var_builder) to
/// make them reproducible.
///
/// # Shapes
/// `E` = embed_dim, `H` = num_heads, `L` = target length, `S` = source length, `N` = batch.
/// - query `(L, N, E)`, key `(S, N, kdim)`, value `(S, N, vdim)`; `(N, ·, ·)` first with
///   `batch_first`; unbatched `(L, E)`, `(S, kdim)`, `(S, vdim)`.
/// - see [`AttentionOptions`] for the masks and [`AttentionOutput`] for the results.
///
/// # Fully masked rows: the one deliberate difference
/// A query row whose every key is masked gets zero weights and a zero attention context, so
/// its output is `out_proj` of zero (the bias), with finite gradients, whatever
/// `need_weights` is. PyTorch gives NaN there when `need_weights=True` (pytorch#41508) and
/// these same zeros when `need_weights=False` (its SDPA path).
///
/// ```
/// use candle::{DType, Device, ModuleT, Tensor};
/// use candle_mha::{seeded_var_builder, AttentionOptions, MultiheadAttention, MultiheadAttentionConfig};
/// # fn main() -> candle::Result<()> {
/// let varmap = candle_nn::VarMap::new();
/// let cfg = MultiheadAttentionConfig::new(8, 2).with_batch_first(true);
/// let mha = MultiheadAttention::new(cfg, seeded_var_builder(&varmap, 0, DType::F32, &Device::Cpu))?;
/// let x = Tensor::ones((3, 4, 8), DType::F32, &Device::Cpu)?; // (N, L, E)
/// let kpm = Tensor::new(&[[0u8, 0, 0, 1], [0, 0, 1, 1], [0, 0, 0, 0]], &Device::Cpu)?;
/// let opts = AttentionOptions::new().with_key_padding_mask(kpm).with_average_attn_weights(false);
/// let out = mha.forward(&x, &x, &x, &opts)?;
/// assert_eq!(out.weights.unwrap().dims(), &[3, 2, 4, 4]); // (N, H, L, S)
/// assert_eq!(x.apply_t(&mha, false)?.dims(), &[3, 4, 8]); // `ModuleT`: self-attention, no weights
/// assert_eq!(mha.num_parameters(), 4 * 8 * 8 + 4 * 8);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct MultiheadAttention {
    config: MultiheadAttentionConfig,
    in_proj_weight: InProjWeight,
    in_proj_bias: Option<Tensor>,
    bias_k: Option<Tensor>,
    bias_v: Option<Tensor>,
    out_proj: Linear,
    /// A LoRA adapter on the input projection (`[3E, E]` as one layer); the output
    /// projection's is `out_proj`'s own.
    in_proj_lora: Option<Lora>,
    /// Dropout calls so far: each call without an explicit seed draws a fresh mask.
    dropout_calls: Arc<AtomicU64>,
}

/// Builds a [`MultiheadAttention`]; the same as [`MultiheadAttention::new`].
///
/// PyTorch equivalent: `torch.nn.MultiheadAttention(...)`.
pub fn multihead_attention(
    config: MultiheadAttentionConfig,
    vb: VarBuilder,
) -> Result<MultiheadAttention> {
    MultiheadAttention::new(config, vb)
}

impl MultiheadAttention {
    /// Creates the module, taking (or, from a `VarMap`, creating) its parameters under `vb`'s
    /// prefix with PyTorch's names and initialisation. Fails on an invalid config or a stored
    /// parameter of the wrong shape.
    ///
    /// PyTorch equivalent: `torch.nn.MultiheadAttention(...)`, or `load_state_dict` when `vb`
    /// reads a checkpoint.
    pub fn new(config: MultiheadAttentionConfig, vb: VarBuilder) -> Result<Self> {
        config.validate()?;
        let (e, kdim, vdim) = (config.embed_dim, config.kdim(), config.vdim());
        // PyTorch's registration (state_dict) order.
        let in_proj_weight = if config.qkv_same_embed_dim() {
            // xavier over the whole packed matrix: fan_in = E, fan_out = 3E.
            InProjWeight::Packed(vb.get_with_hints(
                (3 * e, e),
                "in_proj_weight",
                xavier_uniform(e, 3 * e),
            )?)
        } else {
            InProjWeight::Separate {
                q: vb.get_with_hints((e, e), "q_proj_weight", xavier_uniform(e, e))?,
                k: vb.get_with_hints((e, kdim), "k_proj_weight", xavier_uniform(kdim, e))?,
                v: vb.get_with_hints((e, vdim), "v_proj_weight", xavier_uniform(vdim, e))?,
            }
        };
        let in_proj_bias = match config.bias {
            true => Some(vb.get_with_hints(3 * e, "in_proj_bias", Init::Const(0.0))?),
            false => None,
        };
        let (bias_k, bias_v) = match config.add_bias_kv {
            // xavier_normal on [1, 1, E]: fan_in = fan_out = E, std = 1/√E.
            true => (
                Some(vb.get_with_hints((1, 1, e), "bias_k", xavier_normal(e, e))?),
                Some(vb.get_with_hints((1, 1, e), "bias_v", xavier_normal(e, e))?),
            ),
            false => (None, None),
        };
        let out_vb = vb.pp("out_proj");
        let out_weight = out_vb.get_with_hints((e, e), "weight", linear_weight(e))?;
        let out_bias = match config.bias {
            true => Some(out_vb.get_with_hints(e, "bias", Init::Const(0.0))?),
            false => None,
        };
        Ok(Self {
            config,
            in_proj_weight,
            in_proj_bias,
            bias_k,
            bias_v,
            out_proj: Linear::from_weights(out_weight, out_bias),
            in_proj_lora: None,
            dropout_calls: Arc::new(AtomicU64::new(0)),
        })
    }

    /// A module whose parameters are exactly `tensors` (PyTorch's state_dict names, relative
    /// to the module), in their dtype and on their device. Every parameter the configuration
    /// needs must be given, with its shape, and nothing else.
    ///
    /// PyTorch equivalent: `m = nn.MultiheadAttention(...); m.load_state_dict(tensors,
    /// strict=True)`.
    pub fn from_tensors(
        config: MultiheadAttentionConfig,
        tensors: Vec<(&str, Tensor)>,
    ) -> Result<Self> {
        let Some((_, first)) = tensors.first() else {
            candle::bail!("from_tensors: no tensor given; expected the module's parameters")
        };
        let (dtype, device) = (first.dtype(), first.device().clone());
        let given: Vec<String> = tensors.iter().map(|(n, _)| n.to_string()).collect();
        let map = tensors
            .into_iter()
            .map(|(n, t)| (n.to_string(), t))
            .collect();
        let module = Self::new(config, VarBuilder::from_tensors(map, dtype, &device))?;
        let used: Vec<String> = module
            .named_parameters()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let unexpected: Vec<&String> = given.iter().filter(|n| !used.contains(n)).collect();
        if !unexpected.is_empty() {
            candle::bail!("from_tensors: unexpected parameter(s) {unexpected:?}; this configuration has {used:?}")
        }
        Ok(module)
    }

    /// The configuration.
    pub fn config(&self) -> &MultiheadAttentionConfig {
        &self.config
    }

    /// `in_proj_weight [3E, E]`, or `None` when the projections are separate.
    pub fn in_proj_weight(&self) -> Option<&Tensor> {
        match &self.in_proj_weight {
            InProjWeight::Packed(w) => Some(w),
            InProjWeight::Separate { .. } => None,
        }
    }

    /// `q_proj_weight [E, E]`, or `None` when packed.
    pub fn q_proj_weight(&self) -> Option<&Tensor> {
        self.separate().map(|(q, _, _)| q)
    }

    /// `k_proj_weight [E, kdim]`, or `None` when packed.
    pub fn k_proj_weight(&self) -> Option<&Tensor> {
        self.separate().map(|(_, k, _)| k)
    }

    /// `v_proj_weight [E, vdim]`, or `None` when packed.
    pub fn v_proj_weight(&self) -> Option<&Tensor> {
        self.separate().map(|(_, _, v)| v)
    }

    fn separate(&self) -> Option<(&Tensor, &Tensor, &Tensor)> {
        match &self.in_proj_weight {
            InProjWeight::Separate { q, k, v } => Some((q, k, v)),
            InProjWeight::Packed(_) => None,
        }
    }

    /// `in_proj_bias [3E]` (q | k | v), or `None` without bias.
    pub fn in_proj_bias(&self) -> Option<&Tensor> {
        self.in_proj_bias.as_ref()
    }

    /// `bias_k [1, 1, E]`, or `None` without `add_bias_kv`.
    pub fn bias_k(&self) -> Option<&Tensor> {
        self.bias_k.as_ref()
    }

    /// `bias_v [1, 1, E]`, or `None` without `add_bias_kv`.
    pub fn bias_v(&self) -> Option<&Tensor> {
        self.bias_v.as_ref()
    }

    /// The output projection (`out_proj.weight [E, E]`, `out_proj.bias [E]`).
    pub fn out_proj(&self) -> &Linear {
        &self.out_proj
    }

    /// Every parameter with its state_dict name (relative to the module), in PyTorch's order.
    ///
    /// PyTorch equivalent: `module.named_parameters()` / `module.state_dict().items()`.
    pub fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut params = Vec::new();
        let mut push = |name: &str, t: Option<&Tensor>| {
            if let Some(t) = t {
                params.push((name.to_string(), t.clone()));
            }
        };
        push("in_proj_weight", self.in_proj_weight());
        push("q_proj_weight", self.q_proj_weight());
        push("k_proj_weight", self.k_proj_weight());
        push("v_proj_weight", self.v_proj_weight());
        push("in_proj_bias", self.in_proj_bias());
        push("bias_k", self.bias_k());
        push("bias_v", self.bias_v());
        push("out_proj.weight", Some(self.out_proj.weight()));
        push("out_proj.bias", self.out_proj.bias());
        params
    }

    /// The number of scalar parameters; it does not depend on `num_heads`.
    ///
    /// PyTorch equivalent: `sum(p.numel() for p in module.parameters())`.
    pub fn num_parameters(&self) -> usize {
        self.named_parameters()
            .iter()
            .map(|(_, t)| t.elem_count())
            .sum()
    }

    fn dtype(&self) -> DType {
        self.out_proj.weight().dtype()
    }

    /// Attention of `query` over `key`/`value`.
    ///
    /// PyTorch equivalent: `module(query, key, value, key_padding_mask=…, need_weights=…,
    /// attn_mask=…, average_attn_weights=…, is_causal=…)` with `module.train(opts.train)`.
    /// Passing the same tensor as query, key and value (self-attention) projects it with one
    /// matrix product, as PyTorch does.
    ///
    /// # Shapes
    /// See [`MultiheadAttention`], [`AttentionOptions`] and [`AttentionOutput`].
    ///
    /// # Errors
    /// Any argument of the wrong rank, shape, dtype or device, with a message naming it.
    pub fn forward(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        opts: &AttentionOptions,
    ) -> Result<AttentionOutput> {
        let cfg = &self.config;
        let dtype = self.dtype();
        let dims = check_inputs(
            cfg,
            dtype,
            self.out_proj.weight().device(),
            query,
            key,
            value,
            opts,
        )?;
        let Dims { batched, n, l, .. } = dims;
        let (e, h, hd) = (cfg.embed_dim, cfg.num_heads, cfg.head_dim());
        if n == 0 || l == 0 {
            return self.empty_output(query, opts, &dims);
        }
        // Work in the caller's layout; unbatched input is seq-first with N = 1.
        let seq_first = !batched || !cfg.batch_first;
        let batch = |t: &Tensor| {
            if batched {
                Ok(t.clone())
            } else {
                t.unsqueeze(1)
            }
        };
        let (q_in, k_in, v_in) = (batch(query)?, batch(key)?, batch(value)?);
        let self_attn = query.id() == key.id() && key.id() == value.id();
        let kv_same = key.id() == value.id();
        let dropout_seed = self.dropout_seed(opts);
        let call = Call {
            dims: &dims,
            seq_first,
            opts,
            dropout_seed,
        };
        let mut path = AttentionPath::choose(opts, query.device(), dtype, self_attn, cfg);
        // The adapters ride inside the whole-call op as folded weights where they can.
        let folded = match self.has_lora() && path == AttentionPath::FusedWithProjection {
            true => self.folded_weights(opts)?,
            false => None,
        };
        if self.has_lora() && folded.is_none() && path == AttentionPath::FusedWithProjection {
            path = AttentionPath::Fused;
        }
        // ctx: (A, B, E) in the caller's layout; weights: batch-major.
        let (ctx, weights) = match (&self.in_proj_weight, path) {
            // Both projections around the fused op: the context never becomes a tensor.
            (InProjWeight::Packed(w), AttentionPath::FusedWithProjection)
                if opts.head_mask.is_none() =>
            {
                let op = self.fused_op(&call, 0, dtype)?;
                let (w, out_w) = match &folded {
                    Some((w, out_w)) => (w, out_w),
                    None => (w, self.out_proj.weight()),
                };
                let (output, weights) = projected_self_attention_output(
                    &q_in,
                    (w, self.in_proj_bias.as_ref()),
                    (out_w, self.out_proj.bias()),
                    op,
                )?;
                return in_caller_rank(output, weights, batched);
            }
            (InProjWeight::Packed(w), AttentionPath::FusedWithProjection) => {
                let op = self.fused_op(&call, 0, dtype)?;
                let b = self.in_proj_bias.as_ref();
                // The output adapter is added after the context below, as on the other paths.
                let w = folded.as_ref().map_or(w, |(w, _)| w);
                projected_self_attention(&q_in, w, b, op)?
            }
            (_, AttentionPath::Reference) => {
                let projected = self.in_projection(&q_in, &k_in, &v_in, self_attn, kv_same)?;
                let projected = self.add_in_proj_lora(projected, (&q_in, &k_in, &v_in), opts)?;
                self.attend_reference(projected, &call)?
            }
            _ => {
                let projected = self.in_projection(&q_in, &k_in, &v_in, self_attn, kv_same)?;
                let projected = self.add_in_proj_lora(projected, (&q_in, &k_in, &v_in), opts)?;
                self.attend_fused(projected, &call)?
            }
        };
        let ctx = match &opts.head_mask {
            Some(m) => {
                let (a, b, _) = ctx.dims3()?;
                let m = m.to_dtype(dtype)?.reshape((1, 1, h, 1))?;
                ctx.reshape((a, b, h, hd))?
                    .broadcast_mul(&m)?
                    .reshape((a, b, e))?
            }
            None => ctx,
        };
        let output = linear(&ctx, self.out_proj.weight(), self.out_proj.bias())?;
        let output = self.add_out_proj_lora(output, &ctx, opts)?;
        in_caller_rank(output, weights, batched)
    }

    /// The result for an empty batch or query: empty tensors of the right shapes, as PyTorch's
    /// slow path returns (candle's reshapes of empty tensors fail).
    fn empty_output(
        &self,
        query: &Tensor,
        opts: &AttentionOptions,
        dims: &Dims,
    ) -> Result<AttentionOutput> {
        let cfg = &self.config;
        let s1 = dims.s + usize::from(cfg.add_bias_kv) + usize::from(cfg.add_zero_attn);
        let weights = (dims.n, dims.l, s1, dims.batched);
        self.empty_result(query, weights, opts.need_weights, opts.average_attn_weights)
    }

    /// An output of zeros like `query` and, when asked for, zero weights of `forward`'s shape
    /// for `(N, L, S', batched)`: what `forward` and `forward_incremental` return when the
    /// batch or the query is empty.
    fn empty_result(
        &self,
        query: &Tensor,
        (n, l, s1, batched): (usize, usize, usize, bool),
        need_weights: bool,
        average: bool,
    ) -> Result<AttentionOutput> {
        let weights = match need_weights {
            false => None,
            true => {
                let mut shape = vec![n, self.config.num_heads, l, s1];
                if average {
                    shape.remove(1);
                }
                if !batched {
                    shape.remove(0);
                }
                Some(Tensor::zeros(shape, query.dtype(), query.device())?)
            }
        };
        Ok(AttentionOutput {
            output: query.zeros_like()?,
            weights,
        })
    }

    /// The dropout seed of this call, or `None` when no dropout applies. A call without an
    /// explicit seed advances the module's counter (the same on both kernels).
    fn dropout_seed(&self, opts: &AttentionOptions) -> Option<u64> {
        let cfg = &self.config;
        if !(opts.train && cfg.dropout > 0.0) {
            return None;
        }
        Some(match opts.dropout_seed {
            Some(seed) => seed,
            None => {
                let call = self.dropout_calls.fetch_add(1, Ordering::Relaxed);
                derive_seed(cfg.dropout_seed, &call.to_string())
            }
        })
    }
}

/// What the attention step of one call needs besides the projections.
struct Call<'a> {
    dims: &'a Dims,
    /// The projections are `(L, N, ·)` (else `(N, L, ·)`).
    seq_first: bool,
    opts: &'a AttentionOptions,
    dropout_seed: Option<u64>,
}

/// Which implementation computes one call's attention step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AttentionPath {
    /// The fused kernel with the packed input projection inside the op (no autograd node,
    /// hence no gradient buffers, for the `(A, B, 3E)` projection): a training step's usual
    /// call.
    FusedWithProjection,
    /// The fused kernel after the projections.
    Fused,
    /// The op-by-op reference.
    Reference,
}

impl AttentionPath {
    /// The path [`AttentionOptions::kernel`] asks for. `Auto` is the fused kernel on the CPU,
    /// and on CUDA where its kernel covers the call ([`cuda_fused`]); the reference
    /// elsewhere. The projection goes inside the fused op only where that op covers the whole
    /// call: packed self-attention on the CPU in f32/f64 and no extra key rows
    /// (`add_bias_kv`, `add_zero_attn`); with or without weights.
    fn choose(
        opts: &AttentionOptions,
        device: &candle::Device,
        dtype: DType,
        self_attn: bool,
        cfg: &MultiheadAttentionConfig,
    ) -> Self {
        let fused = match opts.kernel {
            AttentionKernel::Auto => {
                device.is_cpu() || cuda_fused(device, dtype, cfg.head_dim(), opts.need_weights)
            }
            AttentionKernel::Fused => true,
            AttentionKernel::Reference => false,
        };
        if !fused {
            return Self::Reference;
        }
        let whole_call = self_attn
            && cfg.qkv_same_embed_dim()
            && !cfg.add_bias_kv
            && !cfg.add_zero_attn
            && device.is_cpu()
            && matches!(dtype, DType::F32 | DType::F64);
        match whole_call {
            true => Self::FusedWithProjection,
            false => Self::Fused,
        }
    }
}

/// Whether the CUDA fused kernel covers a call on `device` in `dtype` with `head_dim`: it
/// computes no weights, takes bf16, f16 and f32 and head dims up to 128, and needs a GPU of
/// compute capability 8.0 or more.
pub(super) fn cuda_fused(
    device: &candle::Device,
    dtype: DType,
    head_dim: usize,
    need_weights: bool,
) -> bool {
    #[cfg(feature = "cuda")]
    if let candle::Device::Cuda(dev) = device {
        use crate::attention::fused::cuda;
        return !need_weights
            && matches!(dtype, DType::F32 | DType::BF16 | DType::F16)
            && (1..=cuda::MAX_HEAD_DIM).contains(&head_dim)
            && cuda::available(dev);
    }
    let _ = (device, dtype, head_dim, need_weights);
    false
}

/// Self-attention `x → output` (query = key = value = `x`), without weights; `train` applies
/// the module's dropout (a fresh mask per call, from the module's seeded generator).
///
/// PyTorch equivalent: `module.train(train); module(x, x, x, need_weights=False)[0]`.
/// (Through candle's blanket impl, `Module` is not implemented: a module with dropout is a
/// `ModuleT` in candle, as `candle_nn::Dropout` is; call `x.apply_t(&mha, false)`.)
impl ModuleT for MultiheadAttention {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Result<Tensor> {
        let opts = AttentionOptions::new()
            .with_need_weights(false)
            .with_train(train);
        MultiheadAttention::forward(self, xs, xs, xs, &opts).map(|out| out.output)
    }
}

/// The output and weights in the caller's rank (unbatched input: no batch dimension).
fn in_caller_rank(
    output: Tensor,
    weights: Option<Tensor>,
    batched: bool,
) -> Result<AttentionOutput> {
    let output = if batched { output } else { output.squeeze(1)? };
    let weights = match weights {
        Some(w) if !batched => Some(w.squeeze(0)?),
        w => w,
    };
    Ok(AttentionOutput { output, weights })
}
