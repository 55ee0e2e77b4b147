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

use crate::commit::{finish_interrupted_commit, recover_file_set, verify_file_set, SetFiles};
use crate::data::{
    expand_sources, open_prepared, same_sources, split_point, Codec, DataSpec, PrepareJob, RunData,
    SetupObserver, TextTokenizer, TokenData, META_FILE,
};
use crate::distributed::{Communicator, SingleProcess};
use crate::lock::DirLock;
use crate::metrics::read_metrics;
use crate::models::{NextTokenPredictor, NextTokenPredictorConfig};
use crate::run_dir::{
    BEST_DIR, CHECKPOINT_FILES, CONFIG_FILE, METRICS_FILE, MODEL_FILE, OPTIMIZER_FILE,
    RUN_DATA_DIR, STATE_FILE,
};
use crate::state::device_kind;
use crate::{Evaluation, TrainConfig, TrainObserver, Trainer, TrainerState};
use crate::{RunError, RunResult};
use candle_mha::io::{refuse_link, remove_stale_temps};

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
    /// What to train on when the run does not say (an imported checkpoint: `mha import`);
    /// ignored when it does (its own data is kept).
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

/// The model, tokenization and weights of a checkpoint a new run starts from.
struct Init {
    config: NextTokenPredictorConfig,
    codec: Codec,
    weights: candle_mha::checkpoint::StateDict,
    source: String,
}

impl Init {
    fn load(dir: &Path, unverified: crate::Unverified) -> Result<Self> {
        crate::verify_model_files(dir, unverified)?;
        let config = NextTokenPredictorConfig::load(dir.join(CONFIG_FILE))?;
        Ok(Self {
            codec: Codec::load_dir(dir)?,
            weights: crate::lora_run::model_weights(dir, &config)?,
            config,
            source: dir.join(MODEL_FILE).display().to_string(),
        })
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
        let undo = (comm.rank() == 0).then(|| crate::undo::Undo::note(dir));
        let lock = own(dir, comm)?;
        let undo = undo.map(crate::undo::Undo::locked);
        let started = Self::start_new(dir, run, device, comm, observer, lock);
        if let (Err(_), Some(undo)) = (&started, undo) {
            undo.undo();
        }
        started
    }

