//! What a run records and reports: [`TrainerState`] (`trainer_state.json`), [`StepStats`],
//! the [`TrainObserver`] hooks, and the file names of a checkpoint directory.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{Evaluation, TrainConfig};
use crate::data::DataSpec;

/// One evaluation in the run's history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvalRecord {
    /// Steps done when it ran.
    pub step: u64,
    /// The metrics.
    pub eval: Evaluation,
}

/// Everything about a run that is not tensors: `trainer_state.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Optimizer steps done.
    pub step: u64,
    /// The run's hyper-parameters.
    pub config: TrainConfig,
    /// Training loss of every step so far.
    pub losses: Vec<f32>,
    /// Evaluations so far.
    pub evals: Vec<EvalRecord>,
    /// What the run trains on, when it can be rebuilt from a description (`None`: the
    /// caller gave its data directly); what a resume, `mha eval` and `mha inspect` reopen.
    pub data: Option<DataSpec>,
    /// The validation evaluation with the lowest loss so far (its weights are in `best/`).
    #[serde(default)]
    pub best: Option<EvalRecord>,
    /// Whether the run stopped early (`early_stop` evaluations without improvement).
    #[serde(default)]
    pub stopped_early: bool,
}

/// What one step did.
#[derive(Clone, Copy, Debug)]
pub struct StepStats {
    /// Training loss of the batch.
    pub loss: f32,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Target positions counted in the loss.
    pub tokens: usize,
    /// Input positions processed (`N × L` summed over the micro-batches, padding included).
    pub input_tokens: usize,
    /// Sequences in the update (over all micro-batches).
    pub sequences: usize,
    /// Seconds this rank spent in the step's collectives (the all-reduces of the loss and the
    /// gradients, waiting for the slowest rank included); 0 in one process.
    pub comm_seconds: f64,
}

/// Hooks the loop calls: progress display, early stop (Ctrl-C).
pub trait TrainObserver {
    /// After each step.
    fn on_step(&mut self, _step: u64, _stats: &StepStats) {}
    /// After each evaluation.
    fn on_eval(&mut self, _step: u64, _eval: &Evaluation) {}
    /// After each checkpoint.
    fn on_save(&mut self, _step: u64, _dir: &Path) {}
    /// After a validation evaluation that set a new best loss and was saved into `dir`.
    fn on_best(&mut self, _step: u64, _eval: &Evaluation, _dir: &Path) {}
    /// At each point of a checkpoint save into `dir` (before and after each file write and
    /// rename, [`crate::io::CommitPoint`]): an error stops the save there, leaving the files
    /// as a crash at that point would. For fault-injection tests; the default does nothing.
    fn at_commit_point(
        &mut self,
        _dir: &Path,
        _point: &crate::io::CommitPoint,
    ) -> candle::Result<()> {
        Ok(())
    }
    /// Whether to stop now (a checkpoint is written first).
    fn should_stop(&self) -> bool {
        false
    }
}

impl TrainObserver for () {}

/// The model's files in a checkpoint directory.
pub const MODEL_FILE: &str = "model.safetensors";
/// The model's configuration in a checkpoint directory.
pub const CONFIG_FILE: &str = "config.json";
/// The optimizer's state in a checkpoint directory.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// The trainer's state in a checkpoint directory.
pub const STATE_FILE: &str = "trainer_state.json";
/// The subdirectory of a run directory holding the checkpoint of the best validation loss.
pub const BEST_DIR: &str = "best";
