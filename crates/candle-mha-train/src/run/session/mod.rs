//! [`Session`]: what `mha train` does with a run directory, as one call a Rust program makes:
//! own the directory, prepare or open the data, build or resume the model and its trainer;
//! then [`Session::run`] trains, evaluates and saves into it.
//!
//! ```no_run
//! use candle_mha::candle::{DType, Device};
//! use candle_mha_train::data::PrepareJob;
//! use candle_mha_train::distributed::SingleProcess;
//! use candle_mha_train::{NewData, NewRun, ResumeRun, Session, TrainConfig};
//! # fn main() -> candle_mha::candle::Result<()> {
//! let run = NewRun::new(
//!     NewData::Text {
//!         job: PrepareJob::text(vec!["my_corpus.txt".into()]),
//!         eval_windows: 256,
//!     },
//!     TrainConfig::for_text(),
//! );
//! let mut session = Session::start("runs/text".as_ref(), run, &Device::Cpu, &SingleProcess, &mut ())?;
//! let eval = session.run(&SingleProcess, &mut ())?; // checkpoints in runs/text, best/ beside
//! println!("{eval:?}");
//! // Later, in another process: the same run, to 20,000 steps.
//! let how = ResumeRun { steps: Some(20_000), ..ResumeRun::default() };
//! let mut session = Session::resume("runs/text".as_ref(), how, &Device::Cpu, &SingleProcess, &mut ())?;
//! session.run(&SingleProcess, &mut ())?;
//! # Ok(())
//! # }
//! ```
//!
//! Failures a program branches on are [`RunError`](crate::RunError) variants, e.g. a learning
//! rate search that skips diverging settings:
//!
//! ```no_run
//! # use candle_mha::candle::Device;
//! # use candle_mha_train::distributed::SingleProcess;
//! # use candle_mha_train::{NewData, NewRun, RunError, Session, TrainConfig};
//! # fn main() -> Result<(), RunError> {
//! # let path = "events.txt".into();
//! # let data = NewData::Spec(candle_mha_train::data::DataSpec::Tokens { path, val_fraction: 0.1, seed: 0 });
//! for lr in [3e-3, 1e-2, 3e-2] {
//!     let run = NewRun::new(data.clone(), TrainConfig { lr, ..TrainConfig::default() });
//!     let dir = format!("runs/lr-{lr}");
//!     let mut session = Session::start(dir.as_ref(), run, &Device::Cpu, &SingleProcess, &mut ())?;
//!     match session.run(&SingleProcess, &mut ()) {
//!         Err(RunError::LossNotFinite { step, .. } | RunError::Diverged { step, .. }) => {
//!             println!("lr {lr}: diverged at step {step}")
//!         }
//!         result => println!("lr {lr}: {:?}", result?),
//!     }
//! }
//! # Ok(())
//! # }
//! ```

use std::path::{Path, PathBuf};

use candle::{DType, Device, Result};
use candle_mha::{seeded_var_builder, zeroed_var_builder};
use candle_nn::VarMap;

use crate::data::{
    expand_sources, open_prepared, same_sources, split_point, Codec, DataSpec, PrepareJob, RunData,
    SetupObserver, TextTokenizer, TokenData, META_FILE,
};
use crate::distributed::{Communicator, SingleProcess};
use crate::models::{NextTokenPredictor, NextTokenPredictorConfig};
use crate::run::commit::{finish_interrupted_commit, recover_file_set, verify_file_set, SetFiles};
use crate::run::lock::DirLock;
use crate::run::metrics::read_metrics;
use crate::run::state::device_kind;
use crate::run_dir::{
    BEST_DIR, CHECKPOINT_FILES, CONFIG_FILE, METRICS_FILE, OPTIMIZER_FILE, RUN_DATA_DIR, STATE_FILE,
};
use crate::{Evaluation, TrainConfig, TrainObserver, Trainer, TrainerState};
use crate::{RunError, RunResult};
use candle_mha::io::{refuse_link, remove_stale_temps};

mod resume;
mod start;

/// What a new run trains on.
#[derive(Clone, Debug)]
pub enum NewData {
    /// Data described in full: the synthetic task or a token file (prepared data too, with
    /// its split given).
    Spec(DataSpec),
    /// A data directory written by [`PrepareJob`] (`mha prepare`).
    Prepared {
        /// The directory.
        dir: PathBuf,
        /// A tokenizer the data must have been encoded with (checked).
        tokenizer: Option<PathBuf>,
        /// A split other than the one recorded at preparation (the share kept for validation).
        val_fraction: Option<f64>,
        /// Validation windows evaluated at most.
        eval_windows: usize,
    },
    /// Text files, prepared into the run's [`RUN_DATA_DIR`] first (reused when an earlier
    /// attempt prepared the same files).
    Text {
        /// The preparation.
        job: PrepareJob,
        /// Validation windows evaluated at most.
        eval_windows: usize,
    },
}