    fn start_new(
        dir: &Path,
        mut run: NewRun,
        device: &Device,
        comm: &dyn Communicator,
        observer: &mut dyn SetupObserver,
        lock: Option<DirLock>,
    ) -> RunResult<Self> {
        if dir.join(STATE_FILE).exists() {
            return Err(RunError::RunExists {
                dir: dir.to_path_buf(),
            });
        }
        check_dtype(run.dtype)?;
        run.train.validate()?;
        if run.lora.is_some() && run.init_from.is_none() {
            return Err(candle::Error::Msg(
                "LoRA trains adapters on a model to start from: give init_from (--init-from)"
                    .into(),
            )
            .into());
        }
        if comm.rank() == 0 {
            check_fresh(dir, matches!(run.data, NewData::Text { .. }))?;
        }
        // Text for a checkpoint's model is encoded with its tokenizer, not a new BPE.
        if let (Some(init), NewData::Text { job, .. }) = (&run.init_from, &mut run.data) {
            let own = init.join(crate::run_dir::TOKENIZER_FILE);
            if job.tokenizer.is_none() && own.exists() {
                job.tokenizer = Some(own);
            }
        }
        let (spec, data_lock) = new_spec(dir, run.data, comm, observer)?;
        if run.verify_data && comm.rank() == 0 {
            verify(&spec, observer)?;
        }
        let init = run
            .init_from
            .as_deref()
            .map(|d| Init::load(d, run.init_unverified))
            .transpose()?;
        let max_tokens = match &init {
            // Windows up to the checkpoint's context (shorter ones train its first positions).
            Some(i) => match run.max_len {
                Some(m) if m > i.config.max_len => {
                    return Err(candle::Error::Msg(format!(
                        "max_len {m}: longer than the context of the checkpoint to start from ({})",
                        i.config.max_len
                    ))
                    .into())
                }
                Some(m) => Some(m + 1),
                None => Some(i.config.max_len + 1),
            },
            None => run.max_len.map(|m| m + 1),
        };
        // Data for a checkpoint's model must be in its tokenization (checked by the load).
        let data = spec.load(init.as_ref().map(|i| i.codec.clone()), None, 0, max_tokens)?;
        let cfg = match &init {
            Some(i) => i.config.clone(),
            None => (run.model)(data.codec.vocab_size(), data.longest),
        };
        cfg.validate()?;
        // A checkpoint fine-tuned on shorter windows than its context trains (and resumes) on
        // those: they, not the context, size a step.
        let window = max_tokens
            .filter(|&t| t <= cfg.max_len)
            .filter(|_| init.is_some());
        if let Some(limit) = run.memory_limit {
            let context = window.map_or(cfg.max_len, |t| t - 1);
            let step = (run.train.batch_size, context, run.lora.is_some());
            check_memory(&cfg, run.dtype, step, limit)?;
        }
        let seed = run.train.seed;
        let (model, varmap, lora) = match (init, &run.lora, &run.init_from) {
            (Some(i), Some(lora), Some(base)) => {
                let (model, varmap, record) = crate::lora_run::start_model(
                    base,
                    &i.config,
                    i.weights,
                    lora,
                    (run.dtype, device, seed),
                )?;
                (model, varmap, Some(record))
            }
            (init, _, _) => {
                let varmap = VarMap::new();
                // A checkpoint to start from fills every variable: no initialisation is
                // drawn, and each of its tensors is let go once copied.
                let vb = match &init {
                    Some(_) => zeroed_var_builder(&varmap, run.dtype, device),
                    None => seeded_var_builder(&varmap, seed, run.dtype, device),
                };
                let model = NextTokenPredictor::new(cfg.clone(), vb)?;
                if let Some(i) = init {
                    let opts = candle_mha::checkpoint::LoadOptions::new()
                        .with_module("NextTokenPredictor")
                        .with_source(&i.source);
                    candle_mha::checkpoint::load_into_varmap_owned(&varmap, i.weights, &opts)?;
                }
                (model, varmap, None)
            }
        };
        // Checks everything before anything is written into the directory.
        let mut trainer =
            Trainer::new(model, varmap, run.train, Some(spec.clone()))?.with_max_tokens(window);
        if let Some(record) = lora {
            trainer = trainer.with_lora_record(record);
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            trainer: trainer.with_codec(data.codec.clone()),
            spec,
            data,
            model: cfg,
            resumed: false,
            _lock: lock,
            _data_lock: data_lock,
        })
    }

    /// Continues the run saved in `dir` with its data, tokenizer, model, dtype and
    /// configuration; `steps` replaces its total when given. Finishes a save that a kill
    /// interrupted first. The data must be the run's: the same tokenizer, number of ids and
    /// recorded SHA-256 (a data directory inside the run is found wherever the run was moved).
    ///
    /// PyTorch equivalent: `model.load_state_dict(...)`, `optimizer.load_state_dict(...)` and
    /// the script's own step counter.
    pub fn resume(
        dir: &Path,
        how: ResumeRun,
        device: &Device,
        comm: &dyn Communicator,
        observer: &mut dyn SetupObserver,
    ) -> RunResult<Self> {
        let lock = own(dir, comm)?;
        if !dir.join(STATE_FILE).exists() {
            return Err(RunError::NoRun {
                dir: dir.to_path_buf(),
            });
        }
        // The model's files (a LoRA run's lora.json among them), the optimizer and the state.
        let mut read = crate::state::model_files(dir)?;
        read.extend([STATE_FILE, OPTIMIZER_FILE]);
        let files = SetFiles {
            allowed: &CHECKPOINT_FILES,
            read: &read,
        };
        match comm.rank() {
            0 => recover_file_set(dir, files)?,
            _ => verify_file_set(dir, files)?,
        };
        let state = TrainerState::load(dir)?;
        let dtype = state.dtype()?;
        match how.dtype {
            Some(d) if d != dtype => {
                return Err(candle::Error::Msg(format!(
                    "dtype {}: the run in {} trains in {} (a resumed run keeps its dtype)",
                    d.as_str(),
                    dir.display(),
                    dtype.as_str()
                ))
                .into())
            }
            _ => {}
        }
        check_dtype(dtype)?;
        let (spec, new_lock) = match (state.data.clone(), how.data) {
            (Some(spec), _) => (spec, None),
            (None, Some(data)) => new_spec(dir, data, comm, observer)?,
            (None, None) => return Err(candle::Error::Msg(format!(
                "{} does not say what the run trains on (an imported checkpoint, or a trainer given its data directly): give its data",
                dir.join(STATE_FILE).display()
            )).into()),
        };
        if let Some(kind) = state.device.as_deref() {
            if kind != device_kind(device) && comm.rank() == 0 {
                observer.notice(&format!(
                    "the run trained on {kind} and continues on {}: its numbers will differ from an uninterrupted run's in the last bits",
                    device_kind(device)
                ));
            }
        }
        // The run's own data directory is the run's: no `mha prepare` may change it meanwhile.
        let data_lock = match (&spec, comm.rank(), new_lock) {
            (_, _, Some(lock)) => Some(lock),
            (DataSpec::Prepared { dir: data, .. }, 0, None) if inside(data, dir) => {
                Some(DirLock::acquire(data, "training (its data)")?)
            }
            _ => None,
        };
        if how.verify_data && comm.rank() == 0 {
            verify(&spec, observer)?;
        }
        let cfg = NextTokenPredictorConfig::load(dir.join(CONFIG_FILE))?;
        let max_tokens = match state.max_tokens {
            None => cfg.max_len + 1,
            Some(t) if (2..=cfg.max_len).contains(&t) => t,
            Some(t) => {
                return Err(candle::Error::Msg(format!(
                    "{}: max_tokens {t}, expected 2..={} (shorter than the model's context + 1)",
                    dir.join(STATE_FILE).display(),
                    cfg.max_len
                ))
                .into())
            }
        };
        if let Some(limit) = how.memory_limit {
            let lora = read.contains(&crate::run_dir::LORA_FILE);
            let step = (state.config.batch_size, max_tokens - 1, lora);
            check_memory(&cfg, dtype, step, limit)?;
        }
        let codec = Codec::load_dir(dir)?;
        let data = spec.load(Some(codec), None, 0, Some(max_tokens))?;
        // The checkpoint fills every variable (checked strictly): no initialisation drawn.
        let (model, varmap) = crate::lora_run::resume_model(dir, &cfg, dtype, device)?;
        // The files were recovered (or verified) above: not hashed again. A run that recorded
        // no data records the data it was given from now on.
        let mut state = state;
        state.data = Some(spec.clone());
        let trainer = Trainer::resume_loaded(model, varmap, dir, state, how.steps)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            trainer: trainer.with_codec(data.codec.clone()),
            spec,
            data,
            model: cfg,
            resumed: true,
            _lock: lock,
            _data_lock: data_lock,
        })
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

