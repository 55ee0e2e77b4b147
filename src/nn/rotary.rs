//! [`RotaryEmbedding`]: rotary position embeddings as Hugging Face's Llama-family models apply
//! them (the halves layout of `rotate_half`, not Meta's interleaved pairs), with the
//! `rope_scaling` types whose frequencies do not depend on the sequence length.

use candle::backend::BackendStorage;
use candle::{CpuStorage, DType, Device, Layout, Result, Shape, Tensor, WithDType, D};
use rayon::prelude::*;

use crate::cpu::{contiguous, fused, unsupported_dtype, with_slice, CpuArg, Grads};

/// `rope_scaling` of a Llama-family `config.json`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// No scaling (`rope_scaling: null`, or `rope_type` `"default"`).
    None,
    /// `rope_type` `"linear"`: every frequency divided by `factor` (positions interpolated).
    Linear {
        /// The divisor, > 0.
        factor: f64,
    },
    /// `rope_type` `"llama3"` (Llama 3.1/3.2): low frequencies divided by `factor`, high ones
    /// kept, those between interpolated.
    Llama3 {
        /// Divisor of the low frequencies.
        factor: f64,
        /// `low_freq_factor`.
        low_freq_factor: f64,
        /// `high_freq_factor` (> `low_freq_factor`).
        high_freq_factor: f64,
        /// `original_max_position_embeddings`.
        original_max_position_embeddings: usize,
    },
}

/// The rotation of each pair of dimensions `(i, i + D/2)` of a head by `position · inv_freq_i`.
///
/// PyTorch equivalent: transformers' `LlamaRotaryEmbedding` and `apply_rotary_pos_emb`:
/// `inv_freq = 1 / theta^(2i/D)` (f32, then scaled), `cos`, `sin` of `position · inv_freq`
/// in f32, cast to the activations' dtype, `x·cos + rotate_half(x)·sin`.
///
/// # Shapes
/// [`apply`](Self::apply): `x (B, H, L, D)` → `(B, H, L, D)`, positions `offset..offset + L`.
#[derive(Clone, Debug)]
pub struct RotaryEmbedding {
    inv_freq: Vec<f32>,
    head_dim: usize,
}

/// The longest head a rotary embedding takes.
pub const MAX_ROPE_HEAD_DIM: usize = 1 << 12;

impl RotaryEmbedding {
    /// The embedding of heads of `head_dim` (even) with base `theta` (`rope_theta`).
    pub fn new(head_dim: usize, theta: f64, scaling: RopeScaling) -> Result<Self> {
        if head_dim == 0 || !head_dim.is_multiple_of(2) || head_dim > MAX_ROPE_HEAD_DIM {
            candle::bail!(
                "rotary embedding: head_dim must be even and in 2..={MAX_ROPE_HEAD_DIM}, got {head_dim}"
            )
        }
        if !(theta.is_finite() && theta > 1.0) {
            candle::bail!("rotary embedding: rope_theta must be finite and above 1, got {theta}")
        }
        let base = theta as f32;
        let dim = head_dim as f32;
        // As transformers: `1.0 / (base ** (arange(0, dim, 2).float() / dim))` in f32.
        let mut inv_freq: Vec<f32> = (0..head_dim / 2)
            .map(|i| 1.0 / base.powf((2 * i) as f32 / dim))
            .collect();
        match scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => {
                check_factor("factor", factor)?;
                let f = factor as f32;
                inv_freq.iter_mut().for_each(|x| *x /= f);
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: orig,
            } => {
                check_factor("factor", factor)?;
                check_factor("low_freq_factor", low_freq_factor)?;
                check_factor("high_freq_factor", high_freq_factor)?;
                if high_freq_factor <= low_freq_factor || orig == 0 {
                    candle::bail!(
                        "rotary embedding: llama3 scaling needs high_freq_factor ({high_freq_factor}) above low_freq_factor ({low_freq_factor}) and original_max_position_embeddings ({orig}) above 0"
                    )
                }
                // transformers' `_compute_llama3_parameters`, on f32 tensors.
                let (factor, lo, hi, orig) = (
                    factor as f32,
                    low_freq_factor as f32,
                    high_freq_factor as f32,
                    orig as f32,
                );
                let (low_wavelen, high_wavelen) = (orig / lo, orig / hi);
                for f in inv_freq.iter_mut() {
                    let wavelen = 2.0 * std::f32::consts::PI / *f;
                    let scaled = if wavelen > low_wavelen {
                        *f / factor
                    } else {
                        *f
                    };
                    let smooth = (orig / wavelen - lo) / (hi - lo);
                    // wavelen is finite and positive (inv_freq > 0), so these are the negated comparisons.
                    let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                    *f = if medium {
                        (1.0 - smooth) * scaled / factor + smooth * scaled
                    } else {
                        scaled
                    };
                }
            }
        }
        Ok(Self { inv_freq, head_dim })
    }

    /// The frequencies `inv_freq [D/2]`.
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// `cos` and `sin` `(len, D)` of positions `offset..offset + len`, in `dtype`.
    pub fn cos_sin(
        &self,
        offset: usize,
        len: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<(Tensor, Tensor)> {
        let half = self.head_dim / 2;
        let mut cos = Vec::with_capacity(len * self.head_dim);
        let mut sin = Vec::with_capacity(len * self.head_dim);
        for p in offset..offset + len {
            let p = p as f32;
            for _ in 0..2 {
                for f in &self.inv_freq[..half] {
                    let a = f * p;
                    cos.push(a.cos());
                    sin.push(a.sin());
                }
            }
        }
        let shape = (len, self.head_dim);
        Ok((
            Tensor::from_vec(cos, shape, device)?.to_dtype(dtype)?,
            Tensor::from_vec(sin, shape, device)?.to_dtype(dtype)?,
        ))
    }

    /// `x·cos + rotate_half(x)·sin` for `x (B, H, L, D)` at positions `offset..offset + L`.
    pub fn apply(&self, x: &Tensor, offset: usize) -> Result<Tensor> {
        let (.., l, d) = x.dims4()?;
        if d != self.head_dim {
            candle::bail!(
                "rotary embedding: input of dims {:?}, expected a head dim of {}",
                x.dims(),
                self.head_dim
            )
        }
        if fused(x) {
            // The tables rounded to the input's dtype once, as transformers casts them.
            let (cos, sin) = self.cos_sin(offset, l, x.dtype(), x.device())?;
            let table = |t: Tensor| t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>();
            let op = RotaryOp {
                cos: table(cos)?,
                sin: table(sin)?,
                l,
                d,
            };
            return x.contiguous()?.apply_op1(op);
        }
        let (cos, sin) = self.cos_sin(offset, l, x.dtype(), x.device())?;
        apply_rotary(x, &cos, &sin)
    }
}

