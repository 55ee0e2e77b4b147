//! [`MultiheadAttentionConfig`]: the constructor arguments of `nn.MultiheadAttention`.

use candle::Result;

/// The configuration of a [`MultiheadAttention`](super::MultiheadAttention) module.
///
/// PyTorch equivalent: the arguments of `torch.nn.MultiheadAttention(embed_dim, num_heads,
/// dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False, kdim=None, vdim=None,
/// batch_first=False)`, with the same defaults. `device` and `dtype` come from the
/// `VarBuilder` instead.
///
/// ```
/// use candle_mha::MultiheadAttentionConfig;
/// let cfg = MultiheadAttentionConfig::new(16, 4).with_kdim(8).with_batch_first(true);
/// assert_eq!((cfg.head_dim(), cfg.kdim(), cfg.vdim()), (4, 8, 16));
/// assert!(!cfg.qkv_same_embed_dim());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct MultiheadAttentionConfig {
    /// Total dimension `E` of the model; split across heads (each gets `E / num_heads`).
    pub embed_dim: usize,
    /// Number of parallel attention heads `H`; must divide `embed_dim`.
    pub num_heads: usize,
    /// Dropout probability on the attention weights, applied only when
    /// [`AttentionOptions::train`](super::AttentionOptions) is set. Default `0.0`.
    pub dropout: f64,
    /// Biases on the input and output projections (one flag for both). Default `true`.
    pub bias: bool,
    /// Learned `bias_k`/`bias_v` rows appended to the keys and values. Default `false`.
    pub add_bias_kv: bool,
    /// A zero key/value row appended after projection. Default `false`.
    pub add_zero_attn: bool,
    /// Feature size of the keys; `None` means `embed_dim`. Default `None`.
    pub kdim: Option<usize>,
    /// Feature size of the values; `None` means `embed_dim`. Default `None`.
    pub vdim: Option<usize>,
    /// Inputs and output are `(N, L, E)` when `true`, `(L, N, E)` when `false`. Default `false`.
    pub batch_first: bool,
    /// Seed of the dropout generator (candle's CPU generator cannot be seeded). Default `0`.
    /// Not in PyTorch, where dropout uses the global generator.
    pub dropout_seed: u64,
}

impl MultiheadAttentionConfig {
    /// PyTorch's defaults for `embed_dim` and `num_heads`.
    pub fn new(embed_dim: usize, num_heads: usize) -> Self {
        Self {
            embed_dim,
            num_heads,
            dropout: 0.0,
            bias: true,
            add_bias_kv: false,
            add_zero_attn: false,
            kdim: None,
            vdim: None,
            batch_first: false,
            dropout_seed: 0,
        }
    }

    /// The key feature size (`kdim`, or `embed_dim` when unset).
    pub fn kdim(&self) -> usize {
        self.kdim.unwrap_or(self.embed_dim)
    }

    /// The value feature size (`vdim`, or `embed_dim` when unset).
    pub fn vdim(&self) -> usize {
        self.vdim.unwrap_or(self.embed_dim)
    }

    /// `embed_dim / num_heads` (0 when `num_heads` is 0).
    pub fn head_dim(&self) -> usize {
        self.embed_dim.checked_div(self.num_heads).unwrap_or(0)
    }

    /// Whether the projections are packed into one `in_proj_weight [3E, E]`: true when
    /// `kdim == vdim == embed_dim`, also when they were given explicitly.
    ///
    /// PyTorch equivalent: `MultiheadAttention._qkv_same_embed_dim`.
    pub fn qkv_same_embed_dim(&self) -> bool {
        self.kdim() == self.embed_dim && self.vdim() == self.embed_dim
    }

    /// Number of scalar parameters, `4E² + 4E` in the default case; independent of
    /// `num_heads`.
    pub fn num_parameters(&self) -> usize {
        let e = self.embed_dim;
        let weights = e * e + e * self.kdim() + e * self.vdim() + e * e;
        let biases = if self.bias { 4 * e } else { 0 };
        let bias_kv = if self.add_bias_kv { 2 * e } else { 0 };
        weights + biases + bias_kv
    }

    /// Checks the configuration, with PyTorch's messages where PyTorch checks.
    ///
    /// PyTorch checks `embed_dim > 0`, `num_heads > 0` and divisibility in the constructor and
    /// the dropout range only when dropout runs; this checks all of them up front, plus
    /// `kdim > 0` and `vdim > 0`.
    pub fn validate(&self) -> Result<()> {
        let (e, h) = (self.embed_dim, self.num_heads);
        if e == 0 || h == 0 {
            candle::bail!(
                "embed_dim and num_heads must be greater than 0, got embed_dim={e} and num_heads={h} instead"
            )
        }
        if e % h != 0 {
            candle::bail!(
                "embed_dim must be divisible by num_heads, got embed_dim={e} and num_heads={h}"
            )
        }
        for (name, dim) in [("kdim", self.kdim), ("vdim", self.vdim)] {
            if dim == Some(0) {
                candle::bail!("{name} must be greater than 0, got {name}=0")
            }
        }
        if !(0.0..=1.0).contains(&self.dropout) {
            candle::bail!(
                "dropout probability has to be between 0 and 1, but got {}",
                self.dropout
            )
        }
        Ok(())
    }
}

crate::setters! {
    MultiheadAttentionConfig {
        with_dropout(dropout: f64);
        with_bias(bias: bool);
        with_add_bias_kv(add_bias_kv: bool);
        with_add_zero_attn(add_zero_attn: bool);
        with_kdim(kdim: Some(usize));
        with_vdim(vdim: Some(usize));
        with_batch_first(batch_first: bool);
        with_dropout_seed(dropout_seed: u64);
    }
}
