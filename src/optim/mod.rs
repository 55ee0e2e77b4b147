//! [`AdamW`] with PyTorch's update and a state that can be saved and restored, and
//! [`clip_grad_norm`].
//!
//! candle-nn's `AdamW` keeps its moments private, so a run cannot be checkpointed and resumed
//! exactly; this one exposes them as a [`StateDict`]. Its CPU update is one fused pass per
//! parameter (`cpu.rs`).
//!
//! PyTorch equivalent: `torch.optim.AdamW`, `torch.nn.utils.clip_grad_norm_`.

use candle::backprop::GradStore;
use candle::{DType, Result, Tensor, Var};
use candle_nn::VarMap;

mod cpu;

use self::cpu::{adamw_update_in_place, sum_of_squares, Update};
use crate::checkpoint::StateDict;

/// AdamW hyper-parameters; defaults are `torch.optim.AdamW`'s.
///
/// PyTorch equivalent: `torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
/// weight_decay=0.01)` (no `amsgrad`, no `maximize`).
#[derive(Clone, Debug, PartialEq)]
pub struct AdamWConfig {
    /// Learning rate. Default `1e-3`.
    pub lr: f64,
    /// First-moment decay. Default `0.9`.
    pub beta1: f64,
    /// Second-moment decay. Default `0.999`.
    pub beta2: f64,
    /// Denominator term. Default `1e-8`.
    pub eps: f64,
    /// Decoupled weight decay, applied to every parameter. Default `0.01`.
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

impl AdamWConfig {
    /// Checks the hyper-parameters with PyTorch's messages (`Invalid learning rate: -1`, …).
    ///
    /// PyTorch equivalent: the checks of `torch.optim.AdamW.__init__`: `lr`, `eps` and
    /// `weight_decay` ≥ 0, each beta in `[0, 1)`. Deliberately also rejected: infinite `lr`,
    /// `eps` and `weight_decay`, which PyTorch accepts and which turn every weight into NaN.
    pub fn validate(&self) -> Result<()> {
        let checks = [
            (
                "Invalid learning rate",
                self.lr,
                (0.0..f64::INFINITY).contains(&self.lr),
            ),
            (
                "Invalid epsilon value",
                self.eps,
                (0.0..f64::INFINITY).contains(&self.eps),
            ),
            (
                "Invalid beta parameter at index 0",
                self.beta1,
                (0.0..1.0).contains(&self.beta1),
            ),
            (
                "Invalid beta parameter at index 1",
                self.beta2,
                (0.0..1.0).contains(&self.beta2),
            ),
            (
                "Invalid weight_decay value",
                self.weight_decay,
                (0.0..f64::INFINITY).contains(&self.weight_decay),
            ),
        ];
        match checks.iter().find(|c| !c.2) {
            Some((what, value, _)) => candle::bail!("AdamW: {what}: {value}"),
            None => Ok(()),
        }
    }
}

struct Slot {
    name: String,
    var: Var,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    step: u64,
    /// Whether weight decay applies (PyTorch: the parameter's group has `weight_decay > 0`).
    decay: bool,
}

impl Slot {
    /// The step in candle's tensor ops, where `adamw_update_in_place` does not apply (CUDA,
    /// other dtypes, strided tensors): the same operations in the same order.
    fn tensor_update(&mut self, u: &Update, g: &Tensor) -> Result<()> {
        let p = (self.var.as_tensor().detach() * u.decay)?;
        // m.lerp_(g, 1 - β1) = m + (1 - β1)(g - m)
        self.exp_avg = (&self.exp_avg + ((g - &self.exp_avg)? * (1.0 - u.beta1))?)?;
        self.exp_avg_sq = ((&self.exp_avg_sq * u.beta2)? + (g.sqr()? * (1.0 - u.beta2))?)?;
        // A true division, as PyTorch's and the CPU loop's (`tensor / f64` would multiply by
        // the reciprocal, one rounding apart).
        let bias2_sqrt = Tensor::new(u.bias2_sqrt, g.device())?.to_dtype(g.dtype())?;
        let denom = (self.exp_avg_sq.sqrt()?.broadcast_div(&bias2_sqrt)? + u.eps)?;
        let update = ((&self.exp_avg / denom)? * u.step_size)?;
        self.var.set(&(p - update)?)
    }
}

/// AdamW over named variables.
///
/// PyTorch equivalent: `torch.optim.AdamW` (single-tensor path): per parameter,
/// `p *= 1 - lr·wd; m.lerp_(g, 1-β1); v = β2 v + (1-β2) g²;
/// p -= lr/(1-β1ᵗ) · m / (√v/√(1-β2ᵗ) + eps)`, with a step count per parameter; a
/// parameter without gradient is skipped, as PyTorch skips `grad is None`.
pub struct AdamW {
    slots: Vec<Slot>,
    config: AdamWConfig,
}

impl AdamW {
    /// An optimizer over `params` (name, variable); errors when [`AdamWConfig::validate`]
    /// does.
    pub fn new(params: Vec<(String, Var)>, config: AdamWConfig) -> Result<Self> {
        config.validate()?;
        let slots = params
            .into_iter()
            .map(|(name, var)| {
                // Two storages, made now: the CPU step updates the moments in place, and made
                // at the first step they would land among the freed activations of a retained
                // heap, which the next step's activations no longer fit (a higher peak).
                let zeros = || var.as_tensor().zeros_like();
                Ok(Slot {
                    name,
                    exp_avg: zeros()?,
                    exp_avg_sq: zeros()?,
                    var,
                    step: 0,
                    decay: true,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { slots, config })
    }

    /// An optimizer over every variable of `varmap`, in name order (deterministic).
    pub fn from_varmap(varmap: &VarMap, config: AdamWConfig) -> Result<Self> {
        let data = varmap.data().lock().unwrap_or_else(|p| p.into_inner());
        let mut params: Vec<(String, Var)> =
            data.iter().map(|(n, v)| (n.clone(), v.clone())).collect();
        params.sort_by(|a, b| a.0.cmp(&b.0));
        drop(data);
        Self::new(params, config)
    }

    /// The same optimizer with no weight decay for the parameters where `no_decay(name, var)`
    /// holds, e.g. nanoGPT's rule, biases and norms (`var.rank() < 2`).
    ///
    /// PyTorch equivalent: two parameter groups, the second with `weight_decay=0.0`.
    pub fn without_decay_for(mut self, no_decay: impl Fn(&str, &Var) -> bool) -> Self {
        for s in self.slots.iter_mut() {
            s.decay = !no_decay(&s.name, &s.var);
        }
        self
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &AdamWConfig {
        &self.config
    }

    /// The current learning rate.
    pub fn lr(&self) -> f64 {
        self.config.lr
    }

    /// Sets the learning rate (for schedules).
    ///
    /// PyTorch equivalent: `for g in opt.param_groups: g["lr"] = lr`.
    pub fn set_lr(&mut self, lr: f64) {
        self.config.lr = lr;
    }

    /// The variables, in optimizer order.
    pub fn vars(&self) -> Vec<Var> {
        self.slots.iter().map(|s| s.var.clone()).collect()
    }

    /// One update from `grads`; errors, changing nothing, when the hyper-parameters (a
    /// learning rate from [`set_lr`](Self::set_lr)) do not pass [`AdamWConfig::validate`].
    ///
    /// PyTorch equivalent: `optimizer.step()`.
    pub fn step(&mut self, grads: &GradStore) -> Result<()> {
        self.step_with(grads, true)
    }

    /// [`step`](Self::step), in place on the CPU when `in_place` (the tests compare both).
    fn step_with(&mut self, grads: &GradStore, in_place: bool) -> Result<()> {
        self.config.validate()?;
        let AdamWConfig {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } = self.config;
        for slot in self.slots.iter_mut() {
            let Some(g) = grads.get(slot.var.as_tensor()) else {
                continue;
            };
            // Detached: candle leaves a variable's gradient attached to the forward graph, and
            // moments built from it would chain every step's graph (all its activations) onto
            // the next step's, so memory would grow by one forward pass per step.
            let g = &g.detach();
            slot.step += 1;
            let t = slot.step as i32;
            let u = Update {
                decay: match slot.decay {
                    true => 1.0 - lr * weight_decay,
                    false => 1.0,
                },
                beta1,
                beta2,
                step_size: lr / (1.0 - beta1.powi(t)),
                bias2_sqrt: (1.0 - beta2.powi(t)).sqrt(),
                eps,
            };
            let (p, m, v) = (slot.var.as_tensor(), &slot.exp_avg, &slot.exp_avg_sq);
            if !(in_place && adamw_update_in_place(&u, p, g, m, v)?) {
                slot.tensor_update(&u, g)?;
            }
        }
        Ok(())
    }

    /// The moments and step counts: `step.<name>` (f64 scalar) for every parameter,
    /// `exp_avg.<name>` and `exp_avg_sq.<name>` for each one stepped at least once, and the
    /// hyper-parameters in the metadata. A fresh optimizer's state is its step counts (zeros).
    ///
    /// PyTorch equivalent: `optimizer.state_dict()` (where a parameter never stepped has no
    /// entry in `state`).
    pub fn state_dict(&self) -> Result<StateDict> {
        // Copies: the moments are updated in place by later steps.
        self.state(Tensor::copy)
    }

    /// [`state_dict`](Self::state_dict) as safetensors written into `w`, one tensor at a time
    /// and without copying the moments (a checkpoint save: the state is written whole before
    /// the next step).
    ///
    /// PyTorch equivalent: `torch.save(optimizer.state_dict(), f)`.
    pub fn write_safetensors(&self, w: &mut dyn std::io::Write) -> Result<()> {
        self.state(|t| Ok(t.clone()))?.write_safetensors(w)
    }

    /// The state with each moment as `take` gives it.
    fn state(&self, take: impl Fn(&Tensor) -> Result<Tensor>) -> Result<StateDict> {
        let mut tensors = Vec::new();
        for s in &self.slots {
            // Never stepped: its moments are zeros, which PyTorch does not keep either.
            if s.step > 0 {
                tensors.push((format!("exp_avg.{}", s.name), take(&s.exp_avg)?));
                tensors.push((format!("exp_avg_sq.{}", s.name), take(&s.exp_avg_sq)?));
            }
            tensors.push((
                format!("step.{}", s.name),
                Tensor::new(s.step as f64, s.var.device())?,
            ));
        }
        let c = &self.config;
        Ok(StateDict::from_tensors(tensors)
            .with_metadata("lr", &c.lr.to_string())
            .with_metadata("beta1", &c.beta1.to_string())
            .with_metadata("beta2", &c.beta2.to_string())
            .with_metadata("eps", &c.eps.to_string())
            .with_metadata("weight_decay", &c.weight_decay.to_string()))
    }

    /// Restores what [`state_dict`](Self::state_dict) saved: every parameter's step count, and
    /// its moments with its shape where the count is not zero (at zero they may be absent: a
    /// fresh state). Errors, changing nothing, naming the first key missing or misshapen.
    ///
    /// PyTorch equivalent: `optimizer.load_state_dict(state)`.
    pub fn load_state_dict(&mut self, sd: &StateDict) -> Result<()> {
        let mut loaded = Vec::with_capacity(self.slots.len());
        for s in &self.slots {
            let get = |key: String, like: &Tensor| -> Result<Tensor> {
                let t = sd
                    .get(&key)
                    .ok_or_else(|| candle::Error::Msg(format!("optimizer state has no {key}")))?;
                if t.dims() != like.dims() {
                    candle::bail!(
                        "optimizer state {key} has shape {:?}, expected {:?}",
                        t.dims(),
                        like.dims()
                    )
                }
                // A copy of its own: the steps update the moments in place, and `sd`'s
                // tensors must not change with them.
                t.to_dtype(like.dtype())?
                    .to_device(like.device())?
                    .contiguous()?
                    .copy()
            };
            let step = sd.get(&format!("step.{}", s.name)).ok_or_else(|| {
                candle::Error::Msg(format!("optimizer state has no step.{}", s.name))
            })?;
            let step = step.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            if !(step >= 0.0 && step.fract() == 0.0 && step < 2f64.powi(53)) {
                candle::bail!(
                    "optimizer state step.{} is {step}, expected a whole number of steps",
                    s.name
                )
            }
            let (m, v) = (
                format!("exp_avg.{}", s.name),
                format!("exp_avg_sq.{}", s.name),
            );
            let moments = match (step, sd.get(&m).is_some() || sd.get(&v).is_some()) {
                (0.0, false) => None, // a fresh state: zeros
                _ => Some((get(m, s.var.as_tensor())?, get(v, s.var.as_tensor())?)),
            };
            loaded.push((moments, step as u64));
        }
        for (s, (moments, step)) in self.slots.iter_mut().zip(loaded) {
            match moments {
                Some((m, v)) => (s.exp_avg, s.exp_avg_sq) = (m, v),
                None => {
                    // In place: the storages stay where they were made.
                    s.exp_avg.zero_set()?;
                    s.exp_avg_sq.zero_set()?;
                }
            }
            s.step = step;
        }
        Ok(())
    }
}

/// The candle-nn optimizer interface, so that AdamW drops into a candle-nn training loop
/// (`opt.backward_step(&loss)`) in place of `candle_nn::AdamW`, with PyTorch's update and a
/// saveable state. Variables given without names are named by their index (`"0"`, `"1"`,
/// ...), as PyTorch's `optimizer.state_dict()` keys them.
///
/// PyTorch equivalent: `torch.optim.AdamW(params, ...)`, `loss.backward(); opt.step()`.
impl candle_nn::Optimizer for AdamW {
    type Config = AdamWConfig;

    fn new(vars: Vec<Var>, config: AdamWConfig) -> Result<Self> {
        let params = vars
            .into_iter()
            .enumerate()
            .map(|(i, v)| (i.to_string(), v))
            .collect();
        AdamW::new(params, config)
    }

    fn step(&mut self, grads: &GradStore) -> Result<()> {
        AdamW::step(self, grads)
    }

    fn learning_rate(&self) -> f64 {
        self.lr()
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.set_lr(lr)
    }
}

/// Scales the gradients of `vars` so that their global L2 norm is at most `max_norm`, and
/// returns the norm before clipping.
///
/// PyTorch equivalent: `torch.nn.utils.clip_grad_norm_(params, max_norm)`: the scale is
/// `min(1, max_norm / (norm + 1e-6))`; `f64::INFINITY` only measures. Deliberately, a negative
/// or NaN `max_norm` is an error (PyTorch would flip or NaN the gradients).
pub fn clip_grad_norm(grads: &mut GradStore, vars: &[Var], max_norm: f64) -> Result<f64> {
    if max_norm.is_nan() || max_norm < 0.0 {
        candle::bail!("clip_grad_norm: max_norm must be >= 0 (inf: no clipping), got {max_norm}")
    }
    let mut sq = 0f64;
    for v in vars {
        if let Some(g) = grads.get(v.as_tensor()) {
            sq += match sum_of_squares(g) {
                Some(s) => s,
                None => g
                    .to_dtype(DType::F64)?
                    .sqr()?
                    .sum_all()?
                    .to_scalar::<f64>()?,
            };
        }
    }
    let norm = sq.sqrt();
    let scale = (max_norm / (norm + 1e-6)).min(1.0);
    if scale == 1.0 {
        // PyTorch multiplies by 1 in place; here that would be a new copy of every gradient.
        return Ok(norm);
    }
    for v in vars {
        if let Some(g) = grads.get(v.as_tensor()) {
            // Detached for the same reason as in `AdamW::step`.
            let scaled = (g.detach() * scale)?;
            grads.insert(v.as_tensor(), scaled);
        }
    }
    Ok(norm)
}

#[cfg(test)]
mod tests;
