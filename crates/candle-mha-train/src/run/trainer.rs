//! [`Trainer`]: a run's model, optimizer and state: seeded batches, one step of AdamW with
//! clipping and a schedule, evaluation, atomic checkpoints, exact resume. The loop over a
//! whole run is in `run.rs`.

use std::path::Path;

use candle::backprop::GradStore;
use candle::{DType, Device, Result, Tensor};
use candle_nn::VarMap;

use super::state::{device_kind, EvalRecord, StepStats, TrainerState, STATE_VERSION};
use super::{evaluate_examples, Evaluation, LrSchedule, TrainConfig};
use crate::data::DataSpec;
use crate::data::{Batch, Codec, Dataset, EvalSet, Example, TrainSource};
use crate::models::NextTokenPredictor;
use crate::run::commit::{recover_file_set, CommitPoint, FileSet, SetFiles};
use crate::run::lora::LoraRecord;
use crate::run_dir::{
    CHECKPOINT_FILES, CONFIG_FILE, LORA_FILE, MODEL_FILE, OPTIMIZER_FILE, STATE_FILE,
};
use crate::{RunError, RunResult};
use candle_mha::autocast::{autocast, Precision};
use candle_mha::checkpoint::{state_dict_of, NamedParameters, StateDict};
use candle_mha::optim::{clip_grad_norm, AdamW, AdamWConfig};
use candle_mha::rng::derive_seed;

/// The dropout label of micro-batch `m` of step `step`: `dropout/{step}` for the first,
/// `dropout/{step}/{m}` after it (every rank of a data-parallel run uses the same).
fn micro_batch_label(step: u64, m: usize) -> String {
    match m {
        0 => format!("dropout/{step}"),
        m => format!("dropout/{step}/{m}"),
    }
}

/// The error of a step whose batch has no position to predict.
pub(super) fn no_position(step: u64) -> RunError {
    candle::Error::Msg(format!(
        "step {}: the batch has no position to predict",
        step + 1
    ))
    .into()
}

/// The sizes of a step's (global) batch, for its [`StepStats`].
pub(super) struct StepSizes {
    /// Target positions counted in the loss.
    pub tokens: usize,
    /// Input positions (`N × L` summed over the micro-batches).
    pub input_tokens: usize,
    /// Sequences.
    pub sequences: usize,
}

/// Trains a [`NextTokenPredictor`] whose parameters live in a `VarMap`.
///
/// PyTorch equivalent: the `for step in range(steps): loss.backward(); clip; opt.step()`
/// loop of a training script, with `torch.save` of model, optimizer and step.
pub struct Trainer {
    model: NextTokenPredictor,
    varmap: VarMap,
    // The data-parallel step (data_parallel.rs) reads these two.
    pub(super) optimizer: AdamW,
    pub(super) schedule: LrSchedule,
    // The loop of a run (run.rs) reads and updates it.
    pub(super) state: TrainerState,
    codec: Option<Codec>,
    // A LoRA run's `lora.json`, written with every checkpoint (run/lora.rs sets it).
    pub(crate) lora: Option<LoraRecord>,
}

impl Trainer {
    /// A fresh run of `config` on `model` (its parameters in `varmap`). `data` describes what
    /// it trains on when that can be rebuilt ([`DataSpec`]; saved with every checkpoint for a
    /// resume or an evaluation to reopen), `None` when the caller passes its own data to
    /// [`run`](Self::run).
    pub fn new(
        model: NextTokenPredictor,
        varmap: VarMap,
        config: TrainConfig,
        data: Option<DataSpec>,
    ) -> Result<Self> {
        if config.batch_size == 0 {
            candle::bail!("batch_size must be greater than 0")
        }
        if config.grad_accum == 0 {
            candle::bail!("grad_accum must be at least 1 (1 = no accumulation), got 0")
        }
        config.validate()?;
        let optimizer = AdamW::from_varmap(
            &varmap,
            AdamWConfig {
                lr: config.lr,
                beta1: config.beta1,
                beta2: config.beta2,
                weight_decay: config.weight_decay,
                // PyTorch's eps (1e-8).
                ..AdamWConfig::default()
            },
        )?;
        let optimizer = match config.decay_matrices_only {
            true => optimizer.without_decay_for(|_, v| v.rank() < 2),
            false => optimizer,
        };
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
        let first = varmap
            .all_vars()
            .first()
            .map(|v| (v.dtype(), v.device().clone()));
        let state = TrainerState {
            step: 0,
            config,
            losses: Vec::new(),
            evals: Vec::new(),
            data: data.map(|d| d.absolute()).transpose()?,
            best: None,
            stopped_early: false,
            imported: None,
            max_tokens: None,
            version: STATE_VERSION,
            dtype: first.as_ref().map(|(d, _)| d.as_str().to_string()),
            device: first.as_ref().map(|(_, d)| device_kind(d).to_string()),
        };
        // What every save writes must be writable now, not after the compute: a data path
        // that is not UTF-8 cannot go into trainer_state.json.
        serde_json::to_string(&state).map_err(|e| {
            candle::Error::Msg(format!(
                "the run cannot be recorded in {STATE_FILE} ({e}): give paths in UTF-8"
            ))
        })?;
        Ok(Self {
            model,
            varmap,
            optimizer,
            schedule,
            state,
            codec: None,
            lora: None,
        })
    }

