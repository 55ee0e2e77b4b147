//! The data-parallel side of `mha train`: the communicator `--dist` asks for.

use std::time::Duration;

use anyhow::{bail, Result};
use candle_mha::candle::Device;
use candle_mha_train::distributed::{Communicator, SingleProcess};

use super::args::Dist;
use super::TrainArgs;

/// The communicator of this process: `--dist`, and for `auto` whether `mpirun` started it
/// (`--dist-timeout` was range-checked by the parser).
pub fn communicator(args: &TrainArgs, device: &Device) -> Result<Box<dyn Communicator>> {
    let timeout = Duration::from_secs_f64(args.dist_timeout);
    let launched = launched_ranks();
    let dist = match args.dist {
        Dist::Auto if launched.is_some() => {
            if device.is_cuda() && cfg!(feature = "nccl") {
                Dist::Nccl
            } else {
                Dist::Mpi
            }
        }
        Dist::Auto => Dist::Single,
        other => other,
    };
    match dist {
        Dist::Auto | Dist::Single => {
            if let Some(n) = launched.filter(|&n| n > 1) {
                // N copies of one run would all write into --out.
                bail!("started as one of {n} MPI ranks with --dist single: launch one process, or use --dist mpi")
            }
            Ok(Box::new(SingleProcess))
        }
        Dist::Mpi => mpi(timeout),
        Dist::Nccl => nccl(device, timeout),
    }
}

/// This rank's device, opened once: under an MPI launcher, `cuda` (or `auto` on a machine
/// with a GPU) means the rank's own GPU, `cuda:LOCAL_RANK` (its index on its machine, one GPU
/// per rank); otherwise `spec` as given.
pub fn rank_device(spec: &str) -> Result<(Device, String)> {
    let local_rank = ["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"]
        .iter()
        .find_map(|v| std::env::var(v).ok())
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&r| r > 0);
    match (spec, local_rank) {
        ("cuda", Some(r)) => Ok(crate::device::open(&format!("cuda:{r}"))?),
        // `auto` falls back to what it means without a launcher: the CPU when this GPU is not
        // there (or the build has no CUDA).
        ("auto", Some(r)) if candle_mha::candle::utils::cuda_is_available() => {
            crate::device::open(&format!("cuda:{r}")).or_else(|_| Ok(crate::device::open(spec)?))
        }
        _ => Ok(crate::device::open(spec)?),
    }
}

/// The world size an MPI launcher announced in the environment, without initializing MPI
/// (Open MPI, MPICH/PMI, PMIx).
fn launched_ranks() -> Option<usize> {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"]
        .iter()
        .find_map(|v| std::env::var(v).ok())
        .and_then(|v| v.parse().ok())
        .or_else(|| std::env::var_os("PMIX_RANK").map(|_| 1))
}

#[cfg(feature = "mpi")]
fn mpi(timeout: Duration) -> Result<Box<dyn Communicator>> {
    use candle_mha_train::distributed::MpiCommunicator;
    Ok(Box::new(MpiCommunicator::init(timeout)?))
}

#[cfg(not(feature = "mpi"))]
fn mpi(_timeout: Duration) -> Result<Box<dyn Communicator>> {
    bail!("data parallelism over MPI needs an mha built with the `mpi` feature (cargo build --release --features mpi; Debian: apt install libopenmpi-dev openmpi-bin libclang-dev)")
}

#[cfg(feature = "nccl")]
fn nccl(device: &Device, timeout: Duration) -> Result<Box<dyn Communicator>> {
    use candle_mha_train::distributed::NcclCommunicator;
    Ok(Box::new(NcclCommunicator::init(device, timeout)?))
}

#[cfg(not(feature = "nccl"))]
fn nccl(_device: &Device, _timeout: Duration) -> Result<Box<dyn Communicator>> {
    bail!("--dist nccl needs an mha built with the `nccl` feature (cargo build --release --features nccl, with CUDA)")
}
