//! [`read_nanogpt`]: a nanoGPT `ckpt.pt` read for import, every setting used or refused by
//! name.

use std::path::Path;

use candle::{DType, Device, Result, Tensor};
use candle_mha::checkpoint::{load_pickle, PickleValue, StateDict};

use super::*;
use crate::data::TextTokenizer;
use crate::formats::gpt2_names::{from_gpt2, nanogpt_parameters, our_name, Gpt2Format};
use crate::formats::{codec_for, Imported};
use crate::{ImportedRecord, TrainConfig};
use candle_mha::io::short_shape;

/// The whole number at `key` of `dict` (`what` names it), `None` when absent: an error unless
/// it is an integer from 0 to `max`.
fn whole(dict: &PickleValue, key: &str, what: &str, max: u64) -> Result<Option<u64>> {
    let Some(v) = dict.get(key) else {
        return Ok(None);
    };
    let n = match v {
        PickleValue::Bool(_) => None,
        v => v.as_i64(),
    };
    match n {
        Some(n) if n >= 0 && n as u64 <= max => Ok(Some(n as u64)),
        _ => candle::bail!(
            "{what}: {key} is {}; expected a whole number from 0 to {max}",
            shown(v)
        ),
    }
}

/// The finite number at `key` of `dict`, `None` when absent.
fn real(dict: &PickleValue, key: &str, what: &str) -> Result<Option<f64>> {
    let Some(v) = dict.get(key) else {
        return Ok(None);
    };
    match v {
        PickleValue::Bool(_) => None,
        v => v.as_f64().filter(|x| x.is_finite()),
    }
    .map(Some)
    .ok_or_else(|| {
        candle::Error::Msg(format!(
            "{what}: {key} is {}; expected a finite number",
            shown(v)
        ))
    })
}

/// nanoGPT's `model_args`.
fn nanogpt_args(v: &PickleValue) -> Result<NanoGptArgs> {
    let what = "model_args";
    let dim = |key: &str| -> Result<usize> {
        whole(v, key, what, crate::limits::MAX_VOCAB as u64)?
            .map(|n| n as usize)
            .ok_or_else(|| candle::Error::Msg(format!("{what}: no {key}")))
    };
    let bias = match v.get("bias") {
        None => true,
        Some(b) => b.as_bool().ok_or_else(|| {
            candle::Error::Msg(format!(
                "{what}: bias is {}; expected True or False",
                shown(b)
            ))
        })?,
    };
    Ok(NanoGptArgs {
        n_layer: dim("n_layer")?,
        n_head: dim("n_head")?,
        n_embd: dim("n_embd")?,
        block_size: dim("block_size")?,
        vocab_size: dim("vocab_size")?,
        bias,
        dropout: real(v, "dropout", what)?.unwrap_or(0.0),
    })
}

/// The settings of the optimizer's first group (nanoGPT's decayed matrices), for what
/// `config` lacks: `lr`, `betas`, `weight_decay`; its `eps` must be the trainer's.
struct Group {
    lr: Option<f64>,
    betas: Option<(f64, f64)>,
    weight_decay: Option<f64>,
}

fn first_group(opt: Option<&PickleValue>) -> Result<Group> {
    let none = Group {
        lr: None,
        betas: None,
        weight_decay: None,
    };
    let Some(g) = opt
        .and_then(|o| o.get("param_groups"))
        .and_then(PickleValue::as_list)
        .and_then(<[_]>::first)
    else {
        return Ok(none);
    };
    let what = "optimizer param_groups[0]";
    let betas = match g.get("betas") {
        None => None,
        Some(b) => {
            let pair = b.as_list().filter(|l| l.len() == 2);
            let nums = pair.map(|l| (l[0].as_f64(), l[1].as_f64()));
            match nums {
                Some((Some(b1), Some(b2))) if b1.is_finite() && b2.is_finite() => Some((b1, b2)),
                _ => candle::bail!("{what}: betas is {}; expected two numbers", shown(b)),
            }
        }
    };
    if let Some(eps) = real(g, "eps", what)? {
        let ours = candle_mha::optim::AdamWConfig::default().eps;
        if eps != ours {
            candle::bail!("{what}: eps is {eps}; the trainer's AdamW uses {ours}")
        }
    }
    Ok(Group {
        lr: real(g, "lr", what)?,
        betas,
        weight_decay: real(g, "weight_decay", what)?,
    })
}

