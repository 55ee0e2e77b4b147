//! The data-parallel side of `mha train`: the communicator `--dist` asks for, and the
//! test-only fault injection (`MHA_FAULT_INJECT`) the failure tests use.

use std::time::Duration;

use anyhow::{bail, Result};
use candle_mha::candle::{Device, Result as CandleResult};
use candle_mha::data::{Dataset, Example, TrainSource};
use candle_mha::training::distributed::{Communicator, SingleProcess};

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
    use candle_mha::training::distributed::MpiCommunicator;
    Ok(Box::new(MpiCommunicator::init(timeout)?))
}

#[cfg(not(feature = "mpi"))]
fn mpi(_timeout: Duration) -> Result<Box<dyn Communicator>> {
    bail!("data parallelism over MPI needs an mha built with the `mpi` feature (cargo build --release --features mpi; Debian: apt install libopenmpi-dev openmpi-bin libclang-dev)")
}

#[cfg(feature = "nccl")]
fn nccl(device: &Device, timeout: Duration) -> Result<Box<dyn Communicator>> {
    use candle_mha::training::distributed::NcclCommunicator;
    Ok(Box::new(NcclCommunicator::init(device, timeout)?))
}

#[cfg(not(feature = "nccl"))]
fn nccl(_device: &Device, _timeout: Duration) -> Result<Box<dyn Communicator>> {
    bail!("--dist nccl needs an mha built with the `nccl` feature (cargo build --release --features nccl, with CUDA)")
}

/// What `MHA_FAULT_INJECT=RANK:STEP:KIND` makes rank RANK do when it draws the examples of
/// step STEP (1-based): `error` returns an error, `kill` kills the process with SIGKILL,
/// `hang` sleeps for an hour. For the failure tests of data-parallel training only.
#[derive(Clone, Debug)]
pub struct Fault {
    rank: usize,
    step: u64,
    kind: String,
}

impl Fault {
    /// The fault `MHA_FAULT_INJECT` asks of rank `rank`, if any.
    pub fn from_env(rank: usize) -> Result<Option<Self>> {
        let Ok(spec) = std::env::var("MHA_FAULT_INJECT") else {
            return Ok(None);
        };
        let parts: Vec<&str> = spec.split(':').collect();
        let parsed = match parts.as_slice() {
            [r, s, k] if ["error", "kill", "hang"].contains(k) => {
                r.parse().ok().zip(s.parse().ok()).map(|(r, s)| (r, s, k))
            }
            _ => None,
        };
        let Some((r, step, kind)) = parsed else {
            bail!("MHA_FAULT_INJECT={spec}: expected RANK:STEP:error|kill|hang")
        };
        Ok((r == rank).then(|| Fault {
            rank: r,
            step,
            kind: kind.to_string(),
        }))
    }
}

/// A training source that fails as its [`Fault`] says.
pub struct Faulty<'a> {
    pub inner: &'a dyn TrainSource,
    pub fault: Fault,
}

impl TrainSource for Faulty<'_> {
    fn examples(&self, seed: u64, step: u64, count: usize) -> CandleResult<Vec<Example>> {
        if step + 1 == self.fault.step {
            let (rank, step) = (self.fault.rank, self.fault.step);
            match self.fault.kind.as_str() {
                "error" => {
                    candle_mha::candle::bail!("MHA_FAULT_INJECT: rank {rank} fails at step {step}")
                }
                "kill" => {
                    eprintln!("MHA_FAULT_INJECT: rank {rank} kills itself at step {step}");
                    let _ = std::process::Command::new("kill")
                        .args(["-KILL", &std::process::id().to_string()])
                        .status();
                    std::thread::sleep(Duration::from_secs(3600));
                }
                _ => {
                    eprintln!("MHA_FAULT_INJECT: rank {rank} hangs at step {step}");
                    std::thread::sleep(Duration::from_secs(3600));
                }
            }
        }
        self.inner.examples(seed, step, count)
    }

    fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    fn fallback_eval(&self, seed: u64) -> CandleResult<std::borrow::Cow<'_, Dataset>> {
        self.inner.fallback_eval(seed)
    }
}