/// How to continue a saved run.
#[derive(Clone, Debug, Default)]
pub struct ResumeRun {
    /// A new total of steps (to train further; this also lifts an early stop); `None`: the
    /// saved total.
    pub steps: Option<u64>,
    /// The parameters' dtype: `None` takes the run's (recorded with it; f32 for runs saved
    /// before it was); another than the run's is an error.
    pub dtype: Option<DType>,
    /// Check prepared tokens against their recorded SHA-256 first.
    pub verify_data: bool,
    /// Bytes of memory the run may need at most ([`crate::limits::MemoryEstimate`], checked
    /// before the model is built); `None`: no check.
    pub memory_limit: Option<u64>,
    /// What to train on when the run does not say (an imported checkpoint: `mha import`),
    /// text encoded with the run's own tokenizer unless the job names one
    /// ([`NewData::encoded_for`]); ignored when it does (its own data is kept).
    pub data: Option<NewData>,
}

/// The model of a new run, given the data's vocabulary size and longest example (tokens: the
/// context + 1).
pub type ModelFor = Box<dyn FnOnce(usize, usize) -> NextTokenPredictorConfig>;

/// A run to start: its data, model, training configuration, seed and dtype.
pub struct NewRun {
    /// What it trains on.
    pub data: NewData,
    /// The model for the data; default: [`NextTokenPredictorConfig::for_text`] for text and
    /// prepared data, else [`NextTokenPredictorConfig::new`] with the vocabulary and the
    /// longest example.
    pub model: ModelFor,
    /// Steps, batch, optimizer, schedule, evaluation and saving.
    pub train: TrainConfig,
    /// The model's context when known before the data is opened (prepared data is cut into
    /// windows of this plus one tokens); `None`: from the data (token sequences). Default:
    /// [`NextTokenPredictorConfig::for_text`]'s for text and prepared data.
    pub max_len: Option<usize>,
    /// The parameters' dtype (f32 or f64).
    pub dtype: DType,
    /// Check prepared tokens against their recorded SHA-256 before training.
    pub verify_data: bool,
    /// Bytes of memory the run may need at most ([`crate::limits::MemoryEstimate`] of the
    /// model and a batch, checked before the model is built); `None`: no check.
    pub memory_limit: Option<u64>,
    /// A checkpoint directory to start from (fine-tuning): its model, weights and
    /// tokenization replace [`model`](Self::model), [`max_len`](Self::max_len) is then the
    /// length of the training windows (at most the checkpoint's context; `None`: all of it),
    /// and the data must be in its tokenization; the optimizer and the step start afresh.
    pub init_from: Option<PathBuf>,
    /// Whether [`init_from`](Self::init_from) is read without its manifest.
    pub init_unverified: crate::Unverified,
    /// Train LoRA adapters of this spec on [`init_from`](Self::init_from)'s frozen weights
    /// (which the run references, not copies) instead of every weight; `None`: full
    /// fine-tuning.
    pub lora: Option<crate::models::lora::LoraSpec>,
}

impl NewData {
    /// Text for the model of checkpoint `dir` is encoded with its tokenizer (its
    /// `tokenizer.json`), not a new BPE, unless the job names one: the one place that default
    /// is decided (a new run's `init_from`, a resumed run given data).
    pub fn encoded_for(mut self, dir: &Path) -> Self {
        if let NewData::Text { job, .. } = &mut self {
            let own = dir.join(crate::run_dir::TOKENIZER_FILE);
            if job.tokenizer.is_none() && own.exists() {
                job.tokenizer = Some(own);
            }
        }
        self
    }
}

impl NewRun {
    /// A run of `train` on `data`, the default model for the data, f32.
    pub fn new(data: NewData, train: TrainConfig) -> Self {
        let text = !matches!(
            data,
            NewData::Spec(DataSpec::Synthetic { .. } | DataSpec::Tokens { .. })
        );
        Self {
            data,
            model: Box::new(move |vocab, longest| match text {
                true => NextTokenPredictorConfig::for_text(vocab),
                false => NextTokenPredictorConfig {
                    max_len: longest.saturating_sub(1).max(1),
                    ..NextTokenPredictorConfig::new(vocab)
                },
            }),
            train,
            max_len: text.then(|| NextTokenPredictorConfig::for_text(0).max_len),
            dtype: DType::F32,
            verify_data: false,
            memory_limit: None,
            init_from: None,
            init_unverified: crate::Unverified::Refuse,
            lora: None,
        }
    }
}

