//! [`Trainer`]: the training loop: seeded batches, AdamW with clipping and a schedule,
//! periodic evaluation, atomic checkpoints, exact resume.

use std::path::Path;

use candle::{DType, Device, Result};
use candle_nn::VarMap;
use serde::{Deserialize, Serialize};

use super::{clip_grad_norm, evaluate, AdamW, AdamWConfig, Evaluation, LrSchedule};
use crate::checkpoint::{state_dict_of, write_atomic, NamedParameters, StateDict};
use crate::data::{Batch, Dataset};
use crate::models::{masked_cross_entropy, NextTokenPredictor};
use crate::rng::derive_seed;

/// Training hyper-parameters.
///
/// PyTorch equivalent: the arguments of a typical training script (nanoGPT-style):
/// `AdamW(lr, betas, weight_decay)`, `clip_grad_norm_(max_norm)`, warmup + cosine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Optimizer steps of the whole run. Default 1500.
    pub steps: u64,
    /// Sequences per batch. Default 64.
    pub batch_size: usize,
    /// Peak learning rate. Default 3e-3.
    pub lr: f64,
    /// Final learning rate of the cosine decay. Default 3e-4.
    pub min_lr: f64,
    /// Linear warmup steps. Default 100.
    pub warmup_steps: u64,
    /// AdamW decoupled weight decay. Default 0.01.
    pub weight_decay: f64,
    /// AdamW β1. Default 0.9.
    pub beta1: f64,
    /// AdamW β2. Default 0.98.
    pub beta2: f64,
    /// Global gradient-norm clip (0 = off). Default 1.0.
    pub clip_norm: f64,
    /// Evaluate every this many steps (0 = only at the end). Default 250.
    pub eval_every: u64,
    /// Write a checkpoint every this many steps (0 = only at the end). Default 500.
    pub save_every: u64,
    /// Seed of batch order and dropout. Default 0.
    pub seed: u64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            steps: 1500,
            batch_size: 64,
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
        }
    }
}

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
    /// Where the data came from (free-form JSON, written by the caller; used by `mha eval`).
    pub data: serde_json::Value,
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
    /// Input positions processed (`N × L`, padding included).
    pub input_tokens: usize,
}

/// Hooks the loop calls: progress display, early stop (Ctrl-C).
pub trait TrainObserver {
    /// After each step.
    fn on_step(&mut self, _step: u64, _stats: &StepStats) {}
    /// After each evaluation.
    fn on_eval(&mut self, _step: u64, _eval: &Evaluation) {}
    /// After each checkpoint.
    fn on_save(&mut self, _step: u64, _dir: &Path) {}
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

/// Trains a [`NextTokenPredictor`] whose parameters live in a `VarMap`.
///
/// PyTorch equivalent: the `for step in range(steps): loss.backward(); clip; opt.step()`
/// loop of a training script, with `torch.save` of model, optimizer and step.
pub struct Trainer {
    model: NextTokenPredictor,
    varmap: VarMap,
    optimizer: AdamW,
    schedule: LrSchedule,
    state: TrainerState,
}

/// An error when an evaluation just before a save gave a non-finite loss: the weights have
/// diverged (finite but huge, or NaN) and must not replace the checkpoint in `dir`.
fn diverged(step: u64, eval_loss: Option<f64>, dir: &Path) -> Result<()> {
    match eval_loss {
        Some(loss) if !loss.is_finite() => candle::bail!(
            "step {step}: evaluation loss is {loss}, the weights have diverged (learning rate too high?): not saved, {} keeps its previous checkpoint",
            dir.display()
        ),
        _ => Ok(()),
    }
}

impl Trainer {
    /// A fresh run.
    pub fn new(
        model: NextTokenPredictor,
        varmap: VarMap,
        config: TrainConfig,
        data: serde_json::Value,
    ) -> Result<Self> {
        if config.batch_size == 0 {
            candle::bail!("batch_size must be greater than 0")
        }
        let optimizer = AdamW::from_varmap(
            &varmap,
            AdamWConfig {
                lr: config.lr,
                beta1: config.beta1,
                beta2: config.beta2,
                eps: 1e-8,
                weight_decay: config.weight_decay,
            },
        )?;
        // After the optimizer, which checks lr (min_lr derives from it in the CLI).
        if config.clip_norm.is_nan() || config.clip_norm < 0.0 {
            candle::bail!("clip_norm must be >= 0 (0 = off), got {}", config.clip_norm)
        }
        if !(0.0..f64::INFINITY).contains(&config.min_lr) {
            candle::bail!("min_lr must be finite and >= 0, got {}", config.min_lr)
        }
        let schedule = LrSchedule {
            base_lr: config.lr,
            min_lr: config.min_lr,
            warmup_steps: config.warmup_steps,
            total_steps: config.steps,
        };
        let state = TrainerState {
            step: 0,
            config,
            losses: Vec::new(),
            evals: Vec::new(),
            data,
        };
        Ok(Self {
            model,
            varmap,
            optimizer,
            schedule,
            state,
        })
    }

