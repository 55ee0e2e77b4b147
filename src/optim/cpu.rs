//! The optimizer's CPU loops: AdamW's update and a gradient's squared norm in one parallel pass
//! each, where candle's tensor ops take about ten passes (and as many allocations) for the update.
//! PyTorch's operations in its order (`_single_tensor_adamw`), in the parameter's dtype.

use candle::{CpuStorage, Device, InplaceOp1, Layout, Result, Storage, Tensor, WithDType};
use rayon::prelude::*;

use crate::cpu::{contiguous, Elem};

/// Elements per rayon task.
const CHUNK: usize = 1 << 14;

/// The contiguous elements behind a CPU storage, or `None` (the caller's tensor path runs).
fn elems<'a, T: WithDType>(s: &'a Storage, l: &Layout) -> Option<&'a [T]> {
    contiguous("AdamW", s, l).ok()
}

/// AdamW's scalars for one step of one parameter.
pub(super) struct Update {
    /// `1 - lr·weight_decay`.
    pub decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    /// `lr / (1 - β1ᵗ)`.
    pub step_size: f64,
    /// `√(1 - β2ᵗ)`.
    pub bias2_sqrt: f64,
    pub eps: f64,
}

/// One AdamW step over a parameter's elements, in place (PyTorch's `_single_tensor_adamw`
/// updates `param`, `exp_avg` and `exp_avg_sq` in place too).
fn update<T: Elem>(u: &Update, p: &mut [T], g: &[T], m: &mut [T], v: &mut [T]) {
    let c = |x: f64| T::from_f64(x);
    let (decay, b1, b2) = (c(u.decay), c(1.0 - u.beta1), c(u.beta2));
    let (nb2, step_size, bias2_sqrt, eps) =
        (c(1.0 - u.beta2), c(u.step_size), c(u.bias2_sqrt), c(u.eps));
    p.par_chunks_mut(CHUNK)
        .zip(m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK)))
        .zip(g.par_chunks(CHUNK))
        .for_each(|((p, (m, v)), g)| {
            for i in 0..p.len() {
                // m.lerp_(g, 1 - β1); v = v·β2 + g²·(1 - β2); p = p·decay - m/denom·step_size.
                let mi = m[i] + (g[i] - m[i]) * b1;
                let vi = v[i] * b2 + g[i] * g[i] * nb2;
                let denom = vi.sqrt() / bias2_sqrt + eps;
                p[i] = p[i] * decay - mi / denom * step_size;
                m[i] = mi;
                v[i] = vi;
            }
        });
}

/// The writable elements of a contiguous CPU storage of `Self`.
trait Writable: Elem {
    fn of(s: &mut CpuStorage) -> Option<&mut Vec<Self>>;
}

impl Writable for f32 {
    fn of(s: &mut CpuStorage) -> Option<&mut Vec<f32>> {
        match s {
            CpuStorage::F32(v) => Some(v),
            _ => None,
        }
    }
}

impl Writable for f64 {
    fn of(s: &mut CpuStorage) -> Option<&mut Vec<f64>> {
        match s {
            CpuStorage::F64(v) => Some(v),
            _ => None,
        }
    }
}

/// candle's in-place op interface around a closure, which gets the storage locked for writing.
struct WithStorageMut<'a>(&'a dyn Fn(&mut CpuStorage, &Layout) -> Result<()>);

impl InplaceOp1 for WithStorageMut<'_> {
    fn name(&self) -> &'static str {
        "adamw"
    }

    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> Result<()> {
        (self.0)(s, l)
    }
}

/// `f` on the elements of the contiguous CPU tensor `t`, locked for writing.
fn with_elems_mut<T: Writable>(t: &Tensor, f: &dyn Fn(&mut [T]) -> Result<()>) -> Result<()> {
    t.inplace_op1(&WithStorageMut(&|s, l| {
        let range = l.contiguous_offsets();
        match (T::of(s), range) {
            (Some(v), Some((a, b))) => f(&mut v[a..b]),
            _ => candle::bail!("AdamW: expected a contiguous {:?} tensor", T::DTYPE),
        }
    }))
}

/// One AdamW step in place: the parameter `p` and the moments `m`, `v` are overwritten with
/// their new values from the gradient `g`, in one parallel pass. Returns `false` (changing
/// nothing) where the loop does not apply: not CPU, not f32/f64, mixed dtypes or shapes,
/// a strided tensor, or two of the four sharing a storage (their write locks would wait on each
/// other). The caller's tensor path then runs.
///
/// This allocates nothing, where the tensor path writes three new tensors per parameter (41 MiB
/// per step for the medium `train_step` model's 3.4 M parameters) and copies the new parameter
/// into the variable. (Under glibc's defaults such large frees raise glibc's `mmap` and trim
/// thresholds, to the benefit of candle's smaller per-step tensors: see `docs/benchmarks.md`.)
pub(super) fn adamw_update_in_place(
    u: &Update,
    p: &Tensor,
    g: &Tensor,
    m: &Tensor,
    v: &Tensor,
) -> Result<bool> {
    let dtype = p.dtype();
    let all = [p, g, m, v];
    if !matches!(p.device(), Device::Cpu)
        || all
            .iter()
            .any(|t| t.dtype() != dtype || t.shape() != p.shape() || !t.is_contiguous())
    {
        return Ok(false);
    }
    // Each storage's address, its read lock released at once.
    let at = all.map(|t| &*t.storage_and_layout().0 as *const Storage);
    if (0..4).any(|i| (i + 1..4).any(|j| at[i] == at[j])) {
        return Ok(false);
    }
    macro_rules! run {
        ($t:ty) => {{
            let (gs, gl) = g.storage_and_layout();
            let Some(g) = elems::<$t>(&gs, gl) else {
                return Ok(false);
            };
            // The three write locks nest (distinct storages, checked above); each level hands
            // its slice inwards as a pointer, valid while its lock is held.
            with_elems_mut::<$t>(m, &|m| {
                let (mp, n) = (m.as_mut_ptr() as usize, m.len());
                with_elems_mut::<$t>(v, &|v| {
                    let vp = v.as_mut_ptr() as usize;
                    with_elems_mut::<$t>(p, &|p| {
                        // SAFETY: m and v are n elements each (the shapes are equal), locked
                        // for writing by the enclosing calls and distinct from p and g.
                        let (m, v) = unsafe {
                            (
                                std::slice::from_raw_parts_mut(mp as *mut $t, n),
                                std::slice::from_raw_parts_mut(vp as *mut $t, n),
                            )
                        };
                        update(u, p, g, m, v);
                        Ok(())
                    })
                })
            })?
        }};
    }
    match dtype {
        candle::DType::F32 => run!(f32),
        candle::DType::F64 => run!(f64),
        _ => return Ok(false),
    }
    Ok(true)
}

/// `Σ g²` accumulated in f64 in one pass, or `None` where the loop does not apply.
pub(super) fn sum_of_squares(g: &Tensor) -> Option<f64> {
    fn sum<T: WithDType>(x: &[T]) -> f64 {
        x.par_chunks(CHUNK)
            .map(|c| c.iter().map(|x| x.to_f64() * x.to_f64()).sum::<f64>())
            // In chunk order, for a run-to-run identical norm (see `cross_entropy.rs`).
            .collect::<Vec<f64>>()
            .into_iter()
            .sum()
    }
    let (s, l) = g.storage_and_layout();
    match &*s {
        Storage::Cpu(CpuStorage::F32(_)) => elems::<f32>(&s, l).map(sum),
        Storage::Cpu(CpuStorage::F64(_)) => elems::<f64>(&s, l).map(sum),
        _ => None,
    }
}