    /// Continues the run saved in `dir`: weights, optimizer moments, step and history.
    /// `model` and `varmap` must be built from the directory's `config.json` in the run's
    /// dtype ([`TrainerState::dtype`]; another is an error); `steps` replaces the saved total
    /// when given (to train further; this also lifts an early stop).
    pub fn resume(
        model: NextTokenPredictor,
        varmap: VarMap,
        dir: &Path,
        steps: Option<u64>,
    ) -> Result<Self> {
        // A save that a crash interrupted is finished (or was never begun): the files read
        // below are one checkpoint.
        recover_file_set(
            dir,
            SetFiles {
                allowed: &CHECKPOINT_FILES,
                read: &[STATE_FILE, MODEL_FILE, OPTIMIZER_FILE],
            },
        )?;
        let state = TrainerState::load(dir).map_err(|e| {
            candle::Error::Msg(format!("cannot resume from {}: {e}", dir.display()))
        })?;
        Self::resume_loaded(model, varmap, dir, state, steps)
    }

    /// [`resume`](Self::resume) from `dir`'s `state`, already loaded, its files already
    /// recovered or verified by the caller (each is hashed once per resume).
    pub(crate) fn resume_loaded(
        model: NextTokenPredictor,
        varmap: VarMap,
        dir: &Path,
        mut state: TrainerState,
        steps: Option<u64>,
    ) -> Result<Self> {
        let run_dtype = state.dtype()?;
        if let Some(var) = varmap.all_vars().first() {
            if var.dtype() != run_dtype {
                candle::bail!(
                    "cannot resume from {}: the run trains in {}, the model was built in {}",
                    dir.display(),
                    run_dtype.as_str(),
                    var.dtype().as_str()
                )
            }
        }
        if let Some(steps) = steps {
            state.config.steps = steps;
            // Asked to train further: an early stop of the saved run does not end this one.
            state.stopped_early = false;
        }
        let weights = StateDict::load(dir.join(MODEL_FILE))?;
        let opts = candle_mha::checkpoint::LoadOptions::new()
            .with_module("NextTokenPredictor")
            .with_source(&dir.join(MODEL_FILE).display().to_string());
        // Each tensor is let go once its variable holds it.
        candle_mha::checkpoint::load_into_varmap_owned(&varmap, weights, &opts)?;
        let lora = LoraRecord::load(dir, model.config())?;
        let mut trainer = Self::new(model, varmap, state.config.clone(), state.data.clone())?;
        trainer.lora = lora;
        trainer
            .optimizer
            .load_state_dict(&StateDict::load(dir.join(OPTIMIZER_FILE))?)?;
        // From now on this run is saved in this version, on this device.
        state.version = STATE_VERSION;
        state.dtype = trainer.state.dtype.clone();
        state.device = trainer.state.device.clone();
        state.data = trainer.state.data.clone();
        trainer.state = state;
        Ok(trainer)
    }

    /// A run at step `step` whose `model` already holds its weights (an imported
    /// checkpoint), with the optimizer's moments and step counts from `optimizer` (AdamW's
    /// [`state_dict`](AdamW::state_dict) names) when given, else fresh ones, and what the
    /// checkpoint recorded beyond them (`imported`, for its export).
    ///
    /// PyTorch equivalent: `model.load_state_dict(ckpt["model"]);
    /// optimizer.load_state_dict(ckpt["optimizer"]); iter_num = ckpt["iter_num"]`.
    pub fn from_imported(
        model: NextTokenPredictor,
        varmap: VarMap,
        config: TrainConfig,
        optimizer: Option<&StateDict>,
        step: u64,
        imported: Option<crate::ImportedRecord>,
    ) -> Result<Self> {
        let mut trainer = Self::new(model, varmap, config, None)?;
        if let Some(o) = optimizer {
            trainer.optimizer.load_state_dict(o)?;
        }
        trainer.state.step = step;
        trainer.state.imported = imported;
        Ok(trainer)
    }

