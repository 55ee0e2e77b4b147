//! Fault injection for the failure tests of data-parallel training, built only with the
//! `fault-injection` feature (the tests enable it; a shipped `mha` has none).

use std::time::Duration;

use anyhow::{bail, Result};
use candle_mha::candle::Result as CandleResult;
use candle_mha_train::data::{Dataset, Example, TrainSource};
use candle_mha_train::distributed::Communicator;
use candle_mha_train::{Evaluation, Session, TrainObserver};

/// [`Session::run`], with the training source failing as `MHA_FAULT_INJECT` asks of this rank.
pub fn run(
    session: &mut Session,
    comm: &dyn Communicator,
    observer: &mut dyn TrainObserver,
) -> Result<Option<Evaluation>> {
    let Some(fault) = Fault::from_env(comm.rank())? else {
        return Ok(session.run(comm, observer)?);
    };
    let Session {
        trainer, data, dir, ..
    } = session;
    let val = data.eval_set();
    let source = Faulty {
        inner: &*data.train,
        fault,
    };
    Ok(trainer.run_distributed(comm, &source, &val, Some(dir), observer)?)
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

    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn fallback_eval(&self, seed: u64) -> CandleResult<std::borrow::Cow<'_, Dataset>> {
        self.inner.fallback_eval(seed)
    }
}