/// Errors, listing them, when the directory of a new run holds files a run does not write
/// (checked before any work): only its lock, the `data/` of text runs, a `best/` checkpoint
/// and a `metrics.jsonl` of an earlier attempt that stopped before its first checkpoint, and
/// temporary files may be there. A link at any of these names is refused too.
pub(crate) fn check_fresh(dir: &Path, text: bool) -> RunResult<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    let mut stray = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        let Ok(md) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if md.file_type().is_symlink() {
            refuse_link(&path)?;
        }
        let ours = match name.as_str() {
            crate::run_dir::LOCK_FILE => true,
            RUN_DATA_DIR => text && md.is_dir(),
            BEST_DIR => md.is_dir() && holds_only_checkpoint(&path),
            METRICS_FILE => read_metrics(&path).is_ok_and(|log| log.skipped.is_empty()),
            n => is_scratch(n),
        };
        if !ours {
            stray.push(name);
        }
    }
    if !stray.is_empty() {
        stray.sort();
        return Err(RunError::StrayFiles {
            dir: dir.to_path_buf(),
            files: stray,
        });
    }
    Ok(())
}

/// Whether directory `dir` holds nothing but a checkpoint's files (and its bookkeeping).
fn holds_only_checkpoint(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().all(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            CHECKPOINT_FILES.contains(&name.as_str())
                || name == crate::run_dir::MANIFEST_FILE
                || is_scratch(&name)
        })
    })
}

/// Whether `name` is a save's scratch file: a temporary (`.NAME.tmp-…`) or staged
/// (`.NAME.staged`) file.
fn is_scratch(name: &str) -> bool {
    name.starts_with('.') && (name.contains(".tmp-") || name.ends_with(".staged"))
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
