//! Seeded dropout on attention weights.

use candle::{Result, Tensor};
use rand::Rng;

use crate::rng;

/// Zeroes each element of `x` with probability `p` and scales the rest by `1/(1-p)`, with a
/// mask drawn from `seed`. `p = 1` gives zeros (candle's `ops::dropout` rejects it).
///
/// PyTorch equivalent: `F.dropout(x, p, training=True)`; the mask differs from PyTorch's
/// (another generator), its distribution does not.
pub fn seeded_dropout(x: &Tensor, p: f64, seed: u64) -> Result<Tensor> {
    if !(0.0..=1.0).contains(&p) {
        candle::bail!("dropout probability has to be between 0 and 1, but got {p}")
    }
    if p == 0.0 {
        return Ok(x.clone());
    }
    if p == 1.0 {
        return x.zeros_like();
    }
    let scale = 1.0 / (1.0 - p);
    let mut rng = rng::rng_from_seed(seed);
    let mask: Vec<f64> = (0..x.elem_count())
        .map(|_| if rng.random::<f64>() < p { 0.0 } else { scale })
        .collect();
    let mask = Tensor::from_vec(mask, x.shape(), &candle::Device::Cpu)?
        .to_dtype(x.dtype())?
        .to_device(x.device())?;
    x * mask
}
