//! The CPU kernels of fused attention: forward (online softmax, FlashAttention-2 order),
//! backward (probabilities recomputed from the row log-sum-exp) and the weights pass, one file
//! each, over the tile helpers of `tiles.rs`; this file holds the types they share.
//!
//! Tile products run on the calling thread, their right operands packed once per head in
//! panels (`crate::cpu::panels`: the `gemm` crate repacked the same keys and values for every
//! query tile, 8% of a long forward pass); the parallelism is over batch × heads (× query
//! tiles in the forward and weights passes) with rayon. Nothing of size `L × S` is ever
//! allocated except the weights the caller asked for.

mod backward;
mod decode;
mod forward;
mod panels;
pub(crate) mod small_gemm;
mod tiles;
mod weights;

pub(crate) use backward::backward;
pub(crate) use decode::{decode, DecodeGeom};
pub(crate) use forward::forward;
// The products bench's way in to the tiles (`bench_internals`).
#[cfg(feature = "bench-internals")]
pub(crate) use panels::{gemm_panels, pack_rows, pack_transposed, panels_len, Panels};
pub(crate) use weights::{forward_with_weights, weights};

/// Sizes of one call, in head space.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geom {
    /// Batch `N`.
    pub n: usize,
    /// Heads `H`.
    pub h: usize,
    /// Queries `L`.
    pub l: usize,
    /// Keys `S'`, including the `bias_k` / zero-attention columns.
    pub s: usize,
    /// Head dim.
    pub d: usize,
    /// The first `s_masked` keys are the ones masks and the causal rule apply to; the
    /// `bias_k` / zero-attention columns after them are never masked (PyTorch pads the masks
    /// with zeros there).
    pub s_masked: usize,
    /// Key `j` (< `s_masked`) is masked for query `i` when `j > i`.
    pub causal: bool,
    /// Factor of `q·k` (PyTorch: `1/√d`).
    pub scale: f64,
    /// Query heads per key/value head (grouped-query attention; 1 for the module): query head
    /// `h` reads key/value head `h / group`, and k, v and their gradients have `H / group`
    /// heads.
    pub group: usize,
}

impl Geom {
    /// Key/value heads.
    pub(crate) fn kv_heads(&self) -> usize {
        self.h / self.group.max(1)
    }

    /// The key/value head query head `h` reads.
    #[inline(always)]
    pub(crate) fn kv_head(&self, h: usize) -> usize {
        h / self.group.max(1)
    }

    /// Whether the kernels' tasks go to rayon's pool: the multiply-adds of one `q·kᵀ`
    /// (`N·H·L·S'·d`) against [`crate::cpu::par::parallel`]'s threshold.
    pub(crate) fn parallel(&self) -> bool {
        crate::cpu::par::parallel(self.n * self.h * self.l * self.s * self.d)
    }
}

/// Where the rows of q, k, v, the output or a gradient live: row `(b, h, i)` starts at
/// `off + b·sb + h·sh + i·si`, and its `d` elements are contiguous.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowMap {
    pub off: usize,
    pub sb: usize,
    pub sh: usize,
    pub si: usize,
}

impl RowMap {
    #[inline(always)]
    pub(super) fn at(&self, b: usize, h: usize, i: usize) -> usize {
        self.off + b * self.sb + h * self.sh + i * self.si
    }
}

/// Additive masks over the first `s_masked` keys, in the kernel's dtype.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Masks<'a, T> {
    /// `(L, s_masked)`, or `(N·H, L, s_masked)` when the flag is set.
    pub attn: Option<(&'a [T], bool)>,
    /// `(N, s_masked)`.
    pub kpm: Option<&'a [T]>,
}

/// A tensor read by the kernels: its data and where its rows are.
#[derive(Clone, Copy)]
pub(crate) struct Rows<'a, T> {
    pub data: &'a [T],
    pub map: RowMap,
}

/// A tensor written by the kernels from several threads; every task writes its own rows.
#[derive(Clone, Copy)]
pub(crate) struct RowsMut<T> {
    ptr: *mut T,
    pub(super) len: usize,
    pub map: RowMap,
}

// SAFETY: tasks write disjoint rows (see each kernel), and the buffer outlives the tasks.
unsafe impl<T: Send> Send for RowsMut<T> {}
unsafe impl<T: Send> Sync for RowsMut<T> {}

impl<T> RowsMut<T> {
    pub fn new(data: &mut [T], map: RowMap) -> Self {
        Self {
            ptr: data.as_mut_ptr(),
            len: data.len(),
            map,
        }
    }

    /// A buffer that the kernel fills, every element of it (its contents before are never
    /// read): no zero fill for a large output that is about to be overwritten.
    pub fn new_uninit(data: &mut [std::mem::MaybeUninit<T>], map: RowMap) -> Self {
        Self {
            ptr: data.as_mut_ptr().cast(),
            len: data.len(),
            map,
        }
    }

    /// Pointer to element `col` of row `(b, h, i)`.
    ///
    /// # Safety
    /// The element must be within the buffer.
    #[inline(always)]
    pub(super) unsafe fn at(&self, b: usize, h: usize, i: usize, col: usize) -> *mut T {
        let idx = self.map.at(b, h, i) + col;
        debug_assert!(idx < self.len);
        self.ptr.add(idx)
    }
}

#[cfg(test)]
mod tests;
