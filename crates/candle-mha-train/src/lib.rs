//! # candle-mha-train
//!
//! Next-token predictors on [candle-mha](candle_mha): data ([`data`]: vocabularies, BPE on a
//! user's text, prepared token directories, seeded batching), the model and its generation
//! ([`models`]), and training ([`Trainer`]: one step, evaluation, checkpoints written as one
//! unit ([`commit::FileSet`]), exact resume, data-parallel runs over MPI/NCCL). [`Session`] is the
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
//! - `config.rs`: [`TrainConfig`], the run's hyper-parameters and their defaults (token
//!   sequences: `Default`; text: [`TrainConfig::for_text`]), which `mha train` reads.
//! - `trainer.rs`: [`Trainer`], one step, evaluation, checkpoints, resume; `run.rs`: the loop
//!   of a whole run; `state.rs`: what a run records ([`TrainerState`]) and reports
//!   ([`StepStats`], [`TrainObserver`]).
//! - `data_parallel.rs`: one data-parallel step ([`Trainer::train_step_distributed`] on a
//!   rank's [`StepShard`]); `distributed/`: the [`distributed::Communicator`] and its
//!   backends (one process; MPI and NCCL behind the `mpi` and `nccl` features).
//! - [`candle_mha::optim::AdamW`] is the optimizer (re-exported here);
//!   `schedule.rs` ([`LrSchedule`]), `evaluate.rs`, `metrics.rs` (`metrics.jsonl`),
//!   `baseline.rs` (count models).

#![warn(missing_docs)]

/// The attention core this crate builds on (re-exported so users match its version).
pub use candle_mha;

pub mod commit;
pub mod data;
pub mod formats;
pub mod limits;
pub mod lock;
pub mod lora_run;
pub mod models;
pub mod run_dir;
pub mod staged_dir;
pub mod undo;

mod baseline;
mod config;
mod data_parallel;
pub mod distributed;
mod error;
mod evaluate;
mod metrics;
mod run;
mod schedule;
mod session;
mod state;
mod trainer;

pub use baseline::{BaselineEvaluation, BigramBaseline};
pub use config::TrainConfig;
pub use data_parallel::StepShard;
pub use error::{RunError, RunResult};
pub use evaluate::{evaluate, evaluate_examples, Evaluation};
pub use metrics::{
    append_metrics, read_metrics, truncate_metrics, MetricsLog, MetricsRecord, MAX_METRICS_BYTES,
};
pub use schedule::LrSchedule;
pub use session::{ModelFor, NewData, NewRun, ResumeRun, Session};
pub use state::{
    device_kind, verify_checkpoint, verify_model_files, EvalRecord, ImportedRecord, StepStats,
    TrainObserver, TrainerState, Unverified, STATE_VERSION,
};
pub use trainer::Trainer;

/// The guide's example of the Llama-family API, compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!(concat!(env!("MHA_WORKSPACE_DIR"), "/docs/llama.md"))]
pub struct LlamaGuide;