candle_mha::setters! {
    NewRun {
        with_model(model: ModelFor);
        with_max_len(max_len: Some(usize));
        with_dtype(dtype: DType);
    }
}

/// A run directory owned by this process, with the data, model and trainer of its run.
pub struct Session {
    /// The run directory.
    pub dir: PathBuf,
    /// What the run trains on, as its checkpoints record it.
    pub spec: DataSpec,
    /// The opened data.
    pub data: RunData,
    /// The model's configuration.
    pub model: NextTokenPredictorConfig,
    /// The trainer, with the model, optimizer and the run's state.
    pub trainer: Trainer,
    /// Whether the run continues a saved one.
    pub resumed: bool,
    // Held for the session's life by rank 0 (the one process that writes the directory),
    // with the lock of the run's own data directory when it has one.
    _lock: Option<DirLock>,
    _data_lock: Option<DirLock>,
}

impl Session {
    /// Starts a new run in `dir` (created when missing): errors when `dir` already holds one,
    /// or holds files a run does not write (nothing is prepared or written then). In a
    /// data-parallel run (`comm` with several ranks) every rank calls this; rank 0 owns the
    /// directory (and its `data/`) and prepares text, the others wait for it.
    ///
    /// PyTorch equivalent: the set-up half of a training script (dataset, model, optimizer).
    pub fn start(
        dir: &Path,
        run: NewRun,
        device: &Device,
        comm: &dyn Communicator,
        observer: &mut dyn SetupObserver,
    ) -> RunResult<Self> {
        // Refused before the lock is taken: an existing run's files stay as they are.
        if dir.join(STATE_FILE).exists() {
            return Err(RunError::RunExists {
                dir: dir.to_path_buf(),
            });
        }
        // A start that fails takes away what it made (the directory, its lock, its data/),
        // and only that: undone by the lock's holder, noted again once the lock is held.
        let undo = (comm.rank() == 0).then(|| crate::run::undo::Undo::note(dir));
        let lock = own(dir, comm)?;
        let undo = undo.map(crate::run::undo::Undo::locked);
        let started = Self::start_new(dir, run, device, comm, observer, lock);
        if let (Err(_), Some(undo)) = (&started, undo) {
            undo.undo();
        }
        started
    }

    /// Trains to the end of the run (or until `observer` stops it), evaluating and saving
    /// into the directory as configured; rank 0 returns the final evaluation, other ranks
    /// `None`.
    pub fn run(
        &mut self,
        comm: &dyn Communicator,
        observer: &mut dyn TrainObserver,
    ) -> RunResult<Option<Evaluation>> {
        let val = self.data.eval_set();
        self.trainer
            .run_distributed(comm, &*self.data.train, &val, Some(&self.dir), observer)
    }
}

/// Takes `dir` for this process (rank 0 only): its lock, then a save a kill interrupted is
/// finished (or undone) and temporary files of killed writes are removed.
fn own(dir: &Path, comm: &dyn Communicator) -> RunResult<Option<DirLock>> {
    if comm.rank() != 0 {
        return Ok(None);
    }
    let lock = DirLock::acquire(dir, "training")?;
    let best = dir.join(BEST_DIR);
    refuse_link(&best)?;
    remove_stale_temps(dir);
    remove_stale_temps(&best);
    finish_interrupted_commit(dir, SetFiles::writer(&CHECKPOINT_FILES))?;
    finish_interrupted_commit(&best, SetFiles::writer(&CHECKPOINT_FILES))?;
    Ok(Some(lock))
}

fn check_dtype(dtype: DType) -> Result<()> {
    if !matches!(dtype, DType::F32 | DType::F64) {
        candle::bail!(
            "dtype {dtype:?}: training runs in f32 or f64 (half precision is for inference)"
        )
    }
    Ok(())
}

/// Whether `path` lies inside the directory `dir` (both as they are on disk).
fn inside(path: &Path, dir: &Path) -> bool {
    match (path.canonicalize(), dir.canonicalize()) {
        (Ok(p), Ok(d)) => p.starts_with(d),
        _ => false,
    }
}

