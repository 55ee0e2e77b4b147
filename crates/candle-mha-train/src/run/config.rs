//! [`TrainConfig`]: a run's hyper-parameters and their defaults, the one place the
//! command line takes them from.

use candle::Result;
use serde::{Deserialize, Serialize};

/// Training hyper-parameters. The `Default`s are those of token sequences;
/// [`TrainConfig::for_text`] gives those of text.
///
/// PyTorch equivalent: the arguments of a typical training script (nanoGPT-style):
/// `AdamW(lr, betas, weight_decay)`, `clip_grad_norm_(max_norm)`, warmup + cosine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Optimizer steps of the whole run. Default 1500 (text: 1200).
    pub steps: u64,
    /// Sequences per batch (per micro-batch with `grad_accum > 1`). Default 64 (text: 32).
    pub batch_size: usize,
    /// Micro-batches whose gradients are summed into one update (the same update as one
    /// batch of `batch_size × grad_accum`, up to float rounding). Default 1.
    #[serde(default = "one")]
    pub grad_accum: usize,
    /// Stop after this many evaluations in a row without a new best validation loss (0 =
    /// never). Default 0.
    #[serde(default)]
    pub early_stop: u64,
    /// Peak learning rate. Default 3e-3 (text: 2e-3).
    pub lr: f64,
    /// Final learning rate of the cosine decay. Default 3e-4 (text: 2e-4), a tenth of `lr`.
    pub min_lr: f64,
    /// Linear warmup steps. Default 100.
    pub warmup_steps: u64,
    /// AdamW decoupled weight decay. Default 0.01 (text: 0.1).
    pub weight_decay: f64,
    /// AdamW β1. Default 0.9.
    pub beta1: f64,
    /// AdamW β2. Default 0.98.
    pub beta2: f64,
    /// Global gradient-norm clip (0 = off). Default 1.0.
    pub clip_norm: f64,
    /// Evaluate every this many steps (0 = only at the end). Default 250 (text: 100).
    pub eval_every: u64,
    /// Write a checkpoint every this many steps (0 = only at the end). Default 500.
    pub save_every: u64,
    /// Seed of batch order and dropout. Default 0.
    pub seed: u64,
    /// Weight decay on the matrices and embeddings only, not on biases and norm weights
    /// (nanoGPT's two AdamW groups: decay on the parameters of rank ≥ 2). Default false:
    /// every parameter decays.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub decay_matrices_only: bool,
    /// The training steps' large CPU products (every linear layer, forward and backward) in
    /// bf16 with f32 sums ([`candle_mha::autocast`]); parameters, gradients and optimizer
    /// state stay f32, and validation runs in f32. Default false. PyTorch equivalent: the
    /// step inside `torch.autocast("cpu", dtype=torch.bfloat16)` (nanoGPT's
    /// `dtype = 'bfloat16'`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub autocast_bf16: bool,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            steps: 1500,
            batch_size: 64,
            grad_accum: 1,
            early_stop: 0,
            lr: 3e-3,
            min_lr: 3e-4,
            warmup_steps: 100,
            weight_decay: 0.01,
            beta1: 0.9,
            beta2: 0.98,
            clip_norm: 1.0,
            eval_every: 250,
            save_every: 500,
            seed: 0,
            decay_matrices_only: false,
            autocast_bf16: false,
        }
    }
}

impl TrainConfig {
    /// The defaults of a run on text (and prepared data): a schedule that, with
    /// [`NextTokenPredictorConfig::for_text`](crate::models::NextTokenPredictorConfig::for_text),
    /// on a few hundred KB of English ends well below a bigram model's validation loss in a
    /// few minutes on 2 cores. [`TrainConfig::default`] is for token sequences (the synthetic
    /// task, token files): small and fast.
    ///
    /// PyTorch equivalent: the settings of a nanoGPT config file such as
    /// `config/train_shakespeare_char.py` (`learning_rate`, `min_lr = learning_rate / 10`, ...).
    pub fn for_text() -> Self {
        Self {
            steps: 1200,
            batch_size: 32,
            lr: 2e-3,
            min_lr: 2e-4,
            weight_decay: 0.1,
            eval_every: 100,
            ..Self::default()
        }
    }
}

impl TrainConfig {
    /// Checks every count against the crate's [limits](crate::limits) (the command line's
    /// ranges; a `trainer_state.json` is held to them too), and `lr`, `weight_decay` and
    /// `clip_norm` to be finite and ≥ 0; names the field on error. The optimizer checks its
    /// betas and epsilon.
    pub fn validate(&self) -> Result<()> {
        use crate::limits::{check_range, MAX_COUNT, MAX_GRAD_ACCUM, MAX_STEPS};
        check_range("batch_size", self.batch_size, 1, MAX_COUNT)?;
        check_range("grad_accum", self.grad_accum, 1, MAX_GRAD_ACCUM)?;
        for (name, v) in [
            ("steps", self.steps),
            ("warmup_steps", self.warmup_steps),
            ("early_stop", self.early_stop),
            ("eval_every", self.eval_every),
            ("save_every", self.save_every),
        ] {
            check_range(name, v, 0, MAX_STEPS)?;
        }
        for (name, v) in [
            ("lr", self.lr),
            ("weight_decay", self.weight_decay),
            ("clip_norm", self.clip_norm),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                candle::bail!("{name} {v} is invalid; expected a finite number ≥ 0")
            }
        }
        Ok(())
    }
}

/// `grad_accum` of a `trainer_state.json` written before it existed.
fn one() -> usize {
    1
}

#[cfg(test)]
mod tests {
    use super::TrainConfig;

    #[test]
    fn rates_must_be_finite_and_not_negative() {
        assert!(TrainConfig::default().validate().is_ok());
        for cfg in [
            TrainConfig {
                lr: -1.0,
                ..TrainConfig::default()
            },
            TrainConfig {
                weight_decay: f64::NAN,
                ..TrainConfig::default()
            },
            TrainConfig {
                clip_norm: f64::INFINITY,
                ..TrainConfig::default()
            },
        ] {
            let e = cfg.validate().unwrap_err().to_string();
            assert!(e.contains("expected a finite number ≥ 0"), "{e}");
        }
    }
}