    /// Continues the run saved in `dir`: weights, optimizer moments, step and history.
    /// `model` and `varmap` must be built from the directory's `config.json`; `steps`
    /// replaces the saved total when given (to train further).
    pub fn resume(
        model: NextTokenPredictor,
        varmap: VarMap,
        dir: &Path,
        steps: Option<u64>,
    ) -> Result<Self> {
        let text = std::fs::read_to_string(dir.join(STATE_FILE)).map_err(|e| {
            candle::Error::Msg(format!(
                "cannot resume from {}: {e}",
                dir.join(STATE_FILE).display()
            ))
        })?;
        let mut state: TrainerState = serde_json::from_str(&text).map_err(|e| {
            candle::Error::Msg(format!("invalid {}: {e}", dir.join(STATE_FILE).display()))
        })?;
        if let Some(steps) = steps {
            state.config.steps = steps;
        }
        let weights = StateDict::load(dir.join(MODEL_FILE))?;
        let opts = crate::checkpoint::LoadOptions::new()
            .with_module("NextTokenPredictor")
            .with_source(&dir.join(MODEL_FILE).display().to_string());
        crate::checkpoint::load_into_varmap(&varmap, &weights, &opts)?;
        let mut trainer = Self::new(model, varmap, state.config.clone(), state.data.clone())?;
        trainer
            .optimizer
            .load_state_dict(&StateDict::load(dir.join(OPTIMIZER_FILE))?)?;
        trainer.state = state;
        Ok(trainer)
    }

    /// The model.
    pub fn model(&self) -> &NextTokenPredictor {
        &self.model
    }

    /// The trainable variables.
    pub fn varmap(&self) -> &VarMap {
        &self.varmap
    }

    /// The run's state (step, losses, evaluations).
    pub fn state(&self) -> &TrainerState {
        &self.state
    }

    /// The batch of step `step`: epoch `step / batches_per_epoch`, position in a seeded
    /// permutation; a function of the step alone, which makes resume exact.
    pub fn batch_for_step(&self, train: &Dataset, step: u64, device: &Device) -> Result<Batch> {
        let bs = self.state.config.batch_size;
        let per_epoch = train.num_batches(bs).max(1) as u64;
        train.batch(
            bs,
            step / per_epoch,
            (step % per_epoch) as usize,
            self.state.config.seed,
            device,
        )
    }

    /// One optimizer step on `batch`. A non-finite loss stops with an error and leaves the
    /// weights unchanged.
    pub fn train_step(&mut self, batch: &Batch) -> Result<StepStats> {
        let step = self.state.step;
        let lr = self.schedule.lr(step);
        self.optimizer.set_lr(lr);
        let dropout_seed = derive_seed(self.state.config.seed, &format!("dropout/{step}"));
        let logits =
            self.model
                .forward_train(&batch.input, Some(&batch.key_padding_mask), dropout_seed)?;
        let loss = masked_cross_entropy(&logits, &batch.targets, &batch.loss_mask)?;
        let loss_value = loss.to_dtype(DType::F32)?.to_scalar::<f32>()?;
        if !loss_value.is_finite() {
            candle::bail!(
                "training loss is {loss_value} at step {} (lr {lr:.3e}): stopping; lower the learning rate or check the data. The weights were not updated.",
                step + 1
            )
        }
        let mut grads = loss.backward()?;
        let grad_norm = match self.state.config.clip_norm {
            c if c > 0.0 => clip_grad_norm(&mut grads, &self.optimizer.vars(), c)?,
            _ => clip_grad_norm(&mut grads, &self.optimizer.vars(), f64::INFINITY)?,
        };
        if !grad_norm.is_finite() {
            candle::bail!(
                "gradient norm is {grad_norm} at step {}: stopping; the weights were not updated.",
                step + 1
            )
        }
        self.optimizer.step(&grads)?;
        self.state.step += 1;
        self.state.losses.push(loss_value);
        Ok(StepStats {
            loss: loss_value,
            grad_norm,
            lr,
            tokens: batch.num_tokens,
            input_tokens: batch.input.elem_count(),
        })
    }

