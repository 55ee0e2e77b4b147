//! # candle-mha-train
//!
//! Next-token predictors on [candle-mha](candle_mha): data ([`data`]: vocabularies, BPE on a
//! user's text, prepared token directories, seeded batching), the model and its generation
//! ([`models`]), and training ([`Trainer`]: one step, evaluation, checkpoints written as one
//! unit ([`run::commit::FileSet`]), exact resume, data-parallel runs over MPI/NCCL). [`Session`] is the
//! one call behind `mha train`; the pieces below it are public for your own loop:
//!
//! ```
//! use candle_mha::candle::{DType, Device};
//! use candle_mha::seeded_var_builder;
//! use candle_mha_train::data::AssociativeRecall;
//! use candle_mha_train::models::{NextTokenPredictor, NextTokenPredictorConfig};
//! use candle_mha_train::{TrainConfig, Trainer};
//! # fn main() -> candle_mha::candle::Result<()> {
//! let task = AssociativeRecall { num_keys: 6, num_values: 6, pairs: 3 };
//! let (train, val) = (task.generate(256, 1), task.generate(32, 2));
//! let cfg = NextTokenPredictorConfig { max_len: task.seq_len() - 1, ..NextTokenPredictorConfig::new(task.vocab().len()) };
//! let varmap = candle_mha::candle_nn::VarMap::new();
//! let model = NextTokenPredictor::new(cfg, seeded_var_builder(&varmap, 0, DType::F32, &Device::Cpu))?;
//! let config = TrainConfig { steps: 20, eval_every: 0, save_every: 0, ..TrainConfig::default() };
//! let mut trainer = Trainer::new(model, varmap, config, None)?; // None: our own data, not a DataSpec
//! let eval = trainer.run(&train, &val, None, &mut ())?; // no directory: nothing saved
//! assert_eq!(trainer.state().step, 20);
//! assert!(eval.loss.is_finite());
//! # Ok(())
//! # }
//! ```
//!
//! The crate, from the bottom (`tests/layering.rs` keeps every import pointing down):
//!
//! 0. `error.rs` ([`RunError`]), [`limits`] (sizes and memory checked before allocation),
//!    [`checksum`] (SHA-256 as every record writes it), [`run_dir`] (the names of a run
//!    directory's files).
//! 1. [`models`]: the next-token predictor (GPT-2 and nanoGPT's blocks, the Llama family),
//!    LoRA on it, generation.
//! 2. [`data`]: vocabularies and tokenizers, BPE on a user's text, prepared token directories,
//!    seeded batching.
//! 3. [`distributed`]: the [`distributed::Communicator`] and its backends (one process; MPI and
//!    NCCL behind the `mpi` and `nccl` features).
//! 4. [`run`]: a run and its directory: [`TrainConfig`], [`Trainer`] (one step, evaluation,
//!    checkpoints, exact resume, the loop, the data-parallel step), [`TrainerState`], the
//!    checkpoint files written as one unit ([`run::commit`]) under a lock ([`run::lock`]),
//!    `metrics.jsonl`, LoRA runs ([`run::lora`]) and [`Session`].
//! 5. [`formats`]: PyTorch and Hugging Face checkpoints (GPT-2, nanoGPT, the Llama family,
//!    PEFT adapters) in and out of run directories.
//!
//! [`candle_mha::optim::AdamW`] is the optimizer.

#![warn(missing_docs)]

/// The attention core this crate builds on (re-exported so users match its version).
pub use candle_mha;

pub mod checksum;
pub mod data;
pub mod distributed;
mod error;
pub mod formats;
pub mod limits;
pub mod models;
pub mod run;
pub mod run_dir;

pub use error::{RunError, RunResult};
pub use run::{
    append_metrics, device_kind, evaluate, evaluate_examples, read_metrics, truncate_metrics,
    verify_checkpoint, verify_model_files, BaselineEvaluation, BigramBaseline, Checkpoint,
    EvalRecord, Evaluation, ImportedRecord, LrSchedule, MetricsLog, MetricsRecord, ModelFor,
    NewData, NewRun, ResumeRun, Session, StepShard, StepStats, TrainConfig, TrainObserver, Trainer,
    TrainerState, Unverified, MAX_METRICS_BYTES, STATE_VERSION,
};

/// The guide's example of the Llama-family API, compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!(concat!(env!("MHA_WORKSPACE_DIR"), "/docs/llama.md"))]
pub struct LlamaGuide;