    /// Changes how often the run evaluates and saves and after how many evaluations without a
    /// new best it stops (`None` keeps the run's value): what a resumed run may change without
    /// changing its batches, weights or optimizer.
    pub fn set_cadence(
        &mut self,
        eval_every: Option<u64>,
        save_every: Option<u64>,
        early_stop: Option<u64>,
    ) {
        let c = &mut self.state.config;
        c.eval_every = eval_every.unwrap_or(c.eval_every);
        c.save_every = save_every.unwrap_or(c.save_every);
        c.early_stop = early_stop.unwrap_or(c.early_stop);
    }

    /// Turns the steps' bf16 products ([`TrainConfig::autocast_bf16`]) on or off: the
    /// arithmetic of the steps to come, not the weights, batches or optimizer.
    pub fn set_autocast_bf16(&mut self, on: bool) {
        self.state.config.autocast_bf16 = on;
    }

    /// Records that the run trains on sequences of `max_tokens` tokens, shorter than its
    /// model's context + 1 ([`TrainerState::max_tokens`]), for a resume to keep.
    pub fn with_max_tokens(mut self, max_tokens: Option<usize>) -> Self {
        self.state.max_tokens = max_tokens;
        self
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
    pub fn train_step(&mut self, batch: &Batch) -> RunResult<StepStats> {
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
    ///
    /// The step runs inside candle's CPU thread pool (`Device::with_context`), so the calling
    /// thread takes part in every parallel op instead of handing each one to rayon's global
    /// pool and sleeping until it ends, a cost that shows most on few cores
    /// (`docs/benchmarks.md`).
    pub fn train_step_accumulated(&mut self, batches: &[Batch]) -> RunResult<StepStats> {
        let device = self.device();
        device.with_context(|| self.step_accumulated(batches))
    }

    fn step_accumulated(&mut self, batches: &[Batch]) -> RunResult<StepStats> {
        let step = self.state.step;
        let lr = self.schedule.lr(step);
        self.optimizer.set_lr(lr);
        let total: usize = batches.iter().map(|b| b.num_tokens).sum();
        if batches.is_empty() || total == 0 {
            return Err(no_position(step));
        }
        let mut grads: Option<GradStore> = None;
        let mut loss_value = 0f64;
        for (m, batch) in batches.iter().enumerate() {
            if batch.num_tokens == 0 {
                continue;
            }
            let weight = (batches.len() > 1).then(|| batch.num_tokens as f64 / total as f64);
            let value = self.micro_batch_backward(m, 0, batch, weight, &mut grads)?;
            if !value.is_finite() {
                return Err(RunError::LossNotFinite {
                    step,
                    loss: value,
                    lr,
                });
            }
            loss_value += value;
        }
        let Some(mut grads) = grads else {
            return Err(no_position(step));
        };
        let sizes = StepSizes {
            tokens: total,
            input_tokens: batches.iter().map(|b| b.input.elem_count()).sum(),
            sequences: batches.iter().map(Batch::batch_size).sum(),
        };
        Ok(self.finish_step(&mut grads, lr, loss_value, sizes, 0.0)?)
    }

    /// Forward and backward of micro-batch `m` of the current step in training mode, on its
    /// rows `first_row..` (a data-parallel rank's part; 0 for all of it) with the one-process
    /// run's dropout masks of those rows: the loss, times `weight` when given (the
    /// micro-batch's share of the step's tokens), and its gradients added into `grads`.
    /// Returns the (weighted) loss.
    pub(super) fn micro_batch_backward(
        &self,
        m: usize,
        first_row: usize,
        batch: &Batch,
        weight: Option<f64>,
        grads: &mut Option<GradStore>,
    ) -> Result<f64> {
        let label = micro_batch_label(self.state.step, m);
        let dropout_seed = derive_seed(self.state.config.seed, &label);
        // No mask when no sequence is padded: the attention skips the masking work.
        let kpm = batch.padded.then_some(&batch.key_padding_mask);
        let precision = match self.state.config.autocast_bf16 {
            true => Precision::Bf16,
            false => Precision::F32,
        };
        // The forward and its backward both inside: the ops read the precision as they run.
        let (value, g) = autocast(precision, || -> Result<_> {
            let mut loss = self.model.train_loss(
                &batch.input,
                kpm,
                (dropout_seed, first_row),
                &batch.targets,
                &batch.loss_mask,
            )?;
            if let Some(w) = weight {
                loss = loss.affine(w, 0.0)?;
            }
            let value = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            Ok((value, loss.backward()?))
        })?;
        *grads = Some(match grads.take() {
            None => g,
            Some(acc) => self.add_grads(acc, g)?,
        });
        Ok(value)
    }

    /// The end of a step, one process or data-parallel: clipping with the configured norm (or
    /// only measuring it), a stop on a non-finite norm with the weights unchanged, the
    /// optimizer step, and the step's record.
    pub(super) fn finish_step(
        &mut self,
        grads: &mut GradStore,
        lr: f64,
        loss_value: f64,
        sizes: StepSizes,
        comm_seconds: f64,
    ) -> Result<StepStats> {
        let step = self.state.step;
        let clip = match self.state.config.clip_norm {
            c if c > 0.0 => c,
            _ => f64::INFINITY,
        };
        let grad_norm = clip_grad_norm(grads, &self.optimizer.vars(), clip)?;
        if !grad_norm.is_finite() {
            candle::bail!(
                "gradient norm is {grad_norm} at step {}: stopping; the weights were not updated.",
                step + 1
            )
        }
        self.optimizer.step(grads)?;
        self.state.step += 1;
        let loss_value = loss_value as f32;
        self.state.losses.push(loss_value);
        Ok(StepStats {
            loss: loss_value,
            grad_norm,
            lr,
            tokens: sizes.tokens,
            input_tokens: sizes.input_tokens,
            sequences: sizes.sequences,
            comm_seconds,
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

    /// Where the parameters live.
    pub(super) fn device(&self) -> Device {
        self.optimizer
            .vars()
            .first()
            .map(|v| v.device().clone())
            .unwrap_or(Device::Cpu)
    }

    /// Writes `model.safetensors` (PyTorch names), `config.json`, `optimizer.safetensors`,
    /// `trainer_state.json` and the codec given to [`Trainer::with_codec`] into `dir` as one
    /// unit ([`FileSet`]: a crash at any point leaves this checkpoint or the previous one
    /// whole, never a mix); writes nothing and errors, naming the parameter, when a parameter
    /// holds NaN or infinity.
    pub fn save(&self, dir: &Path) -> Result<()> {
        self.save_with(dir, &mut |_| Ok(()))
    }

    /// [`save`](Self::save) with `hook` called at each point of the commit (an error stops
    /// the save there, as a crash would).
    pub(super) fn save_with(
        &self,
        dir: &Path,
        hook: &mut dyn FnMut(&CommitPoint) -> Result<()>,
    ) -> Result<()> {
        // A diverged run (a learning rate far too high) must not replace a good checkpoint.
        for (name, var) in self
            .varmap
            .data()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            if !all_finite(var)? {
                candle::bail!(
                    "step {}: parameter {name} holds NaN or infinite values (learning rate too high?): not saved, {} keeps its previous checkpoint",
                    self.state.step,
                    dir.display()
                )
            }
        }
        // The two large files stream into their staged files, one tensor at a time.
        let params: &dyn NamedParameters = &self.varmap;
        let model = state_dict_of(&[("", params)]);
        let optimizer = &self.optimizer;
        let mut set = FileSet::new(dir, &CHECKPOINT_FILES);
        if let Some(codec) = &self.codec {
            set.add(codec.file_name(), codec.to_json()?.into_bytes())?;
        }
        set.add_streamed(MODEL_FILE, |w| model.write_safetensors(w))?;
        set.add(CONFIG_FILE, self.model.config().to_json().into_bytes())?;
        if let Some(lora) = &self.lora {
            set.add(LORA_FILE, lora.to_json().into_bytes())?;
        }
        set.add_streamed(OPTIMIZER_FILE, |w| optimizer.write_safetensors(w))?;
        // The data's paths as seen from `dir`: a run moved as a whole still finds its data.
        let mut state = self.state.clone();
        state.data = state.data.map(|d| d.recorded_in(dir));
        let state = serde_json::to_string_pretty(&state)
            .map_err(|e| candle::Error::Msg(format!("serializing trainer state: {e}")))?;
        set.add(STATE_FILE, state.into_bytes())?;
        set.commit(hook).map_err(|e| {
            candle::Error::Msg(format!("saving the checkpoint in {}: {e}", dir.display()))
        })
    }
}

/// Whether every element of `t` is finite: read in place for a contiguous CPU f32/f64 tensor
/// (a model's largest parameter is not copied), through an f64 copy otherwise.
pub(crate) fn all_finite(t: &Tensor) -> Result<bool> {
    {
        let (storage, layout) = t.storage_and_layout();
        if let (candle::Storage::Cpu(cpu), Some((a, b))) = (&*storage, layout.contiguous_offsets())
        {
            match cpu {
                candle::CpuStorage::F32(v) => return Ok(v[a..b].iter().all(|x| x.is_finite())),
                candle::CpuStorage::F64(v) => return Ok(v[a..b].iter().all(|x| x.is_finite())),
                _ => {}
            }
        }
    }
    let values = t
        .flatten_all()?
        .to_dtype(candle::DType::F64)?
        .to_vec1::<f64>()?;
    Ok(values.iter().all(|x| x.is_finite()))
}