    /// Trains until `config.steps`, evaluating on `val` and checkpointing to `dir` (when
    /// given) as configured, and at the end. Returns the final evaluation. Stops with an error,
    /// leaving the last checkpoint, at a non-finite training loss or when a save follows an
    /// evaluation with a non-finite loss (diverged weights).
    pub fn run(
        &mut self,
        train: &Dataset,
        val: &Dataset,
        dir: Option<&Path>,
        observer: &mut dyn TrainObserver,
    ) -> Result<Evaluation> {
        if train.is_empty() {
            candle::bail!("the training set is empty")
        }
        let device = self.device();
        let cfg = self.state.config.clone();
        while self.state.step < cfg.steps {
            if observer.should_stop() {
                break;
            }
            let batch = self.batch_for_step(train, self.state.step, &device)?;
            let stats = self.train_step(&batch)?;
            let step = self.state.step;
            observer.on_step(step, &stats);
            let mut eval_loss = None;
            if cfg.eval_every > 0
                && step.is_multiple_of(cfg.eval_every)
                && step < cfg.steps
                && !val.is_empty()
            {
                let eval = self.evaluate(val)?;
                observer.on_eval(step, &eval);
                eval_loss = Some(eval.loss);
            }
            if let Some(dir) = dir {
                if cfg.save_every > 0 && step.is_multiple_of(cfg.save_every) && step < cfg.steps {
                    diverged(step, eval_loss, dir)?;
                    self.save(dir)?;
                    observer.on_save(step, dir);
                }
            }
        }
        let eval = if val.is_empty() {
            self.evaluate(train)?
        } else {
            self.evaluate(val)?
        };
        observer.on_eval(self.state.step, &eval);
        if let Some(dir) = dir {
            diverged(self.state.step, Some(eval.loss), dir)?;
            self.save(dir)?;
            observer.on_save(self.state.step, dir);
        }
        Ok(eval)
    }

    /// Evaluates on `dataset` and records it in the history.
    pub fn evaluate(&mut self, dataset: &Dataset) -> Result<Evaluation> {
        let eval = evaluate(
            &self.model,
            dataset,
            self.state.config.batch_size,
            &self.device(),
        )?;
        self.state.evals.push(EvalRecord {
            step: self.state.step,
            eval,
        });
        Ok(eval)
    }

    fn device(&self) -> Device {
        self.optimizer
            .vars()
            .first()
            .map(|v| v.device().clone())
            .unwrap_or(Device::Cpu)
    }

    /// Writes `model.safetensors` (PyTorch names), `config.json`, `optimizer.safetensors` and
    /// `trainer_state.json` into `dir`, each atomically; writes nothing and errors, naming the
    /// parameter, when a parameter holds NaN or infinity.
    pub fn save(&self, dir: &Path) -> Result<()> {
        // A diverged run (a learning rate far too high) must not replace a good checkpoint.
        for (name, var) in self
            .varmap
            .data()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let values = var
                .flatten_all()?
                .to_dtype(candle::DType::F64)?
                .to_vec1::<f64>()?;
            if !values.iter().all(|x| x.is_finite()) {
                candle::bail!(
                    "step {}: parameter {name} holds NaN or infinite values (learning rate too high?): not saved, {} keeps its previous checkpoint",
                    self.state.step,
                    dir.display()
                )
            }
        }
        std::fs::create_dir_all(dir).map_err(|e| {
            candle::Error::Msg(format!(
                "cannot create checkpoint directory {}: {e}",
                dir.display()
            ))
        })?;
        let params: &dyn NamedParameters = &self.varmap;
        state_dict_of(&[("", params)]).save_safetensors(dir.join(MODEL_FILE))?;
        write_atomic(
            &dir.join(CONFIG_FILE),
            self.model.config().to_json().as_bytes(),
        )?;
        self.optimizer
            .state_dict()?
            .save_safetensors(dir.join(OPTIMIZER_FILE))?;
        let state = serde_json::to_string_pretty(&self.state)
            .map_err(|e| candle::Error::Msg(format!("serializing trainer state: {e}")))?;
        write_atomic(&dir.join(STATE_FILE), state.as_bytes())
    }
}