/// The training settings of nanoGPT's `config` (its `train.py` globals): each one present
/// must be valid; one it lacks comes from the optimizer's first group, else the text
/// default, with a note saying so.
fn nanogpt_train(
    config: Option<&PickleValue>,
    optimizer: Option<&PickleValue>,
    notes: &mut Vec<String>,
) -> Result<TrainConfig> {
    let base = TrainConfig {
        decay_matrices_only: true,
        ..TrainConfig::for_text()
    };
    let empty = PickleValue::Dict(Vec::new());
    let c = match config {
        Some(c @ PickleValue::Dict(_)) => c,
        Some(other) => candle::bail!("config is {}; expected a dict", shown(other)),
        None => &empty,
    };
    let what = "config";
    let group = first_group(optimizer)?;
    let mut defaulted = Vec::new();
    let mut from_group = Vec::new();
    let mut pick =
        |key: &str, ours: Option<f64>, grouped: Option<f64>, default: f64| match (ours, grouped) {
            (Some(x), _) => x,
            (None, Some(x)) => {
                from_group.push(key.to_string());
                x
            }
            (None, None) => {
                defaulted.push(key.to_string());
                default
            }
        };
    let lr = pick(
        "learning_rate",
        real(c, "learning_rate", what)?,
        group.lr,
        base.lr,
    );
    let beta1 = pick(
        "beta1",
        real(c, "beta1", what)?,
        group.betas.map(|b| b.0),
        base.beta1,
    );
    let beta2 = pick(
        "beta2",
        real(c, "beta2", what)?,
        group.betas.map(|b| b.1),
        base.beta2,
    );
    let weight_decay = pick(
        "weight_decay",
        real(c, "weight_decay", what)?,
        group.weight_decay,
        base.weight_decay,
    );
    let steps_max = crate::limits::MAX_STEPS;
    let count_max = crate::limits::MAX_COUNT as u64;
    let train = TrainConfig {
        steps: whole(c, "max_iters", what, steps_max)?.unwrap_or(base.steps),
        batch_size: whole(c, "batch_size", what, count_max)?
            .map_or(base.batch_size, |n| n as usize),
        grad_accum: whole(
            c,
            "gradient_accumulation_steps",
            what,
            crate::limits::MAX_GRAD_ACCUM as u64,
        )?
        .map_or(1, |n| n as usize),
        lr,
        min_lr: real(c, "min_lr", what)?.unwrap_or(lr / 10.0),
        warmup_steps: whole(c, "warmup_iters", what, steps_max)?.unwrap_or(base.warmup_steps),
        weight_decay,
        beta1,
        beta2,
        clip_norm: real(c, "grad_clip", what)?.unwrap_or(base.clip_norm),
        eval_every: whole(c, "eval_interval", what, steps_max)?.unwrap_or(base.eval_every),
        ..base
    };
    train
        .validate()
        .map_err(|e| candle::Error::Msg(format!("the checkpoint's settings: {e}")))?;
    if config.is_none() {
        notes.push("no `config` in the checkpoint: its settings come from the optimizer and the text defaults".into());
    }
    if !from_group.is_empty() {
        notes.push(format!(
            "config has no {}: taken from the optimizer's param_groups",
            from_group.join(", ")
        ));
    }
    if !defaulted.is_empty() {
        notes.push(format!(
            "neither config nor the optimizer gives {}: the text defaults",
            defaulted.join(", ")
        ));
    }
    if c.get("lr_decay_iters").is_some() || c.get("decay_lr").is_some() {
        notes.push("nanoGPT's schedule (warmup to learning_rate, cosine to min_lr at lr_decay_iters) becomes ours: warmup, then cosine to min_lr at the last step".into());
    }
    Ok(train)
}

