//! [`AttentionOptions`] (the per-call arguments of `forward`) and [`AttentionOutput`].

use candle::Tensor;

/// The per-call arguments of [`MultiheadAttention::forward`](super::MultiheadAttention::forward).
///
/// PyTorch equivalent: the keyword arguments of `MultiheadAttention.forward(query, key, value,
/// key_padding_mask=None, need_weights=True, attn_mask=None, average_attn_weights=True,
/// is_causal=False)`, plus `train` for `module.train()` / `module.eval()`.
///
/// # Masks
/// PyTorch's bool masks are `u8` tensors here: **nonzero = masked** (PyTorch's `True`, "may not
/// attend"). Float masks (the query's dtype) are added to the scaled scores. Both kinds may be
/// mixed; they are combined by addition, as in PyTorch.
/// - `key_padding_mask`: `(N, S)` batched, `(S)` unbatched.
/// - `attn_mask`: `(L, S)`, or `(N·H, L, S)` with index `n·H + h` (unbatched: exactly `(H, L, S)`).
#[derive(Clone, Debug)]
pub struct AttentionOptions {
    /// Keys to ignore per batch element. Default `None`.
    pub key_padding_mask: Option<Tensor>,
    /// Positions each query may not attend to (u8) or additive biases (float). Default `None`.
    pub attn_mask: Option<Tensor>,
    /// Return the attention weights. Default `true`. It never changes the output.
    pub need_weights: bool,
    /// Average the returned weights over heads: `(N, L, S')`; else `(N, H, L, S')`. Default `true`.
    pub average_attn_weights: bool,
    /// Causal attention. With no `attn_mask` the module builds the causal mask itself (PyTorch
    /// raises instead); with an `attn_mask` the given mask is used as is, as PyTorch's
    /// `need_weights=True` path does. Default `false`.
    pub is_causal: bool,
    /// Training mode: dropout on the weights is applied only when set. Default `false`
    /// (PyTorch modules default to training mode; call sites here state it explicitly).
    pub train: bool,
    /// Seed of this call's dropout mask. `None` draws the next mask from the module's
    /// generator. Default `None`. Not in PyTorch.
    pub dropout_seed: Option<u64>,
    /// The row of this call's first sequence in the batch the dropout mask is drawn for: the
    /// mask of batch row `b` here is that of row `dropout_first_row + b` of the whole batch
    /// (a data-parallel rank's part of a global batch draws the global batch's mask). Default
    /// 0. Not in PyTorch.
    pub dropout_first_row: usize,
    /// Per-head factors `(H)` applied to each head's attention context before the output
    /// projection (0 ablates a head, 1 keeps it). The returned weights are not changed.
    /// Default `None`. Not in PyTorch's MHA (Hugging Face models call it `head_mask`).
    pub head_mask: Option<Tensor>,
    /// Which implementation computes the attention. Default [`AttentionKernel::Auto`]: the
    /// fused kernel where it covers the call (the CPU; CUDA without weights), the reference
    /// ops elsewhere. Not in PyTorch (its
    /// `torch.backends.cuda.sdp_kernel` / `sdpa_kernel` context plays this role for SDPA).
    pub kernel: AttentionKernel,
}

/// The implementation of the attention step (scores, masks, softmax, dropout, value product).
///
/// Both give the same results to rounding (tests compare them: f32 within 1e-5, f64 within
/// 1e-12), draw the same dropout mask for a seed, and follow the same fully-masked-row rule.
///
/// PyTorch equivalent: choosing an SDPA backend (`torch.nn.attention.sdpa_kernel`), where the
/// math backend is the reference.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttentionKernel {
    /// The fused kernel where it covers the call, the reference elsewhere: always on the CPU;
    /// on CUDA for `need_weights = false` in bf16, f16 or f32 with a head dim up to 128 on a
    /// GPU of compute capability 8.0 or more (the weights keep the reference path).
    #[default]
    Auto,
    /// The fused kernel (FlashAttention-2 scheme, forward and backward): no `L × S` buffer
    /// unless the weights are asked for. On CUDA it returns no weights, and a call outside
    /// what [`Auto`](Self::Auto) names for CUDA is an error.
    Fused,
    /// The op-by-op path (matmul, mask, softmax, dropout, matmul) on materialised
    /// `(N, H, L, S')` scores: `F.multi_head_attention_forward` step by step.
    Reference,
}

impl Default for AttentionOptions {
    fn default() -> Self {
        Self {
            key_padding_mask: None,
            attn_mask: None,
            need_weights: true,
            average_attn_weights: true,
            is_causal: false,
            train: false,
            dropout_seed: None,
            dropout_first_row: 0,
            head_mask: None,
            kernel: AttentionKernel::Auto,
        }
    }
}

impl AttentionOptions {
    /// PyTorch's defaults: no masks, `need_weights` and `average_attn_weights` true,
    /// `is_causal` and `train` false.
    pub fn new() -> Self {
        Self::default()
    }
}

crate::setters! {
    AttentionOptions {
        with_key_padding_mask(key_padding_mask: Some(Tensor));
        with_attn_mask(attn_mask: Some(Tensor));
        with_need_weights(need_weights: bool);
        with_average_attn_weights(average_attn_weights: bool);
        with_is_causal(is_causal: bool);
        with_train(train: bool);
        with_dropout_seed(dropout_seed: Some(u64));
        with_dropout_first_row(dropout_first_row: usize);
        with_head_mask(head_mask: Some(Tensor));
        with_kernel(kernel: AttentionKernel);
    }
}

/// What [`MultiheadAttention::forward`](super::MultiheadAttention::forward) returns.
///
/// PyTorch equivalent: the tuple `(attn_output, attn_output_weights)`.
///
/// # Shapes
/// - `output`: `(L, N, E)`, or `(N, L, E)` with `batch_first`, or `(L, E)` unbatched.
/// - `weights`: `(N, L, S')` averaged or `(N, H, L, S')` per head, always batch-major; `N` is
///   dropped for unbatched input. `S' = S + add_bias_kv + add_zero_attn`. `None` when
///   `need_weights` is false. After dropout when training, as in PyTorch.
#[derive(Clone, Debug)]
pub struct AttentionOutput {
    /// The attention output, in the query's layout and dtype.
    pub output: Tensor,
    /// The attention weights, in the query's dtype, if requested.
    pub weights: Option<Tensor>,
}
