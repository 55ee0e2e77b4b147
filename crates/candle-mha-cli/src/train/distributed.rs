//! The data-parallel side of `mha train`: the communicator `--dist` asks for.

use std::time::Duration;

use anyhow::{bail, Result};
use candle_mha::candle::Device;
use candle_mha_train::distributed::{Communicator, SingleProcess};

use super::TrainArgs;

/// The communicator of this process: `--dist`, and for `auto` whether `mpirun` started it.
pub fn communicator(args: &TrainArgs, device: &Device) -> Result<Box<dyn Communicator>> {
    if !(args.dist_timeout >= 0.0 && args.dist_timeout.is_finite()) {
        bail!(
            "--dist-timeout {}: expected seconds >= 0 (0 = no timeout)",
            args.dist_timeout
        )
    }
    let timeout = Duration::from_secs_f64(args.dist_timeout);
    let launched = launched_ranks();
    let dist = match args.dist.as_str() {
        "auto" if launched.is_some() => {
            if device.is_cuda() && cfg!(feature = "nccl") {
                "nccl"
            } else {
                "mpi"
            }
        }
        "auto" => "single",
        other => other,
    };
    match dist {
        "single" => {
            if let Some(n) = launched.filter(|&n| n > 1) {
                // N copies of one run would all write into --out.
                bail!("started as one of {n} MPI ranks with --dist single: launch one process, or use --dist mpi")
            }
            Ok(Box::new(SingleProcess))
        }
        "mpi" => mpi(timeout),
        "nccl" => nccl(device, timeout),
        other => bail!("--dist {other}: expected auto, single, mpi or nccl"),
    }
}

/// Under an MPI launcher, the GPU of this rank when `--device` chose the first one (`cuda`,
/// or `auto` on a machine with a GPU): `cuda:LOCAL_RANK`, the rank's index on its machine,
/// one GPU per rank. `None`: keep the device (the CPU, or a `cuda:N` given).
pub fn rank_gpu(spec: &str, device: &Device) -> Option<String> {
    let local_rank = ["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"]
        .iter()
        .find_map(|v| std::env::var(v).ok())
        .and_then(|v| v.parse::<usize>().ok())?;
    (device.is_cuda() && (spec == "cuda" || spec == "auto") && local_rank > 0)
        .then(|| format!("cuda:{local_rank}"))
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
