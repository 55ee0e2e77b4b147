//! [`NcclCommunicator`]: data parallelism on GPUs (feature `nccl`): one process per GPU
//! started by `mpirun`, the gradient all-reduce by NCCL on the GPU, everything else (ranks,
//! the NCCL unique id, the few host values of a step, barriers, the timeout) by
//! [`MpiCommunicator`], so a GPU run takes the code path of an MPI run apart from the
//! all-reduce of the gradients.
//!
//! Compiled in CI (`scripts/build-cuda.sh --check`); never run on this project's machines
//! (no GPU): see the README.

use std::time::Duration;

use candle::cuda_backend::cudarc::driver::{DeviceRepr, ValidAsZeroBits};
use candle::cuda_backend::cudarc::nccl::{Comm, Id, NcclType, ReduceOp};
use candle::cuda_backend::{CudaDType, CudaDevice, CudaStorage};
use candle::op::BackpropOp;
use candle::{DType, Device, Result, Storage, Tensor};

use super::{check_flat, Communicator, MpiCommunicator};

/// MPI for ranks and host values, NCCL for the all-reduce of tensors on the GPU.
///
/// PyTorch equivalent: `torch.distributed.init_process_group("nccl")` under `mpirun`, one
/// process per GPU.
pub struct NcclCommunicator {
    // Dropped before MPI is finalized.
    comm: Comm,
    device: CudaDevice,
    mpi: MpiCommunicator,
}

impl NcclCommunicator {
    /// Creates the NCCL communicator of the MPI world on `device` (this rank's GPU): rank 0
    /// makes the unique id and broadcasts it over MPI. `timeout` as in
    /// [`MpiCommunicator::init`].
    pub fn init(device: &Device, timeout: Duration) -> Result<Self> {
        let Device::Cuda(cuda) = device else {
            candle::bail!("the nccl backend needs a CUDA device, got {device:?}")
        };
        let mpi = MpiCommunicator::init(timeout)?;
        let id = match mpi.rank() {
            0 => Some(Id::new().map_err(|e| nccl_error("creating the unique id", e))?),
            _ => None,
        };
        let mut bytes = [0u8; 128];
        if let Some(id) = &id {
            for (b, c) in bytes.iter_mut().zip(id.internal()) {
                *b = *c as u8;
            }
        }
        mpi.broadcast_bytes(&mut bytes, 0, "broadcast of the NCCL unique id")?;
        let id = id.unwrap_or_else(|| Id::uninit(bytes.map(|b| b as _)));
        let comm = Comm::from_rank(cuda.cuda_stream(), mpi.rank(), mpi.world_size(), id)
            .map_err(|e| nccl_error("ncclCommInitRank", e))?;
        Ok(Self {
            comm,
            device: cuda.clone(),
            mpi,
        })
    }

    fn reduce<T>(&self, flat: &Tensor, what: &str) -> Result<Tensor>
    where
        T: CudaDType + NcclType + DeviceRepr + ValidAsZeroBits,
    {
        let n = flat.elem_count();
        let flat = flat.contiguous()?;
        let (storage, layout) = flat.storage_and_layout();
        let Storage::Cuda(src) = &*storage else {
            candle::bail!("nccl all_reduce_sum: the tensor is not on the GPU")
        };
        let start = layout.start_offset();
        let src = src.as_cuda_slice::<T>()?.slice(start..start + n);
        let mut dst = self.device.alloc_zeros::<T>(n)?;
        {
            // NCCL only enqueues: the watch covers the wait for the result too.
            let _watch = self.mpi.watch(what);
            self.comm
                .all_reduce(&src, &mut dst, &ReduceOp::Sum)
                .map_err(|e| nccl_error(what, e))?;
            self.comm
                .stream()
                .synchronize()
                .map_err(|e| candle::Error::Msg(format!("{what}: {e:?}")))?;
        }
        let out = CudaStorage::wrap_cuda_slice(dst, self.device.clone());
        Ok(Tensor::from_storage(
            Storage::Cuda(out),
            n,
            BackpropOp::none(),
            false,
        ))
    }
}

fn nccl_error(what: &str, e: impl std::fmt::Debug) -> candle::Error {
    candle::Error::Msg(format!("NCCL: {what}: {e:?}"))
}

impl Communicator for NcclCommunicator {
    fn rank(&self) -> usize {
        self.mpi.rank()
    }

    fn world_size(&self) -> usize {
        self.mpi.world_size()
    }

    fn backend(&self) -> &'static str {
        "nccl"
    }

    fn all_reduce_sum(&self, flat: &Tensor, what: &str) -> Result<Tensor> {
        check_flat(flat, "all_reduce_sum")?;
        if !flat.device().is_cuda() {
            return self.mpi.all_reduce_sum(flat, what);
        }
        match flat.dtype() {
            DType::F32 => self.reduce::<f32>(flat, what),
            _ => self.reduce::<f64>(flat, what),
        }
    }

    fn all_reduce_sum_f64(&self, values: &mut [f64], what: &str) -> Result<()> {
        self.mpi.all_reduce_sum_f64(values, what)
    }

    fn broadcast(&self, flat: &Tensor, root: usize, what: &str) -> Result<Tensor> {
        // Once per run (the initial weights): over MPI through host memory.
        let host = self
            .mpi
            .broadcast(&flat.to_device(&Device::Cpu)?, root, what)?;
        host.to_device(flat.device())
    }

    fn barrier(&self, what: &str) -> Result<()> {
        self.mpi.barrier(what)
    }

    fn abort(&self, code: i32) -> ! {
        self.mpi.abort(code)
    }
}
