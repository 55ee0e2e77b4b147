//! `nn.Embedding`: a lookup table initialised N(0, 1).

use crate::cpu::CpuArg;
use crate::cpu::Grads;
use candle::backend::BackendStorage;
use candle::{CpuStorage, DType, Device, Module, Result, Shape, Storage, Tensor};
use candle_nn::{Init, VarBuilder};
use rayon::prelude::*;

use crate::cpu::{contiguous, fused, unsupported_dtype, written_vec, Elem, ROWS_PER_TASK};

/// A lookup table of `num_embeddings` vectors.
///
/// PyTorch equivalent: `nn.Embedding(num_embeddings, dim)`: `weight [num, dim]` ~ N(0, 1).
#[derive(Clone, Debug)]
pub struct Embedding {
    weight: Tensor,
}

impl Embedding {
    /// Takes (or creates, N(0, 1)) `weight` under `vb`.
    pub fn new(num_embeddings: usize, dim: usize, vb: VarBuilder) -> Result<Self> {
        let init = Init::Randn {
            mean: 0.0,
            stdev: 1.0,
        };
        Ok(Self {
            weight: vb.get_with_hints((num_embeddings, dim), "weight", init)?,
        })
    }

    /// An embedding of the given table as it is (no copy, no check).
    ///
    /// PyTorch equivalent: `nn.Embedding.from_pretrained(weight, freeze=False)`.
    pub fn from_weight(weight: Tensor) -> Self {
        Self { weight }
    }

    /// `weight [num, dim]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }
}

impl Module for Embedding {
    /// `ids` of any shape (u32/i64) → `(*ids.shape, dim)`.
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let mut dims = ids.dims().to_vec();
        dims.push(self.weight.dim(1)?);
        self.weight
            .index_select(&ids.flatten_all()?, 0)?
            .reshape(dims)
    }
}

/// `tokens[ids] + positions[pos]` as one CPU op (f32/f64) with its backward: `ids (N, L)`
/// (u32/i64), `pos (L)` (u32) → `(N, L, dim)`. candle's lookups and broadcast add are six
/// autograd nodes here, three of them as large as the output, each of which candle's
/// backward pass adds into a fresh zero tensor; this is one. Elsewhere (other devices and
/// dtypes) the same sum of candle's ops.
///
/// PyTorch equivalent: `tok_emb(ids) + pos_emb(pos)`.
pub fn embedding_sum(
    tokens: &Embedding,
    ids: &Tensor,
    positions: &Embedding,
    pos: &Tensor,
) -> Result<Tensor> {
    let (tw, pw) = (tokens.weight(), positions.weight());
    if !fused(tw) || tw.dtype() != pw.dtype() || !fused(pw) || ids.rank() != 2 {
        return tokens.forward(ids)?.broadcast_add(&positions.forward(pos)?);
    }
    let (n, l) = ids.dims2()?;
    let ((v, e), (p, pe)) = (tw.dims2()?, pw.dims2()?);
    if pe != e || pos.dims() != [l] {
        candle::bail!(
            "embedding sum: token table (V, E) = {:?}, position table {:?} and positions {:?} \
             do not fit ids (N, L) = {:?}",
            [v, e],
            [p, pe],
            pos.dims(),
            [n, l]
        )
    }
    let ids = ids.flatten_all()?.to_dtype(DType::I64)?.to_vec1::<i64>()?;
    let pos = pos.to_dtype(DType::I64)?.to_vec1::<i64>()?;
    for (what, list, rows) in [("ids", &ids, v), ("positions", &pos, p)] {
        if let Some(bad) = list.iter().find(|&&i| i < 0 || i as usize >= rows) {
            candle::bail!("embedding sum: {what} must be in [0, {rows}), got {bad}")
        }
    }
    let op = EmbeddingSum {
        ids: ids.into_iter().map(|i| i as usize).collect(),
        pos: pos.into_iter().map(|i| i as usize).collect(),
        shape: (n, l, e),
    };
    tw.apply_op2(pw, op)
}

/// The op of [`embedding_sum`] on `(tokens table, positions table)`; the indices are data.
struct EmbeddingSum {
    /// `N·L` token ids, row-major.
    ids: Vec<usize>,
    /// `L` positions.
    pos: Vec<usize>,
    shape: (usize, usize, usize),
}

const OP: &str = "embedding sum";