/// nanoGPT's `config` as JSON, in its order, for the run to hand back; values JSON cannot
/// hold (a tensor, an object, a non-finite float) are left out with a note.
fn config_record(
    config: Option<&PickleValue>,
    notes: &mut Vec<String>,
) -> Vec<(String, serde_json::Value)> {
    let Some(entries) = config.and_then(PickleValue::as_dict) else {
        return Vec::new();
    };
    fn json(v: &PickleValue) -> Option<serde_json::Value> {
        Some(match v {
            PickleValue::None => serde_json::Value::Null,
            PickleValue::Bool(b) => (*b).into(),
            PickleValue::Int(i) => (*i).into(),
            PickleValue::Float(x) => serde_json::Number::from_f64(*x)?.into(),
            PickleValue::Str(s) => s.clone().into(),
            PickleValue::List(v) | PickleValue::Tuple(v) => {
                v.iter().map(json).collect::<Option<Vec<_>>>()?.into()
            }
            _ => return None,
        })
    }
    let mut out = Vec::new();
    let mut left = Vec::new();
    for (k, v) in entries {
        match (k.as_str(), json(v)) {
            (Some(k), Some(v)) => out.push((k.to_string(), v)),
            (Some(k), None) => left.push(k.to_string()),
            (None, _) => left.push(shown(k)),
        }
    }
    if !left.is_empty() {
        notes.push(format!(
            "config's {} cannot be kept for the export (not a number, string, boolean or None)",
            left.join(", ")
        ));
    }
    out
}

/// nanoGPT's optimizer `state_dict()` under our parameter names. Its parameter ids follow
/// `configure_optimizers`: the model's parameters in order (the tied head once, as the
/// token embedding), those of rank ≥ 2 first (decayed), then the rest. Every step count is a
/// whole number, every moment finite and each `exp_avg_sq` ≥ 0.
fn nanogpt_optimizer(opt: &PickleValue, order: &[(String, Vec<usize>)]) -> Result<StateDict> {
    let decay = order.iter().filter(|(_, s)| s.len() >= 2);
    let rest = order.iter().filter(|(_, s)| s.len() < 2);
    let ids: Vec<&(String, Vec<usize>)> = decay.chain(rest).collect();
    let groups = opt
        .get("param_groups")
        .and_then(PickleValue::as_list)
        .ok_or_else(|| candle::Error::Msg("optimizer: no param_groups".into()))?;
    let listed: usize = groups
        .iter()
        .map(|g| {
            g.get("params")
                .and_then(PickleValue::as_list)
                .map_or(0, <[_]>::len)
        })
        .sum();
    if listed != ids.len() {
        candle::bail!(
            "optimizer: its groups list {listed} parameters, the model has {}: not this model's optimizer",
            ids.len()
        )
    }
    let state = opt.get("state");
    let mut tensors = Vec::new();
    for (i, (name, shape)) in ids.iter().enumerate() {
        let ours = our_name(name).ok_or_else(|| {
            candle::Error::Msg(format!("optimizer: {name} is not a GPT-2 parameter"))
        })?;
        let slot = state.and_then(|s| s.get_index(i as i64));
        let step = match slot.and_then(|s| s.get("step")) {
            None => 0.0,
            Some(v) => match v.as_f64() {
                Some(x) if x >= 0.0 && x.fract() == 0.0 && x <= crate::limits::MAX_STEPS as f64 => {
                    x
                }
                _ => candle::bail!(
                    "optimizer: the step count of {name} is {}; expected a whole number of steps",
                    shown(v)
                ),
            },
        };
        // A parameter never stepped has no moments (PyTorch keeps no state for it).
        for key in ["exp_avg", "exp_avg_sq"] {
            match slot
                .and_then(|s| s.get(key))
                .and_then(PickleValue::as_tensor)
            {
                Some(t) if t.dims() == shape.as_slice() => {
                    let t = t.to_dtype(DType::F32)?;
                    check_moment(&t, name, key)?;
                    tensors.push((format!("{key}.{ours}"), t))
                }
                Some(t) => candle::bail!(
                    "optimizer: {key} of {name} has shape {}, the parameter {}",
                    short_shape(t.dims()),
                    short_shape(shape)
                ),
                None if step == 0.0 => {}
                None => {
                    candle::bail!("optimizer: {name} was stepped {step} times but has no {key}")
                }
            }
        }
        tensors.push((format!("step.{ours}"), Tensor::new(step, &Device::Cpu)?));
    }
    Ok(StateDict::from_tensors(tensors))
}

