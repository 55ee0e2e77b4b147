//! What a run records and reports: [`TrainerState`] (`trainer_state.json`), [`StepStats`],
//! the [`TrainObserver`] hooks, and the file names of a checkpoint directory.

use crate::run_dir::{
    CHECKPOINT_FILES, CONFIG_FILE, LORA_FILE, MANIFEST_FILE, MODEL_FILE, STATE_FILE,
};
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
    /// The file's format: [`STATE_VERSION`]; 0 (absent) in runs saved before paths were
    /// recorded relative to the checkpoint directory (theirs are as given, relative to the
    /// working directory of the run).
    #[serde(default)]
    pub version: u32,
    /// The parameters' dtype (`"f32"`, `"f64"`), which a resume keeps; `None` in runs saved
    /// before it was recorded (they trained in f32 unless told otherwise).
    #[serde(default)]
    pub dtype: Option<String>,
    /// The kind of device the run last trained on (`"cpu"`, `"cuda"`, `"metal"`); `None` in
    /// runs saved before it was recorded.
    #[serde(default)]
    pub device: Option<String>,
    /// What the checkpoint the run was imported from recorded beyond what the run uses,
    /// handed back by `mha export`; `None` for a run `mha train` started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imported: Option<ImportedRecord>,
    /// Tokens in a training sequence (the context + 1) when the run trains on windows shorter
    /// than its model's context (a checkpoint fine-tuned with a shorter `max_len`), which a
    /// resume keeps; `None`: the model's context + 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<usize>,
}

/// What an imported nanoGPT checkpoint recorded beyond the model, its optimizer and the
/// settings the run trains with: `mha export --format nanogpt` writes it back unchanged, so
/// nanoGPT's `sample.py` finds `meta.pkl` through `config["dataset"]` and `train.py` keeps
/// its best loss.
///
/// PyTorch equivalent: nanoGPT's `checkpoint["config"]` and `checkpoint["best_val_loss"]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ImportedRecord {
    /// nanoGPT's `config` (its `train.py` settings), in its order, as JSON: numbers,
    /// strings, booleans and `None` (null).
    #[serde(default)]
    pub nanogpt_config: Vec<(String, serde_json::Value)>,
    /// nanoGPT's `best_val_loss`: the lowest validation loss of its run.
    #[serde(default)]
    pub best_val_loss: Option<f64>,
}

/// The [`TrainerState::version`] this crate writes.
pub const STATE_VERSION: u32 = 2;

impl TrainerState {
    /// Reads the `trainer_state.json` of checkpoint directory `dir` (at most
    /// [`MAX_STATE_BYTES`](crate::limits::MAX_STATE_BYTES), never through a link), checks its
    /// configuration as [`crate::Trainer::new`] does, and resolves the paths of its data
    /// ([`DataSpec::resolved_in`]: relative to `dir`; relative to the working directory in
    /// files of version 0).
    pub fn load(dir: &Path) -> candle::Result<Self> {
        let path = dir.join(STATE_FILE);
        candle_mha::io::refuse_link(&path)?;
        let text = candle_mha::io::read_input_string(&path, crate::limits::MAX_STATE_BYTES)?;
        let mut state: Self = serde_json::from_str(&text)
            .map_err(|e| candle::Error::Msg(format!("invalid {}: {e}", path.display())))?;
        if state.version > STATE_VERSION {
            candle::bail!(
                "{}: version {}, newer than this program reads ({STATE_VERSION})",
                path.display(),
                state.version
            )
        }
        state
            .config
            .validate()
            .map_err(|e| candle::Error::Msg(format!("{}: {e}", path.display())))?;
        if state.version >= 2 {
            state.data = state.data.map(|d| d.resolved_in(dir)).transpose()?;
        }
        Ok(state)
    }

    /// The recorded dtype (f32 when none is).
    pub fn dtype(&self) -> candle::Result<candle::DType> {
        match self.dtype.as_deref() {
            None => Ok(candle::DType::F32),
            Some(name) => name.parse().map_err(|_| {
                candle::Error::Msg(format!(
                    "{STATE_FILE}: dtype {name:?}; expected \"f32\" or \"f64\""
                ))
            }),
        }
    }
}

