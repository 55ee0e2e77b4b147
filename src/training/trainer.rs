//! [`Trainer`]: the training loop: seeded batches, AdamW with clipping and a schedule,
//! periodic evaluation, atomic checkpoints, exact resume.

use std::path::Path;
use std::time::Instant;

use candle::backprop::GradStore;
use candle::{DType, Device, Result, Tensor};
use candle_nn::VarMap;
use serde::{Deserialize, Serialize};

use super::metrics::{append_metrics, truncate_metrics, MetricsRecord, METRICS_FILE};
use super::{clip_grad_norm, evaluate_examples, AdamW, AdamWConfig, Evaluation, LrSchedule};
use crate::checkpoint::{state_dict_of, write_atomic, NamedParameters, StateDict};
use crate::data::{Batch, Codec, Dataset, EvalSet, Example, TrainSource};
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
    /// Sequences per batch (per micro-batch with `grad_accum > 1`). Default 64.
    pub batch_size: usize,
    /// Micro-batches whose gradients are summed into one update (the same update as one
    /// batch of `batch_size × grad_accum`, up to float rounding). Default 1.
    #[serde(default = "one")]
    pub grad_accum: usize,
    /// Stop after this many evaluations in a row without a new best validation loss (0 =
    /// never). Default 0.
    #[serde(default)]
    pub early_stop: u64,
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
        }
    }
}

fn one() -> usize {
    1
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
    /// The validation evaluation with the lowest loss so far (its weights are in `best/`).
    #[serde(default)]
    pub best: Option<EvalRecord>,
    /// Whether the run stopped early (`early_stop` evaluations without improvement).
    #[serde(default)]
    pub stopped_early: bool,
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
}

/// Hooks the loop calls: progress display, early stop (Ctrl-C).
pub trait TrainObserver {
    /// After each step.
    fn on_step(&mut self, _step: u64, _stats: &StepStats) {}
    /// After each evaluation.
    fn on_eval(&mut self, _step: u64, _eval: &Evaluation) {}
    /// After each checkpoint.
    fn on_save(&mut self, _step: u64, _dir: &Path) {}
    /// After a validation evaluation that set a new best loss and was saved into `dir`.
    fn on_best(&mut self, _step: u64, _eval: &Evaluation, _dir: &Path) {}
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
/// The subdirectory of a run directory holding the checkpoint of the best validation loss.
pub const BEST_DIR: &str = "best";

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
    codec: Option<Codec>,
}