/// The [`DataSpec`] of a new run: as given, or prepared data (made from text into
/// `dir/data` first, or reused from an earlier attempt on the same files), recording the
/// data's number of ids and SHA-256; with the lock of `dir/data` when the run prepared there.
fn new_spec(
    dir: &Path,
    data: NewData,
    comm: &dyn Communicator,
    observer: &mut dyn SetupObserver,
) -> RunResult<(DataSpec, Option<DirLock>)> {
    let mut data_lock = None;
    let (data_dir, tokenizer, val_fraction, eval_windows) = match data {
        NewData::Spec(spec) => return Ok((spec.absolute()?, None)),
        NewData::Prepared {
            dir,
            tokenizer,
            val_fraction,
            eval_windows,
        } => (dir, tokenizer, val_fraction, eval_windows),
        NewData::Text { job, eval_windows } => {
            if job.val_fraction >= 1.0 {
                return Err(candle::Error::Msg(format!(
                    "val_fraction {}: text needs a training part; expected a fraction below 1",
                    job.val_fraction
                ))
                .into());
            }
            let tokenizer = job.tokenizer.clone();
            let (prepared, lock) = prepare_run_text(dir, &job, comm, observer)?;
            data_lock = lock;
            (prepared, tokenizer, None, eval_windows)
        }
    };
    let given = tokenizer.as_deref().map(TextTokenizer::load).transpose()?;
    let given = given.map(|t| Codec::Text(Box::new(t)));
    let what = match &tokenizer {
        Some(p) => format!("the tokenizer {}", p.display()),
        None => String::new(),
    };
    let (tokens, _) = open_prepared(&data_dir, given.as_ref(), &what)?;
    let train_tokens = match val_fraction {
        Some(f) => split_point(tokens.len(), f)?,
        None => tokens.meta().train_tokens,
    };
    let spec = DataSpec::Prepared {
        dir: data_dir,
        train_tokens,
        eval_windows,
        num_tokens: Some(tokens.len()),
        tokens_sha256: tokens.meta().tokens_sha256.clone(),
    };
    Ok((spec.absolute()?, data_lock))
}

/// Prepares `job` into `dir/data`, or reuses what an earlier attempt prepared there from the
/// same files (same paths and sizes) and settings; returns it with its lock (held by the
/// process that prepared it). In a data-parallel run rank 0 prepares and the others wait,
/// then reuse it.
fn prepare_run_text(
    dir: &Path,
    job: &PrepareJob,
    comm: &dyn Communicator,
    observer: &mut dyn SetupObserver,
) -> RunResult<(PathBuf, Option<DirLock>)> {
    let data = dir.join(RUN_DATA_DIR);
    if comm.world_size() > 1 {
        let prepared = match comm.rank() {
            0 => Some(prepare_run_text(dir, job, &SingleProcess, observer)?),
            _ => None,
        };
        comm.barrier("barrier after rank 0 prepared the text")?;
        return Ok(prepared.unwrap_or((data, None)));
    }
    refuse_link(&data)?;
    let lock = DirLock::acquire(&data, "training (preparing its data)")?;
    if data.join(META_FILE).exists() {
        let prepared = TokenData::open(&data)?;
        let files = expand_sources(&job.text)?;
        if !same_sources(&prepared.meta().sources, &files) {
            return Err(candle::Error::Msg(format!(
                "{} holds data prepared from other files; remove it or choose another directory",
                data.display()
            ))
            .into());
        }
        let differences = job.differences(prepared.meta())?;
        if !differences.is_empty() {
            return Err(candle::Error::Msg(format!(
                "{} holds data prepared from these files with other settings ({}); remove it or choose another directory",
                data.display(),
                differences.join("; ")
            )).into());
        }
        observer.notice(&format!("reusing the data prepared in {}", data.display()));
        return Ok((data, Some(lock)));
    }
    let meta = job.run(&data, observer)?;
    observer.notice(&crate::data::describe_prepared(&meta, &data));
    Ok((data, Some(lock)))
}

/// Checks prepared tokens against their recorded SHA-256.
fn verify(spec: &DataSpec, observer: &mut dyn SetupObserver) -> Result<()> {
    if let DataSpec::Prepared { dir, .. } = spec {
        match TokenData::open(dir)?.verify()? {
            true => observer.notice(&format!(
                "verified {}: tokens.bin matches its SHA-256",
                dir.display()
            )),
            false => observer.notice(&format!(
                "{}: no SHA-256 recorded to verify (prepared by an older version)",
                dir.display()
            )),
        }
    }
    Ok(())
}

/// Checks that training `cfg` in `dtype` on steps of `(batch, context, lora)` (sequences of
/// `context` tokens; LoRA: the weights frozen) fits in `limit` bytes.
fn check_memory(
    cfg: &NextTokenPredictorConfig,
    dtype: DType,
    (batch, context, lora): (usize, usize, bool),
    limit: u64,
) -> candle::Result<()> {
    let mut need = cfg.memory(dtype, batch as u128 * context as u128, true);
    if lora {
        need.parameters /= 4; // the frozen weights once: no gradient, no moments
    }
    need.check(limit, "training this model")
}