/// Errors unless every value of moment `key` of `name` is finite (and, for `exp_avg_sq`, a
/// square's average, not negative): a NaN there surfaces later as a NaN loss.
fn check_moment(t: &Tensor, name: &str, key: &str) -> Result<()> {
    let values = t.flatten_all()?.to_vec1::<f32>()?;
    if let Some(x) = values.iter().find(|x| !x.is_finite()) {
        candle::bail!("optimizer: {key} of {name} holds {x}; expected finite moments")
    }
    if key == "exp_avg_sq" {
        if let Some(x) = values.iter().find(|x| **x < 0.0) {
            candle::bail!(
                "optimizer: exp_avg_sq of {name} holds {x}; an average of squares is never negative"
            )
        }
    }
    Ok(())
}

/// Reads nanoGPT's `ckpt.pt` (or the `ckpt.pt` of an out directory): `model` (the
/// `_orig_mod.` prefix of `torch.compile` removed), `model_args`, `optimizer`, `iter_num`,
/// `config`, `best_val_loss`; the character vocabulary of `meta` (nanoGPT's `meta.pkl`:
/// `itos`) or `tokenizer` for text.
pub fn read_nanogpt(
    path: &Path,
    meta: Option<&Path>,
    tokenizer: Option<&Path>,
) -> Result<Imported> {
    let ckpt = match path.is_dir() {
        true => path.join("ckpt.pt"),
        false => path.to_path_buf(),
    };
    let v = load_pickle(&ckpt)
        .map_err(|e| candle::Error::Msg(format!("reading {}: {e}", ckpt.display())))?;
    let at = |e: candle::Error| candle::Error::Msg(format!("{}: {e}", ckpt.display()));
    let Some(args) = v.get("model_args") else {
        candle::bail!(
            "{}: no model_args; expected a checkpoint saved by nanoGPT's train.py",
            ckpt.display()
        )
    };
    let config = config_from_nanogpt(&nanogpt_args(args).map_err(at)?).map_err(at)?;
    let Some(model) = v.get("model").and_then(PickleValue::as_dict) else {
        candle::bail!("{}: no model state_dict", ckpt.display())
    };
    let mut tensors = Vec::new();
    for (k, t) in model {
        // `state_dict()`'s `_metadata` (module versions), which candle's pickle machine
        // reads as an entry of the dict.
        if k.as_str() == Some("_metadata") {
            continue;
        }
        let (Some(name), Some(t)) = (k.as_str(), t.as_tensor()) else {
            candle::bail!(
                "{}: model holds {} under {}; expected tensors under parameter names",
                ckpt.display(),
                shown(t),
                shown(k)
            )
        };
        tensors.push((name.to_string(), t.clone()));
    }
    let (weights, report) = from_gpt2(
        &StateDict::from_tensors(tensors),
        Gpt2Format::NanoGpt,
        &config,
    )
    .map_err(at)?;
    let mut notes = Vec::new();
    let optimizer = v
        .get("optimizer")
        .map(|o| nanogpt_optimizer(o, &nanogpt_parameters(&config)))
        .transpose()
        .map_err(at)?;
    let step = whole(&v, "iter_num", "the checkpoint", crate::limits::MAX_STEPS)
        .map_err(at)?
        .unwrap_or(0);
    let train = nanogpt_train(v.get("config"), v.get("optimizer"), &mut notes).map_err(at)?;
    if step > train.steps {
        candle::bail!(
            "{}: iter_num {step} is past max_iters {}; expected a run that has steps left (or is done)",
            ckpt.display(),
            train.steps
        )
    }
    let best_val_loss = match v.get("best_val_loss") {
        None => None,
        Some(b) => match b.as_f64() {
            Some(x) if !x.is_nan() => Some(x),
            _ => candle::bail!(
                "{}: best_val_loss is {}; expected a number",
                ckpt.display(),
                shown(b)
            ),
        },
    };
    let record = ImportedRecord {
        nanogpt_config: config_record(v.get("config"), &mut notes),
        best_val_loss,
    };
    let chars = meta
        .map(|m| TextTokenizer::characters(&crate::data::nanogpt_vocab(m)?))
        .transpose()?;
    let codec = codec_for(tokenizer, chars, config.vocab_size, &mut notes)?;
    Ok(Imported {
        source: format!("{} (nanoGPT, step {step})", ckpt.display()),
        config,
        weights,
        optimizer,
        step,
        train,
        codec,
        report,
        notes,
        record: Some(record),
    })
}
