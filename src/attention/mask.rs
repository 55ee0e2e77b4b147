//! Masks: PyTorch's bool/float conventions, causal masks, and merging into one additive mask.

use candle::{DType, Device, Result, Tensor};

use super::checks::Dims;
use super::AttentionOptions;

/// The causal mask `(L, S)` as u8: 1 (masked) where key `j > i`, top-left aligned.
///
/// PyTorch equivalent: `torch.triu(torch.ones(L, S, dtype=torch.bool), diagonal=1)`; as a float
/// mask, `nn.Transformer.generate_square_subsequent_mask(L)`.
pub fn causal_mask(l: usize, s: usize, device: &Device) -> Result<Tensor> {
    let data: Vec<u8> = (0..l)
        .flat_map(|i| (0..s).map(move |j| u8::from(j > i)))
        .collect();
    Tensor::from_vec(data, (l, s), device)
}

/// A mask as an additive float mask in `dtype`: u8 nonzero → `-inf`, zero → `0`; a float mask
/// is cast to `dtype`.
///
/// PyTorch equivalent: `F._canonical_mask` (bool → `zeros.masked_fill_(mask, -inf)`).
pub fn additive_mask(mask: &Tensor, dtype: DType) -> Result<Tensor> {
    match mask.dtype() {
        DType::U8 => {
            let neg_inf = Tensor::full(f32::NEG_INFINITY, mask.shape(), mask.device())?;
            let zero = neg_inf.zeros_like()?;
            mask.ne(0u8)?.where_cond(&neg_inf, &zero)?.to_dtype(dtype)
        }
        _ => mask.to_dtype(dtype),
    }
}

/// Both masks of a call merged into one additive mask of shape `(N|1, H|1, L|1, S + extra)`,
/// or `None` when the call has no mask. `extra` zero columns (allowed) stand for the
/// `bias_k`/zero-attention keys.
///
/// PyTorch equivalent: steps 11–16 of `F.multi_head_attention_forward` (canonicalise, pad for
/// bias_kv and zero_attn, add the key padding mask to the attention mask).
pub(crate) fn merged_mask(
    opts: &AttentionOptions,
    dims: &Dims,
    num_heads: usize,
    extra: usize,
    dtype: DType,
    device: &Device,
) -> Result<Option<Tensor>> {
    let Dims { n, l, s, .. } = *dims;
    let causal = match (&opts.attn_mask, opts.is_causal) {
        (None, true) => Some(causal_mask(l, s, device)?),
        _ => None,
    };
    let attn = match opts.attn_mask.as_ref().or(causal.as_ref()) {
        Some(m) if m.rank() == 2 => Some(additive_mask(m, dtype)?.reshape((1, 1, l, s))?),
        Some(m) => Some(additive_mask(m, dtype)?.reshape((n, num_heads, l, s))?),
        None => None,
    };
    let kpm = match &opts.key_padding_mask {
        Some(m) => Some(additive_mask(m, dtype)?.reshape((n, 1, 1, s))?),
        None => None,
    };
    let merged = match (attn, kpm) {
        (Some(a), Some(k)) => Some(a.broadcast_add(&k)?),
        (a, k) => a.or(k),
    };
    match merged {
        Some(m) if extra > 0 => Ok(Some(m.pad_with_zeros(3, 0, extra)?)),
        m => Ok(m),
    }
}
