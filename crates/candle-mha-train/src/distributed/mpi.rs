//! [`MpiCommunicator`]: the communicator of a run started with `mpirun -n N` (feature `mpi`,
//! the `mpi` crate on the system's MPI library, Open MPI on Debian).

use std::time::Duration;

use candle::{DType, Result, Tensor};
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator as _, CommunicatorCollectives, Root};
use mpi::Threading;

use super::watchdog::Watchdog;
use super::{check_flat, rank_prefix, Communicator};

/// The ranks of `MPI_COMM_WORLD`; collectives are MPI's (`MPI_Allreduce` with `MPI_SUM`,
/// `MPI_Bcast`, `MPI_Barrier`) on host buffers, each watched by a timeout.
///
/// MPI allows one initialization per process: create it once, at the start of `main`, and
/// keep it until the end (dropping it finalizes MPI).
///
/// PyTorch equivalent: `torch.distributed.init_process_group("mpi", timeout=...)`.
pub struct MpiCommunicator {
    // Dropped first: the watchdog thread ends before MPI is finalized.
    watchdog: Watchdog,
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
    // Dropped last: finalizes MPI.
    _universe: Universe,
}

impl MpiCommunicator {
    /// Initializes MPI. A collective that has not returned after `timeout` ends the run with
    /// `MPI_Abort` and a message naming this rank and the collective (`Duration::ZERO`: no
    /// timeout). Errors when MPI was already initialized in this process.
    pub fn init(timeout: Duration) -> Result<Self> {
        // MPI_THREAD_MULTIPLE lets the watchdog thread call MPI_Abort while the main thread
        // waits in a collective; with less, it ends this process and mpirun ends the others.
        let (universe, threading) = mpi::initialize_with_threading(Threading::Multiple)
            .ok_or_else(|| {
                candle::Error::Msg("MPI is already initialized in this process".into())
            })?;
        let world = universe.world();
        let rank = usize::try_from(world.rank()).unwrap_or(0);
        let size = usize::try_from(world.size()).unwrap_or(1);
        let multiple = threading == Threading::Multiple;
        let watchdog = Watchdog::start(
            rank_prefix(rank, size),
            timeout,
            Box::new(move |msg| {
                eprintln!("error: {msg}");
                if multiple {
                    // SAFETY: MPI is initialized with MPI_THREAD_MULTIPLE, so any thread may
                    // call MPI_Abort; it does not return.
                    unsafe {
                        mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, 124);
                    }
                }
                std::process::exit(124);
            }),
        );
        Ok(Self {
            watchdog,
            world,
            rank,
            size,
            _universe: universe,
        })
    }

    fn reduce<T>(&self, send: &[T], what: &str) -> Vec<T>
    where
        T: mpi::datatype::Equivalence + Copy + Default,
    {
        let mut recv = vec![T::default(); send.len()];
        let _watch = self.watchdog.watch(what);
        self.world
            .all_reduce_into(send, &mut recv[..], SystemOperation::sum());
        recv
    }

    fn bcast<T>(&self, buf: &mut [T], root: usize, what: &str) -> Result<()>
    where
        T: mpi::datatype::Equivalence,
    {
        let root = self.root(root)?;
        let _watch = self.watchdog.watch(what);
        self.world.process_at_rank(root).broadcast_into(buf);
        Ok(())
    }

    fn root(&self, root: usize) -> Result<i32> {
        if root >= self.size {
            candle::bail!(
                "broadcast: root rank {root} is not in a world of {} ranks",
                self.size
            )
        }
        Ok(root as i32)
    }

    /// Broadcasts bytes (the NCCL unique id) from `root`.
    #[cfg(feature = "nccl")]
    pub(crate) fn broadcast_bytes(&self, buf: &mut [u8], root: usize, what: &str) -> Result<()> {
        self.bcast(buf, root, what)
    }

    /// Starts watching a collective another backend runs (NCCL's all-reduce).
    #[cfg(feature = "nccl")]
    pub(crate) fn watch(&self, what: &str) -> super::watchdog::Watch<'_> {
        self.watchdog.watch(what)
    }
}

impl Communicator for MpiCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn backend(&self) -> &'static str {
        "mpi"
    }

    fn all_reduce_sum(&self, flat: &Tensor, what: &str) -> Result<Tensor> {
        check_flat(flat, "all_reduce_sum")?;
        let device = flat.device();
        match flat.dtype() {
            DType::F32 => {
                let sum = self.reduce(&flat.to_vec1::<f32>()?, what);
                Tensor::from_vec(sum, flat.elem_count(), device)
            }
            _ => {
                let sum = self.reduce(&flat.to_vec1::<f64>()?, what);
                Tensor::from_vec(sum, flat.elem_count(), device)
            }
        }
    }

    fn all_reduce_sum_f64(&self, values: &mut [f64], what: &str) -> Result<()> {
        let sum = self.reduce(values, what);
        values.copy_from_slice(&sum);
        Ok(())
    }

    fn broadcast(&self, flat: &Tensor, root: usize, what: &str) -> Result<Tensor> {
        check_flat(flat, "broadcast")?;
        let device = flat.device();
        match flat.dtype() {
            DType::F32 => {
                let mut buf = flat.to_vec1::<f32>()?;
                self.bcast(&mut buf[..], root, what)?;
                Tensor::from_vec(buf, flat.elem_count(), device)
            }
            _ => {
                let mut buf = flat.to_vec1::<f64>()?;
                self.bcast(&mut buf[..], root, what)?;
                Tensor::from_vec(buf, flat.elem_count(), device)
            }
        }
    }

    fn barrier(&self, what: &str) -> Result<()> {
        let _watch = self.watchdog.watch(what);
        self.world.barrier();
        Ok(())
    }

    fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }
}
