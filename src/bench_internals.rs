//! The crate's own f32 matrix products, for `benches/products.rs` (the `bench-internals`
//! feature): not part of the API, may change with any release.
//!
//! - [`linear_product`]: the product of the linear layers, on candle's threads (the `gemm`
//!   crate; with the `mkl` feature MKL, one sequential call per rayon thread);
//! - [`tile_product`]: the attention kernels' register tiles on the calling thread, the right
//!   operand packed once ([`Packed`]) as the kernels pack a head's keys and values;
//! - [`library_product`]: the library's product on the calling thread (MKL's sequential
//!   `sgemm` with `mkl`, else the `gemm` crate), what the tiles would call instead.

use candle::Result;

use crate::attention::fused::kernel::{gemm_panels, pack_rows, pack_transposed, Panels};
use crate::cpu::{gemm, Threads};

/// `(m, n, k)` of `dst[m×n] = lhs[m×k]·rhs[k×n]`.
pub type Dims = (usize, usize, usize);

/// `(pointer, row stride, column stride)` of an operand.
type Strided = crate::cpu::Operand<f32>;

/// A row-major matrix operand; `transposed`: it is stored as its transpose (`cols × rows`).
#[derive(Clone, Copy, Debug)]
pub struct Operand<'a> {
    /// The elements as stored.
    pub data: &'a [f32],
    /// Stored transposed.
    pub transposed: bool,
}

impl Operand<'_> {
    /// `(pointer, row stride, column stride)` of the `rows × cols` matrix it holds, after a
    /// check of its length.
    fn strided(&self, what: &str, rows: usize, cols: usize) -> Result<Strided> {
        check_len(what, self.data.len(), rows, cols)?;
        let (rs, cs) = match self.transposed {
            false => (cols, 1),
            true => (1, rows),
        };
        Ok((self.data.as_ptr(), rs, cs))
    }
}

fn check_len(what: &str, got: usize, rows: usize, cols: usize) -> Result<()> {
    match rows.checked_mul(cols) {
        Some(want) if want == got => Ok(()),
        _ => candle::bail!("{what}: {got} elements, expected {rows} × {cols}"),
    }
}

/// The operands of `dst[m×n] = lhs[m×k]·rhs[k×n]` checked and run through `product`, `dst`
/// handed on as a row-major operand.
fn run(
    (m, n, k): (usize, usize, usize),
    lhs: Operand,
    rhs: Operand,
    dst: &mut [f32],
    product: impl FnOnce(Strided, Strided, (*mut f32, usize, usize)),
) -> Result<()> {
    let (a, b) = (lhs.strided("lhs", m, k)?, rhs.strided("rhs", k, n)?);
    check_len("dst", dst.len(), m, n)?;
    product(a, b, (dst.as_mut_ptr(), n, 1));
    Ok(())
}

/// `dst[m×n] = lhs[m×k]·rhs[k×n]` as the linear layers compute it, on candle's threads.
pub fn linear_product(dims: Dims, lhs: Operand, rhs: Operand, dst: &mut [f32]) -> Result<()> {
    // SAFETY: `run` checked every operand's length against the dimensions.
    run(dims, lhs, rhs, dst, |a, b, c| unsafe {
        gemm(dims, c, false, a, b, 1.0, Threads::All)
    })
}

/// `dst[m×n] = lhs[m×k]·rhs[k×n]` with the library's product on the calling thread: MKL's
/// sequential `sgemm` with the `mkl` feature, else the `gemm` crate.
pub fn library_product(dims: Dims, lhs: Operand, rhs: Operand, dst: &mut [f32]) -> Result<()> {
    // SAFETY: `run` checked every operand's length against the dimensions.
    run(dims, lhs, rhs, dst, |a, b, c| unsafe {
        #[cfg(feature = "mkl")]
        if crate::cpu::mkl::gemm(dims, c, false, [a, b], 1.0, 1) {
            return;
        }
        gemm(dims, c, false, a, b, 1.0, Threads::One)
    })
}