impl EmbeddingSum {
    fn forward<T: Elem>(&self, tok: &[T], pos: &[T]) -> Vec<T> {
        let (_, l, e) = self.shape;
        let rows = (ROWS_PER_TASK * e).max(1);
        // SAFETY: every row of the output is written whole (`e` elements from each table).
        unsafe {
            written_vec(self.ids.len() * e, |out| {
                out.par_chunks_mut(rows).enumerate().for_each(|(c, out)| {
                    for (i, o) in out.chunks_exact_mut(e.max(1)).enumerate() {
                        let r = c * ROWS_PER_TASK + i;
                        let t = &tok[self.ids[r] * e..][..e];
                        let p = &pos[self.pos[r % l] * e..][..e];
                        for ((o, &t), &p) in o.iter_mut().zip(t).zip(p) {
                            *o = t + p;
                        }
                    }
                })
            })
        }
    }

    /// The tables' gradients: each output row's gradient added into its token's and its
    /// position's row, in row order (the same sums whatever the thread count).
    fn backward<T: Elem>(
        &self,
        g: &[T],
        tables: (usize, usize),
        needs: (bool, bool),
    ) -> (Vec<T>, Vec<T>) {
        let (_, l, e) = self.shape;
        let scatter = |rows: usize, index: &dyn Fn(usize) -> usize| {
            let mut d = vec![T::ZERO; rows * e];
            for (r, g) in g.chunks_exact(e.max(1)).enumerate() {
                for (d, &g) in d[index(r) * e..][..e].iter_mut().zip(g) {
                    *d += g;
                }
            }
            d
        };
        let dt = match needs.0 {
            true => scatter(tables.0, &|r| self.ids[r]),
            false => Vec::new(),
        };
        let dp = match needs.1 {
            true => scatter(tables.1, &|r| self.pos[r % l]),
            false => Vec::new(),
        };
        (dt, dp)
    }
}

crate::cpu::custom_op!(CustomOp2 for EmbeddingSum, "embedding-sum", fwd: fwd, bwd: bwd);

impl EmbeddingSum {
    fn fwd(&self, [(s1, l1), (s2, l2)]: [CpuArg; 2]) -> Result<(CpuStorage, Shape)> {
        let (n, l, e) = self.shape;
        let out = match (s1, s2) {
            (CpuStorage::F32(_), CpuStorage::F32(_)) => CpuStorage::F32(
                self.forward(contiguous::<f32, _>(OP, s1, l1)?, contiguous(OP, s2, l2)?),
            ),
            (CpuStorage::F64(_), CpuStorage::F64(_)) => CpuStorage::F64(
                self.forward(contiguous::<f64, _>(OP, s1, l1)?, contiguous(OP, s2, l2)?),
            ),
            (other, _) => return Err(unsupported_dtype(OP, other.dtype())),
        };
        Ok((out, Shape::from((n, l, e))))
    }

    fn bwd(&self, [tok, pos]: [&Tensor; 2], _: &Tensor, grad: &Tensor) -> Result<Grads<2>> {
        let needs = (tok.track_op(), pos.track_op());
        let tables = (tok.dim(0)?, pos.dim(0)?);
        let grad = grad.contiguous()?;
        let (gs, gl) = grad.storage_and_layout();
        match &*gs {
            Storage::Cpu(CpuStorage::F32(_)) => {
                self.grads(contiguous::<f32, _>(OP, &*gs, gl)?, tables, needs)
            }
            Storage::Cpu(CpuStorage::F64(_)) => {
                self.grads(contiguous::<f64, _>(OP, &*gs, gl)?, tables, needs)
            }
            other => Err(unsupported_dtype(OP, other.dtype())),
        }
    }
}

impl EmbeddingSum {
    /// [`EmbeddingSum::backward`] as tensors, `None` where not needed.
    fn grads<T: Elem>(
        &self,
        g: &[T],
        tables: (usize, usize),
        needs: (bool, bool),
    ) -> Result<Grads<2>> {
        let e = self.shape.2;
        let (dt, dp) = self.backward(g, tables, needs);
        let tensor = |d: Vec<T>, rows: usize| Tensor::from_vec(d, (rows, e), &Device::Cpu);
        Ok([
            needs.0.then(|| tensor(dt, tables.0)).transpose()?,
            needs.1.then(|| tensor(dp, tables.1)).transpose()?,
        ])
    }
}
