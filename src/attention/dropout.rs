//! Seeded dropout on attention weights, counter-based so that any kernel can regenerate it.
//!
//! Whether element `idx` of the `(N, H, L, S')` weights is dropped is a pure function of
//! `(seed, idx)` ([`DropoutMask::keep`]): the reference path builds the whole mask from it, the
//! fused kernel draws the same bits tile by tile in the forward pass and again in the
//! backward pass, so the mask is never stored and both paths drop the same elements.

use candle::{DType, Device, Result, Shape, Tensor};

use crate::rng::splitmix64;

/// The drop test of one seed and probability: `keep(idx)` is false with probability `p`.
///
/// Element `idx` is dropped when the top 53 bits of SplitMix64 at position `idx` of the stream
/// seeded by `seed`, read as a number in `[0, 1)`, are below `p`.
#[derive(Clone, Copy, Debug)]
pub struct DropoutMask {
    key: u64,
    threshold: u64,
    offset: u64,
    /// `1 / (1 - p)`, the factor of kept elements (0 when `p = 1`).
    pub scale: f64,
}

impl DropoutMask {
    /// The mask of probability `p` (in `[0, 1]`) and `seed`.
    pub fn new(p: f64, seed: u64) -> Result<Self> {
        if !(0.0..=1.0).contains(&p) {
            candle::bail!("dropout probability has to be between 0 and 1, but got {p}")
        }
        // u < p  ⇔  bits < p·2^53 (exact: a power-of-two scale) ⇔ bits < ceil(p·2^53).
        let threshold = (p * (1u64 << 53) as f64).ceil() as u64;
        let scale = if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
        Ok(Self {
            key: splitmix64(seed),
            threshold,
            offset: 0,
            scale,
        })
    }

    /// The same mask read from position `offset` of its stream on: element `idx` is tested as
    /// `offset + idx`. A part of a larger batch that starts at row `b0` takes
    /// `offset = b0 · (elements per row)` and draws exactly the whole batch's mask for its rows
    /// (the data-parallel ranks of `candle-mha-train`).
    pub fn with_offset(mut self, offset: u64) -> Self {
        self.offset = offset;
        self
    }

    /// The key, threshold, offset and scale of the test, for kernels that draw the same mask
    /// elsewhere (the CUDA kernel).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn parts(&self) -> (u64, u64, u64, f64) {
        (self.key, self.threshold, self.offset, self.scale)
    }

    /// Whether element `idx` (row-major over `(N, H, L, S')`) is kept.
    #[inline(always)]
    pub fn keep(&self, idx: u64) -> bool {
        let z = self.key.wrapping_add(
            idx.wrapping_add(self.offset)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
        (splitmix64(z) >> 11) >= self.threshold
    }

    /// The mask as factors of a row-major tensor of `shape`: `scale` where kept, 0 where
    /// dropped, in `dtype` on `device`.
    pub fn factors(&self, shape: &Shape, dtype: DType, device: &Device) -> Result<Tensor> {
        let factors: Vec<f64> = (0..shape.elem_count() as u64)
            .map(|i| if self.keep(i) { self.scale } else { 0.0 })
            .collect();
        Tensor::from_vec(factors, shape, &Device::Cpu)?
            .to_dtype(dtype)?
            .to_device(device)
    }
}

/// Zeroes each element of `x` with probability `p` and scales the rest by `1/(1-p)`, with a
/// mask drawn from `seed` ([`DropoutMask`], element `i` of the row-major `x`). `p = 1` gives
/// zeros (candle's `ops::dropout` rejects it).
///
/// PyTorch equivalent: `F.dropout(x, p, training=True)`; the mask differs from PyTorch's
/// (another generator), its distribution does not.
pub fn seeded_dropout(x: &Tensor, p: f64, seed: u64) -> Result<Tensor> {
    seeded_dropout_at(x, p, seed, 0)
}

/// [`seeded_dropout`] with the mask read from position `offset` on
/// ([`DropoutMask::with_offset`]): `x` as rows of a larger tensor starting at element `offset`.
pub fn seeded_dropout_at(x: &Tensor, p: f64, seed: u64, offset: u64) -> Result<Tensor> {
    let mask = DropoutMask::new(p, seed)?.with_offset(offset);
    if p == 0.0 {
        return Ok(x.clone());
    }
    if p == 1.0 {
        return x.zeros_like();
    }
    x * mask.factors(x.shape(), x.dtype(), x.device())?
}
