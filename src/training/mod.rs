//! Training: an AdamW with saveable state, gradient clipping, a learning-rate schedule,
//! evaluation, and the trainer that runs, checkpoints and resumes.
//!
//! - `config.rs`: [`TrainConfig`], the run's hyper-parameters and their defaults (token
//!   sequences: `Default`; text: [`TrainConfig::for_text`]), which `mha train` reads.
//! - `trainer.rs`: [`Trainer`], one step, evaluation, checkpoints, resume; `run.rs`: the loop
//!   of a whole run; `state.rs`: what a run records ([`TrainerState`]) and reports
//!   ([`StepStats`], [`TrainObserver`]).
//! - `data_parallel.rs`: one data-parallel step ([`Trainer::train_step_distributed`] on a
//!   rank's [`StepShard`]); `distributed/`: the [`distributed::Communicator`] and its
//!   backends (one process; MPI and NCCL behind the `mpi` and `nccl` features).
//! - `optim.rs` ([`AdamW`], also a `candle_nn::Optimizer`; its CPU kernel in `optim_cpu.rs`),
//!   `schedule.rs` ([`LrSchedule`]), `evaluate.rs`, `metrics.rs` (`metrics.jsonl`),
//!   `baseline.rs` (count models).

mod baseline;
mod config;
mod data_parallel;
pub mod distributed;
mod evaluate;
mod metrics;
mod optim;
mod optim_cpu;
mod run;
mod schedule;
mod state;
mod trainer;

pub use baseline::{BaselineEvaluation, BigramBaseline};
pub use config::TrainConfig;
pub use data_parallel::StepShard;
pub use evaluate::{evaluate, evaluate_examples, Evaluation};
pub use metrics::{append_metrics, read_metrics, truncate_metrics, MetricsRecord, METRICS_FILE};
pub use optim::{clip_grad_norm, AdamW, AdamWConfig};
pub use schedule::LrSchedule;
pub use state::{
    EvalRecord, StepStats, TrainObserver, TrainerState, BEST_DIR, CONFIG_FILE, MODEL_FILE,
    OPTIMIZER_FILE, STATE_FILE,
};
pub use trainer::Trainer;