fn check_factor(name: &str, v: f64) -> Result<()> {
    if !(v.is_finite() && v > 0.0) {
        candle::bail!("rotary embedding: rope_scaling {name} must be finite and above 0, got {v}")
    }
    Ok(())
}

/// `x·cos + rotate_half(x)·sin` with `cos`, `sin` `(L, D)` broadcast over `x (…, L, D)`.
///
/// PyTorch equivalent: transformers' `apply_rotary_pos_emb` for one tensor.
pub fn apply_rotary(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let d = x.dim(D::Minus1)?;
    let (x1, x2) = (
        x.narrow(D::Minus1, 0, d / 2)?,
        x.narrow(D::Minus1, d / 2, d - d / 2)?,
    );
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?
}

/// The rotation as one op on the CPU in f32/f64 (candle's ops keep four tensors as large as q
/// or k per call for the backward pass): `cos`, `sin` `(L, D)` of the positions, computed in
/// f32 and rounded to the input's dtype (as transformers casts them), held as f64.
struct RotaryOp {
    cos: Vec<f64>,
    sin: Vec<f64>,
    l: usize,
    d: usize,
}

const OP: &str = "fused rotary embedding";

impl RotaryOp {
    /// `y = x·cos + rotate_half(x)·sin` (`sign` 1), or its transpose on a gradient (`sign`
    /// -1: `dx = g·cos − rotate_half(g·sin)` reordered), over rows of `d` whose position is
    /// their index mod `L`.
    fn rotate<T: WithDType>(&self, x: &[T], sign: f64) -> Vec<T> {
        let (l, d, h) = (self.l, self.d, self.d / 2);
        let mut y = vec![T::zero(); x.len()];
        y.par_chunks_mut(d)
            .zip(x.par_chunks(d))
            .enumerate()
            .for_each(|(r, (y, x))| {
                let p = (r % l) * d;
                let (c, s) = (&self.cos[p..p + d], &self.sin[p..p + d]);
                for i in 0..h {
                    let (x1, x2) = (x[i].to_f64(), x[i + h].to_f64());
                    let (c1, c2, s1, s2) = (c[i], c[i + h], s[i], s[i + h]);
                    if sign > 0.0 {
                        y[i] = T::from_f64(x1 * c1 - x2 * s1);
                        y[i + h] = T::from_f64(x2 * c2 + x1 * s2);
                    } else {
                        y[i] = T::from_f64(x1 * c1 + x2 * s2);
                        y[i + h] = T::from_f64(x2 * c2 - x1 * s1);
                    }
                }
            });
        y
    }

    fn fwd(&self, [(s, l)]: [CpuArg; 1]) -> Result<(CpuStorage, Shape)> {
        let out = |x: &Layout| x.shape().clone();
        match s {
            CpuStorage::F32(_) => {
                let x = contiguous::<f32, _>(OP, s, l)?;
                Ok((CpuStorage::F32(self.rotate(x, 1.0)), out(l)))
            }
            CpuStorage::F64(_) => {
                let x = contiguous::<f64, _>(OP, s, l)?;
                Ok((CpuStorage::F64(self.rotate(x, 1.0)), out(l)))
            }
            other => Err(unsupported_dtype(OP, other.dtype())),
        }
    }

    fn bwd(&self, [x]: [&Tensor; 1], _: &Tensor, grad: &Tensor) -> Result<Grads<1>> {
        let dx = match x.dtype() {
            DType::F32 => with_slice::<f32, _>(OP, grad, |g| {
                Tensor::from_vec(self.rotate(g, -1.0), x.shape(), x.device())
            })?,
            DType::F64 => with_slice::<f64, _>(OP, grad, |g| {
                Tensor::from_vec(self.rotate(g, -1.0), x.shape(), x.device())
            })?,
            dt => return Err(unsupported_dtype(OP, dt)),
        };
        Ok([Some(dx)])
    }
}

crate::cpu::custom_op!(CustomOp1 for RotaryOp, "fused-rotary", fwd: fwd, bwd: bwd);
