//! A run and its directory: the hyper-parameters ([`TrainConfig`]), the [`Trainer`] (one
//! step, evaluation, checkpoints, exact resume; `train_loop.rs`: the loop of a whole run;
//! `data_parallel.rs`: one data-parallel step), what a run records ([`TrainerState`]) and
//! reports ([`StepStats`], [`TrainObserver`]), and the directory itself: its checkpoint files
//! written as one unit ([`commit`]) under one owner ([`lock`]), `metrics.jsonl`, new output
//! directories ([`staged_dir`]), what a refused command undoes ([`undo`]), LoRA runs on a
//! frozen base ([`lora`]), and [`Session`], the one call behind `mha train`.
//!
//! A checkpoint directory is opened by [`Checkpoint::open`], for every reader.
//!
//! Also here: [`LrSchedule`], [`evaluate`], the count models of `baseline.rs`
//! ([`BigramBaseline`]), and [`checkpoint_corpus`] (a run's own data, for evaluation).

pub mod commit;
pub mod lock;
pub mod lora;
pub mod staged_dir;
pub mod undo;

mod baseline;
mod checkpoint;
mod config;
mod corpus;
mod data_parallel;
mod evaluate;
mod metrics;
mod schedule;
mod session;
pub(crate) mod state;
mod train_loop;
pub(crate) mod trainer;

pub use baseline::{BaselineEvaluation, BigramBaseline};
pub use checkpoint::Checkpoint;
pub use config::TrainConfig;
pub use corpus::checkpoint_corpus;
pub use data_parallel::StepShard;
pub use evaluate::{evaluate, evaluate_examples, Evaluation};
pub use metrics::{
    append_metrics, read_metrics, truncate_metrics, MetricsLog, MetricsRecord, MAX_METRICS_BYTES,
};
pub use schedule::LrSchedule;
pub use session::{ModelFor, NewData, NewRun, ResumeRun, Session};
pub use state::{
    device_kind, run_data_spec, verify_checkpoint, verify_model_files, EvalRecord, ImportedRecord,
    StepStats, TrainObserver, TrainerState, Unverified, STATE_VERSION,
};
pub use trainer::Trainer;
