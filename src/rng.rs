//! Seeded, portable randomness.
//!
//! candle's CPU random number generator cannot be seeded (`Device::Cpu.set_seed` errors), so
//! every random draw in this crate (parameter initialisation, dropout masks) goes through the
//! functions here. They use ChaCha8, whose stream is fixed by its specification, so a seed gives
//! the same numbers on every platform and every version of this crate.
//!
//! PyTorch equivalent: `torch.manual_seed` + `torch.Generator`. The streams differ from
//! PyTorch's (no Rust crate reproduces PyTorch's Philox/MT19937 use bit for bit); golden tests
//! load PyTorch's weights instead.

use candle::{DType, Device, Result, Shape, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

/// Derives an independent seed from `seed` and a label (a parameter name, a call counter).
///
/// Each parameter gets its own stream, so adding a module does not change the initial values of
/// the others. FNV-1a over the label, mixed with the seed through SplitMix64.
pub fn derive_seed(seed: u64, label: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in label.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    splitmix64(seed ^ splitmix64(h))
}

/// SplitMix64's output function of state `x` (the state advanced once).
pub(crate) fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A ChaCha8 generator seeded from `seed`.
pub fn rng_from_seed(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// A tensor of `shape` drawn from U(`lo`, `up`) with a seeded generator, in `dtype` on `device`.
///
/// PyTorch equivalent: `torch.empty(shape).uniform_(lo, up, generator=g)`.
pub fn uniform(
    lo: f64,
    up: f64,
    shape: impl Into<Shape>,
    dtype: DType,
    device: &Device,
    seed: u64,
) -> Result<Tensor> {
    sampled(shape.into(), dtype, device, seed, |rng| {
        lo + (up - lo) * rng.random::<f64>()
    })
}

/// A tensor filled by `draw` from a generator seeded with `seed`, built on the CPU in f64.
fn sampled(
    shape: Shape,
    dtype: DType,
    device: &Device,
    seed: u64,
    mut draw: impl FnMut(&mut ChaCha8Rng) -> f64,
) -> Result<Tensor> {
    let mut rng = rng_from_seed(seed);
    let data: Vec<f64> = (0..shape.elem_count()).map(|_| draw(&mut rng)).collect();
    Tensor::from_vec(data, shape, &Device::Cpu)?
        .to_dtype(dtype)?
        .to_device(device)
}

/// A tensor of `shape` drawn from N(`mean`, `std`²) with a seeded generator.
///
/// PyTorch equivalent: `torch.empty(shape).normal_(mean, std, generator=g)`.
pub fn normal(
    mean: f64,
    std: f64,
    shape: impl Into<Shape>,
    dtype: DType,
    device: &Device,
    seed: u64,
) -> Result<Tensor> {
    sampled(shape.into(), dtype, device, seed, |rng| {
        mean + std * rng.sample::<f64, _>(StandardNormal)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_seeds_differ_by_label_and_seed() {
        assert_ne!(derive_seed(0, "a"), derive_seed(0, "b"));
        assert_ne!(derive_seed(0, "a"), derive_seed(1, "a"));
        assert_eq!(
            derive_seed(7, "in_proj_weight"),
            derive_seed(7, "in_proj_weight")
        );
    }

    #[test]
    fn uniform_is_reproducible_and_in_range() -> Result<()> {
        let a = uniform(-0.5, 0.5, (64, 8), DType::F32, &Device::Cpu, 3)?;
        let b = uniform(-0.5, 0.5, (64, 8), DType::F32, &Device::Cpu, 3)?;
        let c = uniform(-0.5, 0.5, (64, 8), DType::F32, &Device::Cpu, 4)?;
        let (va, vb, vc) = (
            a.flatten_all()?.to_vec1::<f32>()?,
            b.flatten_all()?.to_vec1::<f32>()?,
            c.flatten_all()?.to_vec1::<f32>()?,
        );
        assert_eq!(va, vb);
        assert_ne!(va, vc);
        assert!(va.iter().all(|v| (-0.5..0.5).contains(v)));
        Ok(())
    }
}
