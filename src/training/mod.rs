//! Training: an AdamW with saveable state, gradient clipping, a learning-rate schedule, and
//! the trainer that runs, evaluates, checkpoints and resumes.

mod optim;
mod schedule;

pub use optim::{clip_grad_norm, AdamW, AdamWConfig};
pub use schedule::LrSchedule;