/// A `k × n` right operand packed in the attention kernels' panels.
pub struct Packed {
    data: Vec<f32>,
    k: usize,
    n: usize,
}

/// Packs the `k × n` operand `rhs` as the attention kernels pack a head's keys (stored
/// transposed) or values (stored as they are).
pub fn pack(k: usize, n: usize, rhs: Operand) -> Result<Packed> {
    check_len("rhs", rhs.data.len(), k, n)?;
    let mut data = vec![0f32; crate::attention::fused::kernel::panels_len(k, n)];
    match rhs.transposed {
        false => pack_rows(k, n, |r| &rhs.data[r * n..(r + 1) * n], &mut data),
        true => pack_transposed(n, k, |j| &rhs.data[j * k..(j + 1) * k], &mut data),
    }
    Ok(Packed { data, k, n })
}

/// `dst[m×n] = lhs[m×k]·rhs` with the attention kernels' register tiles on the calling thread.
pub fn tile_product(dims: Dims, lhs: Operand, rhs: &Packed, dst: &mut [f32]) -> Result<()> {
    let (m, n, k) = dims;
    if (rhs.k, rhs.n) != (k, n) {
        candle::bail!("rhs: packed {} × {}, expected {k} × {n}", rhs.k, rhs.n);
    }
    let a = lhs.strided("lhs", m, k)?;
    check_len("dst", dst.len(), m, n)?;
    let panels = Panels::new(&rhs.data, k);
    // SAFETY: the lengths were checked; the packed operand covers k × n.
    unsafe { gemm_panels(dims, (dst.as_mut_ptr(), n), false, a, (panels, (0, 0)), 1.0) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every product against a plain loop, both operands stored either way, and a wrong
    /// length refused by name.
    #[test]
    fn products_match_a_plain_loop() -> Result<()> {
        let (m, n, k) = (37, 45, 29);
        let val = |i: usize, s: usize| ((i * 2654435761 + s) % 1009) as f32 / 251.0 - 2.0;
        for (lt, rt) in [(false, false), (true, false), (false, true), (true, true)] {
            let a: Vec<f32> = (0..m * k).map(|i| val(i, 1)).collect();
            let b: Vec<f32> = (0..k * n).map(|i| val(i, 2)).collect();
            let at = |i: usize, p: usize| if lt { a[p * m + i] } else { a[i * k + p] };
            let bt = |p: usize, j: usize| if rt { b[j * k + p] } else { b[p * n + j] };
            let (lhs, rhs) = (
                Operand {
                    data: &a,
                    transposed: lt,
                },
                Operand {
                    data: &b,
                    transposed: rt,
                },
            );
            let packed = pack(k, n, rhs)?;
            let mut outs = [vec![0f32; m * n], vec![0f32; m * n], vec![0f32; m * n]];
            linear_product((m, n, k), lhs, rhs, &mut outs[0])?;
            library_product((m, n, k), lhs, rhs, &mut outs[1])?;
            tile_product((m, n, k), lhs, &packed, &mut outs[2])?;
            for (o, out) in outs.iter().enumerate() {
                for i in 0..m {
                    for j in 0..n {
                        let want: f32 = (0..k).map(|p| at(i, p) * bt(p, j)).sum();
                        let got = out[i * n + j];
                        assert!(
                            (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                            "product {o} ({lt},{rt}) [{i}][{j}] = {got}, want {want}"
                        );
                    }
                }
            }
        }
        let short = vec![0f32; m * k - 1];
        let err = linear_product(
            (m, n, k),
            Operand {
                data: &short,
                transposed: false,
            },
            Operand {
                data: &[0.0; 1],
                transposed: false,
            },
            &mut [],
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("lhs") && err.contains(&format!("{}", m * k - 1)),
            "{err}"
        );
        Ok(())
    }
}
