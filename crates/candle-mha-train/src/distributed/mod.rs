//! Data-parallel training's communication: the [`Communicator`] interface (rank, world size,
//! all-reduce, broadcast, barrier) and its backends, the split of a step's global batch over
//! the ranks ([`shard_range`]) and the bucketed gradient all-reduce ([`GradientBuckets`]).
//!
//! - `single.rs`: [`SingleProcess`], one rank, no dependency (today's `mha train`).
//! - `mpi.rs` (feature `mpi`): `MpiCommunicator` on the system's MPI (`mpirun -n N`).
//! - `nccl.rs` (feature `nccl`): `NcclCommunicator`, MPI for everything but the gradient
//!   all-reduce, which NCCL does on the GPU (one process per GPU).
//! - `watchdog.rs`: the timeout on collectives that stops a run whose peer died or hangs.
//! - `buckets.rs`: gradients flattened in the optimizer's fixed order into buckets.
//!
//! The trainer (`run/data_parallel.rs`) uses this module; nothing here knows the trainer.

mod buckets;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "nccl")]
mod nccl;
mod single;
// Used by the MPI backend; built (and unit-tested) without it too.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
mod watchdog;

use candle::{Result, Tensor};

pub use buckets::{GradientBuckets, DEFAULT_BUCKET_BYTES};
#[cfg(feature = "mpi")]
pub use mpi::MpiCommunicator;
#[cfg(feature = "nccl")]
pub use nccl::NcclCommunicator;
pub use single::SingleProcess;

/// The collective operations data-parallel training needs. Every rank calls the same
/// collectives in the same order; `what` names the call (step and purpose) in the error a
/// timeout gives.
///
/// PyTorch equivalent: a `torch.distributed` process group (`get_rank`, `get_world_size`,
/// `all_reduce(op=SUM)`, `broadcast`, `barrier`) on the `mpi` or `nccl` backend.
pub trait Communicator {
    /// This process's rank, `0..world_size()`; rank 0 evaluates, logs and saves.
    ///
    /// PyTorch equivalent: `torch.distributed.get_rank()`.
    fn rank(&self) -> usize;

    /// The number of ranks.
    ///
    /// PyTorch equivalent: `torch.distributed.get_world_size()`.
    fn world_size(&self) -> usize;

    /// The backend's name, for messages (`single`, `mpi`, `nccl`).
    ///
    /// PyTorch equivalent: `torch.distributed.get_backend()`.
    fn backend(&self) -> &'static str;

    /// The element-wise sum over all ranks of a 1-D f32 or f64 tensor, returned on every rank
    /// (same device as `flat`). Errors on another rank or dtype, naming it.
    ///
    /// PyTorch equivalent: `torch.distributed.all_reduce(flat, op=ReduceOp.SUM)`.
    fn all_reduce_sum(&self, flat: &Tensor, what: &str) -> Result<Tensor>;

    /// The element-wise sum over all ranks of a few host values (losses, token counts,
    /// flags), in place.
    ///
    /// PyTorch equivalent: `torch.distributed.all_reduce(torch.tensor(values), op=SUM)`.
    fn all_reduce_sum_f64(&self, values: &mut [f64], what: &str) -> Result<()>;

    /// Rank `root`'s 1-D f32 or f64 tensor, returned on every rank; `flat` must have the same
    /// length and dtype on every rank.
    ///
    /// PyTorch equivalent: `torch.distributed.broadcast(flat, src=root)`.
    fn broadcast(&self, flat: &Tensor, root: usize, what: &str) -> Result<Tensor>;

    /// Returns once every rank has called it.
    ///
    /// PyTorch equivalent: `torch.distributed.barrier()`.
    fn barrier(&self, what: &str) -> Result<()>;

    /// Ends every rank of the run now with exit status `code` (after this rank failed: the
    /// others would otherwise wait for it in their next collective).
    ///
    /// PyTorch equivalent: none in `torch.distributed`; `MPI_Abort`, or `torchrun` stopping
    /// the other workers when one exits with an error.
    fn abort(&self, code: i32) -> !;
}

/// The examples of a batch of `n` that rank `rank` of `world` takes: a contiguous range, the
/// first `n % world` ranks one example more than the others (so sizes differ by at most one;
/// with `n < world` the last ranks take none). Errors when `rank >= world` or `world == 0`.
///
/// PyTorch equivalent: `torch.utils.data.DistributedSampler(..., drop_last=False)` without
/// the padding by repeated examples (its shards are strided, these contiguous).
pub fn shard_range(n: usize, rank: usize, world: usize) -> Result<std::ops::Range<usize>> {
    if world == 0 || rank >= world {
        candle::bail!("shard_range: rank {rank} is not in a world of {world} rank(s)")
    }
    let (base, extra) = (n / world, n % world);
    let start = rank * base + rank.min(extra);
    let len = base + usize::from(rank < extra);
    Ok(start..start + len)
}

/// Rank `rank` of `world` as a prefix for messages: `"rank 1 of 4: "`, nothing for one rank.
pub fn rank_prefix(rank: usize, world: usize) -> String {
    if world > 1 {
        format!("rank {rank} of {world}: ")
    } else {
        String::new()
    }
}

/// Checks that a tensor given to a collective is 1-D f32 or f64.
pub(crate) fn check_flat(flat: &Tensor, op: &str) -> Result<()> {
    if flat.rank() != 1 {
        candle::bail!("{op}: expected a 1-D tensor, got shape {:?}", flat.dims())
    }
    if !matches!(flat.dtype(), candle::DType::F32 | candle::DType::F64) {
        candle::bail!("{op}: expected f32 or f64, got {:?}", flat.dtype())
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_the_batch_in_order() {
        for n in 0..12 {
            for world in 1..6 {
                let ranges: Vec<_> = (0..world)
                    .map(|r| shard_range(n, r, world).unwrap())
                    .collect();
                assert_eq!(ranges[0].start, 0);
                assert_eq!(ranges[world - 1].end, n);
                for w in ranges.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                    assert!(w[0].len() >= w[1].len() && w[0].len() <= w[1].len() + 1);
                }
            }
        }
        assert_eq!(shard_range(5, 0, 2).unwrap(), 0..3);
        assert_eq!(shard_range(5, 1, 2).unwrap(), 3..5);
        assert!(shard_range(5, 2, 2).is_err());
        assert!(shard_range(5, 0, 0).is_err());
    }
}