/// Copies the validation fields of `eval` into a metrics record.
fn fill_eval(record: &mut MetricsRecord, eval: &Evaluation) {
    record.val_loss = Some(eval.loss);
    record.val_perplexity = Some(eval.perplexity);
    record.val_accuracy = Some(eval.accuracy);
    record.val_bits_per_byte = eval.bits_per_byte;
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
        if config.grad_accum == 0 {
            candle::bail!("grad_accum must be at least 1 (1 = no accumulation), got 0")
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
            best: None,
            stopped_early: false,
        };
        Ok(Self {
            model,
            varmap,
            optimizer,
            schedule,
            state,
            codec: None,
        })
    }

    /// Continues the run saved in `dir`: weights, optimizer moments, step and history.
    /// `model` and `varmap` must be built from the directory's `config.json`; `steps`
    /// replaces the saved total when given (to train further; this also lifts an early stop).
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
            // Asked to train further: an early stop of the saved run does not end this one.
            state.stopped_early = false;
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

    /// Saves `codec` (`vocab.json` / `tokenizer.json`) with every checkpoint, `best/`
    /// included, so each is usable on its own.
    pub fn with_codec(mut self, codec: Codec) -> Self {
        self.codec = Some(codec);
        self
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
        self.train_step_accumulated(std::slice::from_ref(batch))
    }

    /// One optimizer step on the gradients of several micro-batches, each micro-batch's mean
    /// loss weighted by its share of the counted tokens, so the update is that of one batch
    /// holding them all (up to float rounding). Micro-batch `m > 0` draws its dropout from
    /// `"dropout/{step}/{m}"`. A non-finite loss stops with an error and leaves the weights
    /// unchanged.
    ///
    /// PyTorch equivalent: `for x in micro: (loss(x) * n_x / n).backward()`, then clip and
    /// `opt.step()`.
    pub fn train_step_accumulated(&mut self, batches: &[Batch]) -> Result<StepStats> {
        let step = self.state.step;
        let lr = self.schedule.lr(step);
        self.optimizer.set_lr(lr);
        let total: usize = batches.iter().map(|b| b.num_tokens).sum();
        if batches.is_empty() || total == 0 {
            candle::bail!("step {}: the batch has no position to predict", step + 1)
        }
        let mut grads: Option<GradStore> = None;
        let mut loss_value = 0f64;
        for (m, batch) in batches.iter().enumerate() {
            if batch.num_tokens == 0 {
                continue;
            }
            let label = match m {
                0 => format!("dropout/{step}"),
                m => format!("dropout/{step}/{m}"),
            };
            let dropout_seed = derive_seed(self.state.config.seed, &label);
            // No mask when no sequence is padded: the attention skips the masking work.
            let kpm = batch.padded.then_some(&batch.key_padding_mask);
            let logits = self.model.forward_train(&batch.input, kpm, dropout_seed)?;
            let mut loss = masked_cross_entropy(&logits, &batch.targets, &batch.loss_mask)?;
            if batches.len() > 1 {
                loss = loss.affine(batch.num_tokens as f64 / total as f64, 0.0)?;
            }
            let value = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            if !value.is_finite() {
                candle::bail!(
                    "training loss is {value} at step {} (lr {lr:.3e}): stopping; lower the learning rate or check the data. The weights were not updated.",
                    step + 1
                )
            }
            loss_value += value;
            let g = loss.backward()?;
            grads = Some(match grads {
                None => g,
                Some(acc) => self.add_grads(acc, g)?,
            });
        }
        let Some(mut grads) = grads else {
            candle::bail!(
                "step {}: no micro-batch has a position to predict",
                step + 1
            )
        };
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
        let loss_value = loss_value as f32;
        self.state.losses.push(loss_value);
        Ok(StepStats {
            loss: loss_value,
            grad_norm,
            lr,
            tokens: total,
            input_tokens: batches.iter().map(|b| b.input.elem_count()).sum(),
            sequences: batches.iter().map(Batch::batch_size).sum(),
        })
    }

    /// `acc + g` for every trainable variable, detached (candle leaves gradients attached to
    /// their graph; keeping them would keep every micro-batch's activations alive).
    fn add_grads(&self, mut acc: GradStore, g: GradStore) -> Result<GradStore> {
        for var in self.optimizer.vars() {
            let t: &Tensor = &var;
            let sum = match (acc.get(t), g.get(t)) {
                (Some(a), Some(b)) => Some((a.detach() + b.detach())?),
                (None, Some(b)) => Some(b.detach()),
                _ => None,
            };
            if let Some(sum) = sum {
                acc.insert(t, sum);
            }
        }
        Ok(acc)
    }

    /// The micro-batches of step `step`: `batch_size × grad_accum` examples from `train`,
    /// cut into `grad_accum` batches of `batch_size` in order.
    pub fn batches_for_step(
        &self,
        train: &dyn TrainSource,
        step: u64,
        device: &Device,
    ) -> Result<Vec<Batch>> {
        let cfg = &self.state.config;
        let examples = train.examples(cfg.seed, step, cfg.batch_size * cfg.grad_accum)?;
        examples
            .chunks(cfg.batch_size)
            .map(|chunk| {
                let refs: Vec<&Example> = chunk.iter().collect();
                Batch::from_examples(&refs, device)
            })
            .collect()
    }

    /// Trains until `config.steps`, evaluating on `val` and checkpointing to `dir` (when
    /// given) as configured, and at the end. Returns the final evaluation. Stops with an error,
    /// leaving the last checkpoint, at a non-finite training loss or when a save follows an
    /// evaluation with a non-finite loss (diverged weights).
    ///
    /// As [`Trainer::run_source`] with a dataset for each side and no bits per byte.
    pub fn run(
        &mut self,
        train: &Dataset,
        val: &Dataset,
        dir: Option<&Path>,
        observer: &mut dyn TrainObserver,
    ) -> Result<Evaluation> {
        let val = EvalSet {
            data: val,
            text_bytes: None,
        };
        self.run_source(train, &val, dir, observer)
    }

    /// Trains on the batches of `train` until `config.steps` or an early stop.
    ///
    /// Every `eval_every` steps it evaluates on `val`; an evaluation with a new lowest loss
    /// is saved into `dir/best/` (a complete checkpoint). With `early_stop = N > 0`, N
    /// evaluations in a row without a new best end the run. Every `save_every` steps and at
    /// the end it saves into `dir`, and every step it appends to `dir/metrics.jsonl`. Returns
    /// the final evaluation (on `val`, or on the training set when `val` is empty, as
    /// [`Trainer::run`] always did). Stops with an error, leaving the last checkpoint, at a
    /// non-finite training loss or when a save follows an evaluation with a non-finite loss.
    pub fn run_source(
        &mut self,
        train: &dyn TrainSource,
        val: &EvalSet,
        dir: Option<&Path>,
        observer: &mut dyn TrainObserver,
    ) -> Result<Evaluation> {
        if train.is_empty() {
            candle::bail!("the training set is empty")
        }
        let device = self.device();
        let cfg = self.state.config.clone();
        let metrics = dir.map(|d| d.join(METRICS_FILE));
        if let (Some(d), Some(m)) = (dir, &metrics) {
            std::fs::create_dir_all(d).map_err(|e| {
                candle::Error::Msg(format!("cannot create run directory {}: {e}", d.display()))
            })?;
            // A resumed run continues the file from its checkpoint's step.
            truncate_metrics(m, self.state.step)?;
        }
        let has_val = !val.data.is_empty();
        while self.state.step < cfg.steps && !self.state.stopped_early {
            if observer.should_stop() {
                break;
            }
            let batches = self.batches_for_step(train, self.state.step, &device)?;
            let started = Instant::now();
            let stats = self.train_step_accumulated(&batches)?;
            let seconds = started.elapsed().as_secs_f64();
            let step = self.state.step;
            observer.on_step(step, &stats);
            let mut record = MetricsRecord {
                step,
                train_loss: Some(f64::from(stats.loss)),
                lr: Some(stats.lr),
                grad_norm: Some(stats.grad_norm),
                tokens_per_s: Some(stats.input_tokens as f64 / seconds.max(1e-9)),
                tokens: Some(stats.input_tokens),
                ..Default::default()
            };
            let mut eval_loss = None;
            if cfg.eval_every > 0
                && step.is_multiple_of(cfg.eval_every)
                && step < cfg.steps
                && has_val
            {
                let eval = self.evaluate_set(val)?;
                observer.on_eval(step, &eval);
                eval_loss = Some(eval.loss);
                fill_eval(&mut record, &eval);
                self.track_best(&eval, dir, observer)?;
            }
            if let Some(m) = &metrics {
                append_metrics(m, &record)?;
            }
            if let Some(dir) = dir {
                if cfg.save_every > 0 && step.is_multiple_of(cfg.save_every) && step < cfg.steps {
                    diverged(step, eval_loss, dir)?;
                    self.save(dir)?;
                    observer.on_save(step, dir);
                }
            }
        }
        let eval = if has_val {
            self.evaluate_set(val)?
        } else {
            self.evaluate(&*train.fallback_eval(cfg.seed)?)?
        };
        observer.on_eval(self.state.step, &eval);
        if has_val {
            self.track_best(&eval, dir, observer)?;
        }
        if let Some(m) = &metrics {
            let mut record = MetricsRecord {
                step: self.state.step,
                ..Default::default()
            };
            fill_eval(&mut record, &eval);
            append_metrics(m, &record)?;
        }
        if let Some(dir) = dir {
            diverged(self.state.step, Some(eval.loss), dir)?;
            self.save(dir)?;
            observer.on_save(self.state.step, dir);
        }
        Ok(eval)
    }

    /// Records `eval` as the best when its loss is the lowest so far (saving `dir/best/`),
    /// and sets `stopped_early` after `early_stop` evaluations without one.
    fn track_best(
        &mut self,
        eval: &Evaluation,
        dir: Option<&Path>,
        observer: &mut dyn TrainObserver,
    ) -> Result<()> {
        let step = self.state.step;
        let improved = eval.loss.is_finite()
            && self
                .state
                .best
                .as_ref()
                .is_none_or(|b| eval.loss < b.eval.loss);
        if improved {
            self.state.best = Some(EvalRecord { step, eval: *eval });
            if let Some(dir) = dir {
                let best = dir.join(BEST_DIR);
                self.save(&best)?;
                observer.on_best(step, eval, &best);
            }
        } else if self.state.config.early_stop > 0 {
            let best_step = self.state.best.as_ref().map_or(0, |b| b.step);
            // Validation evaluations after the best one (the history holds only those when
            // there is a validation set).
            let since = self
                .state
                .evals
                .iter()
                .filter(|e| e.step > best_step)
                .count() as u64;
            if since >= self.state.config.early_stop {
                self.state.stopped_early = true;
            }
        }
        Ok(())
    }

    /// Evaluates on a validation set (with bits per byte when it has them) and records it.
    pub fn evaluate_set(&mut self, set: &EvalSet) -> Result<Evaluation> {
        let eval = evaluate_examples(
            &self.model,
            set.data.examples.iter().cloned().map(Ok),
            self.state.config.batch_size,
            &self.device(),
            set.text_bytes,
        )?;
        self.state.evals.push(EvalRecord {
            step: self.state.step,
            eval,
        });
        Ok(eval)
    }

    /// Evaluates on `dataset` and records it in the history.
    pub fn evaluate(&mut self, dataset: &Dataset) -> Result<Evaluation> {
        self.evaluate_set(&EvalSet {
            data: dataset,
            text_bytes: None,
        })
    }

    fn device(&self) -> Device {
        self.optimizer
            .vars()
            .first()
            .map(|v| v.device().clone())
            .unwrap_or(Device::Cpu)
    }

    /// Writes `model.safetensors` (PyTorch names), `config.json`, `optimizer.safetensors`,
    /// `trainer_state.json` and the codec given to [`Trainer::with_codec`] into `dir`, each
    /// atomically; writes nothing and errors, naming the
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
        if let Some(codec) = &self.codec {
            codec.save_dir(dir)?;
        }
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