/// The name of a device's kind, as [`TrainerState::device`] records it.
pub fn device_kind(device: &candle::Device) -> &'static str {
    match device {
        candle::Device::Cpu => "cpu",
        candle::Device::Cuda(_) => "cuda",
        candle::Device::Metal(_) => "metal",
    }
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
    /// A line worth telling the user (a damaged line of `metrics.jsonl` skipped, …).
    fn notice(&mut self, _line: &str) {}
    /// After a validation evaluation that set a new best loss and was saved into `dir`.
    fn on_best(&mut self, _step: u64, _eval: &Evaluation, _dir: &Path) {}
    /// At each point of a checkpoint save into `dir` (before and after each file write and
    /// rename, [`crate::run::commit::CommitPoint`]): an error stops the save there, leaving the files
    /// as a crash at that point would. For fault-injection tests; the default does nothing.
    fn at_commit_point(
        &mut self,
        _dir: &Path,
        _point: &crate::run::commit::CommitPoint,
    ) -> candle::Result<()> {
        Ok(())
    }
    /// Whether to stop now (a checkpoint is written first).
    fn should_stop(&self) -> bool {
        false
    }
}

impl TrainObserver for () {}

/// Whether a checkpoint directory without its manifest (`checkpoint.json`) is read: its files
/// cannot be checked to be one save, so by default it is not (a damaged manifest is refused
/// too; a missing one is trusted no more).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Unverified {
    /// Refused, naming the flag that reads it anyway.
    #[default]
    Refuse,
    /// Read as it is (the user said so: `--unverified`).
    Allow,
}

/// Checks the checkpoint in `dir` before `read` (file names) are loaded from it: its manifest
/// is valid and lists each of them, each matches it, none is a link. A save in progress is
/// waited for a moment, then reported as [`RunError::SaveInProgress`](crate::RunError), a
/// file that does not match as [`RunError::Damaged`](crate::RunError). A directory without
/// a manifest is an error unless `unverified` allows it. See
/// [`crate::run::commit::verify_file_set`].
pub fn verify_checkpoint(
    dir: &Path,
    read: &[&str],
    unverified: Unverified,
) -> crate::RunResult<()> {
    let state = crate::run::commit::verify_file_set(
        dir,
        crate::run::commit::SetFiles {
            allowed: &CHECKPOINT_FILES,
            read,
        },
    )?;
    if state == crate::run::commit::FileSetState::Unrecorded && unverified == Unverified::Refuse {
        return Err(candle::Error::Msg(format!(
            "{} has no {MANIFEST_FILE}: its files cannot be checked to be one checkpoint (runs that `mha train` and `mha import` write have one); pass --unverified to read them anyway",
            dir.display()
        ))
        .into());
    }
    Ok(())
}

/// [`verify_checkpoint`] for what a model is loaded from: `config.json`, `model.safetensors`,
/// the tokenization file ([`Codec::file_in`](crate::data::Codec::file_in)) and a LoRA run's
/// `lora.json`.
pub fn verify_model_files(dir: &Path, unverified: Unverified) -> crate::RunResult<()> {
    verify_checkpoint(dir, &model_files(dir)?, unverified)
}

/// The files a checkpoint's model is read from (see [`verify_model_files`]).
pub(crate) fn model_files(dir: &Path) -> candle::Result<Vec<&'static str>> {
    let mut files = vec![CONFIG_FILE, MODEL_FILE, crate::data::Codec::file_in(dir)?];
    if std::fs::symlink_metadata(dir.join(LORA_FILE)).is_ok() {
        files.push(LORA_FILE);
    }
    Ok(files)
}
/// The data description a run recorded in the `trainer_state.json` of checkpoint directory
/// `run` (its paths resolved: see [`TrainerState::load`]); errors when the run was
/// trained on data it did not describe (a library caller's own dataset).
pub fn run_data_spec(run: &Path) -> candle::Result<DataSpec> {
    let state = TrainerState::load(run)?;
    match state.data {
        Some(spec) => Ok(spec),
        None => candle::bail!(
            "{} does not say what the run was trained on (its trainer was given its data directly)",
            run.join(crate::run_dir::STATE_FILE).display()
        ),
    }
}
