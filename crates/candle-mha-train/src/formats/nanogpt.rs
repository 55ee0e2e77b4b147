//! nanoGPT's `ckpt.pt`, read for import (what it says is used, or refused by name, never
//! replaced by a default behind the user's back) and written back ([`export_nanogpt`]: its
//! model, optimizer, step and settings, which nanoGPT's `train.py` resumes).

use std::path::Path;

use candle::{DType, Device, Result, Tensor};
use candle_mha::checkpoint::{load_pickle, save_torch, PickleValue, StateDict};

use super::gpt2_names::{from_gpt2, nanogpt_parameters, our_name, to_gpt2, Gpt2Format};
use super::{codec_for, Imported};
use crate::data::TextTokenizer;
use crate::models::{Gelu, NextTokenPredictorConfig};
use crate::run_dir::{CONFIG_FILE, OPTIMIZER_FILE, STATE_FILE};
use crate::staged_dir::StagedDir;
use crate::{verify_checkpoint, ImportedRecord, TrainConfig, TrainerState, Unverified};
use candle_mha::io::short_shape;

/// A value as a message shows it: `-5`, `400.5`, `"400"`, `None`, "a list of 3 items".
pub(crate) fn shown(v: &PickleValue) -> String {
    match v {
        PickleValue::None => "None".into(),
        PickleValue::Bool(b) => if *b { "True" } else { "False" }.into(),
        PickleValue::Int(i) => i.to_string(),
        // 400.0 as Python shows it, not as 400.
        PickleValue::Float(x) => format!("{x:?}"),
        PickleValue::Str(s) => candle_mha::io::quoted(s, 40),
        PickleValue::List(v) => format!("a list of {} items", v.len()),
        PickleValue::Tuple(v) => format!("a tuple of {} items", v.len()),
        PickleValue::Dict(v) => format!("a dict of {} entries", v.len()),
        PickleValue::Tensor(t) => format!("a tensor of shape {}", short_shape(t.dims())),
        PickleValue::Other(s) => s.clone(),
    }
}

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

/// Our configuration of nanoGPT's `model_args` (`n_layer`, `n_head`, `n_embd`,
/// `block_size`, `bias`, `vocab_size`, `dropout`): exact GELU, tied head, the one dropout
/// everywhere, MLP `4 n_embd`.
///
/// PyTorch equivalent: `GPTConfig(**checkpoint["model_args"])`.
pub fn config_from_nanogpt(args: &NanoGptArgs) -> Result<NextTokenPredictorConfig> {
    let cfg = NextTokenPredictorConfig {
        vocab_size: args.vocab_size,
        max_len: args.block_size,
        embed_dim: args.n_embd,
        num_heads: args.n_head,
        num_layers: args.n_layer,
        ff_dim: 4 * args.n_embd,
        dropout: args.dropout,
        resid_dropout: args.dropout,
        embed_dropout: Some(args.dropout),
        bias: args.bias,
        tie_embeddings: true,
        head_bias: None,
        gelu: Gelu::Exact,
        layer_norm_eps: 1e-5,
        llama: None,
    };
    cfg.validate()?;
    Ok(cfg)
}

/// nanoGPT's `model_args` (`GPTConfig`'s fields).
#[derive(Clone, Debug, PartialEq)]
pub struct NanoGptArgs {
    /// Transformer blocks.
    pub n_layer: usize,
    /// Attention heads.
    pub n_head: usize,
    /// Width.
    pub n_embd: usize,
    /// Context.
    pub block_size: usize,
    /// Biases in the Linears and LayerNorms.
    pub bias: bool,
    /// Token ids.
    pub vocab_size: usize,
    /// The one dropout rate.
    pub dropout: f64,
}

impl NanoGptArgs {
    /// The `model_args` of `cfg`, when it is one nanoGPT can express (tied head, exact GELU,
    /// MLP `4 E`, eps 1e-5, one dropout); else an error naming what differs.
    pub fn from_config(cfg: &NextTokenPredictorConfig) -> Result<Self> {
        let mut differ = Vec::new();
        if !cfg.tie_embeddings {
            differ.push("an untied head".to_string());
        }
        if cfg.gelu != Gelu::Exact {
            differ.push("the tanh GELU".to_string());
        }
        if cfg.ff_dim != 4 * cfg.embed_dim {
            differ.push(format!("ff_dim {} (nanoGPT: 4 × n_embd)", cfg.ff_dim));
        }
        if cfg.layer_norm_eps != 1e-5 {
            differ.push(format!("layer_norm_eps {}", cfg.layer_norm_eps));
        }
        let pe = cfg.embed_dropout.unwrap_or(cfg.resid_dropout);
        if cfg.dropout != cfg.resid_dropout || pe != cfg.dropout {
            differ.push("three different dropouts (nanoGPT has one)".to_string());
        }
        if !differ.is_empty() {
            candle::bail!(
                "this model is not one nanoGPT's GPT can hold: {}",
                differ.join(", ")
            )
        }
        Ok(Self {
            n_layer: cfg.num_layers,
            n_head: cfg.num_heads,
            n_embd: cfg.embed_dim,
            block_size: cfg.max_len,
            bias: cfg.bias,
            vocab_size: cfg.vocab_size,
            dropout: cfg.dropout,
        })
    }
}

fn s(v: &str) -> PickleValue {
    PickleValue::Str(v.to_string())
}

fn f(v: f64) -> PickleValue {
    PickleValue::Float(v)
}

fn n(v: u64) -> PickleValue {
    PickleValue::Int(v as i64)
}

/// A JSON value of [`ImportedRecord`](crate::ImportedRecord) as the pickle it came from.
fn from_json(v: &serde_json::Value) -> PickleValue {
    match v {
        serde_json::Value::Null => PickleValue::None,
        serde_json::Value::Bool(b) => PickleValue::Bool(*b),
        serde_json::Value::Number(x) => match x.as_i64() {
            Some(i) => PickleValue::Int(i),
            None => f(x.as_f64().unwrap_or(f64::NAN)),
        },
        serde_json::Value::String(t) => s(t),
        serde_json::Value::Array(items) => PickleValue::List(items.iter().map(from_json).collect()),
        serde_json::Value::Object(_) => PickleValue::None,
    }
}

/// Writes the run (or checkpoint) directory `run` as nanoGPT's `out/ckpt.pt`: `model`
/// (nanoGPT's names, `lm_head.weight` the tied embedding), `model_args`, `optimizer` (AdamW's
/// `state_dict()` in nanoGPT's two groups: the ≥ 2-D tensors, then the rest), `iter_num`,
/// `best_val_loss` and `config`, so that `GPT(GPTConfig(**ckpt["model_args"]))` loads the
/// weights strictly and nanoGPT's `train.py` resumes it (`init_from="resume"`). Errors, before
/// anything is written, for a model nanoGPT cannot hold ([`NanoGptArgs::from_config`]).
///
/// PyTorch equivalent: nanoGPT's `torch.save(checkpoint, os.path.join(out_dir, "ckpt.pt"))`.
pub fn export_nanogpt(run: &Path, out: &Path, unverified: Unverified) -> Result<()> {
    let staged = StagedDir::new(out, "mha export")?;
    let mut files = crate::state::model_files(run)?;
    files.extend([OPTIMIZER_FILE, STATE_FILE]);
    verify_checkpoint(run, &files, unverified)?;
    let cfg = NextTokenPredictorConfig::load(run.join(CONFIG_FILE))?;
    let args = NanoGptArgs::from_config(&cfg)
        .map_err(|e| candle::Error::Msg(format!("{}: {e}", run.display())))?;
    let ours = crate::lora_run::model_weights(run, &cfg)?;
    // A LoRA run's moments are its adapter's: the merged model goes without any.
    let lora = crate::lora_run::LoraRecord::load(run, &cfg)?.is_some();
    let theirs = to_gpt2(&ours, Gpt2Format::NanoGpt, &cfg)?;
    let state = TrainerState::load(run)?;
    let opt = StateDict::load(run.join(OPTIMIZER_FILE))?;
    let tc = &state.config;
    let meta = |k: &str, d: f64| {
        opt.metadata()
            .get(k)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(d)
    };
    // Parameter ids as nanoGPT's configure_optimizers numbers them.
    let order = nanogpt_parameters(&cfg);
    let (decay, rest): (Vec<_>, Vec<_>) = order.iter().partition(|(_, shape)| shape.len() >= 2);
    let mut moments = Vec::new();
    for (id, (name, _)) in decay.iter().chain(&rest).enumerate() {
        let ours = our_name(name)
            .ok_or_else(|| candle::Error::Msg(format!("{name}: no parameter of ours")))?;
        let get = |key: &str| {
            opt.get(&format!("{key}.{ours}")).cloned().ok_or_else(|| {
                candle::Error::Msg(format!(
                    "{}: no {key}.{ours}",
                    run.join(OPTIMIZER_FILE).display()
                ))
            })
        };
        let step = match lora {
            true => 0.0,
            false => get("step")?.to_dtype(DType::F64)?.to_scalar::<f64>()?,
        };
        if step == 0.0 {
            continue; // PyTorch keeps no state for a parameter never stepped
        }
        moments.push((
            n(id as u64),
            PickleValue::Dict(vec![
                (
                    s("step"),
                    PickleValue::Tensor(Tensor::new(step as f32, &Device::Cpu)?),
                ),
                (
                    s("exp_avg"),
                    PickleValue::Tensor(get("exp_avg")?.to_dtype(DType::F32)?),
                ),
                (
                    s("exp_avg_sq"),
                    PickleValue::Tensor(get("exp_avg_sq")?.to_dtype(DType::F32)?),
                ),
            ]),
        ));
    }
    let wd = meta("weight_decay", tc.weight_decay);
    let group = |ids: std::ops::Range<usize>, weight_decay: f64| {
        PickleValue::Dict(vec![
            (s("lr"), f(meta("lr", tc.lr))),
            (
                s("betas"),
                PickleValue::Tuple(vec![f(meta("beta1", tc.beta1)), f(meta("beta2", tc.beta2))]),
            ),
            (s("eps"), f(meta("eps", 1e-8))),
            (s("weight_decay"), f(weight_decay)),
            (s("amsgrad"), PickleValue::Bool(false)),
            (s("foreach"), PickleValue::None),
            (s("maximize"), PickleValue::Bool(false)),
            (s("capturable"), PickleValue::Bool(false)),
            (s("differentiable"), PickleValue::Bool(false)),
            (s("fused"), PickleValue::None),
            (
                s("params"),
                PickleValue::List(ids.map(|i| n(i as u64)).collect()),
            ),
        ])
    };
    let rest_decay = if tc.decay_matrices_only { 0.0 } else { wd };
    let optimizer = PickleValue::Dict(vec![
        (s("state"), PickleValue::Dict(moments)),
        (
            s("param_groups"),
            PickleValue::List(vec![
                group(0..decay.len(), wd),
                group(decay.len()..order.len(), rest_decay),
            ]),
        ),
    ]);
    let model = PickleValue::Dict(
        theirs
            .tensors()
            .iter()
            .map(|(k, t)| (s(k), PickleValue::Tensor(t.clone())))
            .collect(),
    );
    let model_args = PickleValue::Dict(vec![
        (s("n_layer"), n(args.n_layer as u64)),
        (s("n_head"), n(args.n_head as u64)),
        (s("n_embd"), n(args.n_embd as u64)),
        (s("block_size"), n(args.block_size as u64)),
        (s("bias"), PickleValue::Bool(args.bias)),
        (s("vocab_size"), n(args.vocab_size as u64)),
        (s("dropout"), f(args.dropout)),
    ]);
    let ours = [
        ("learning_rate", f(tc.lr)),
        ("min_lr", f(tc.min_lr)),
        ("warmup_iters", n(tc.warmup_steps)),
        ("lr_decay_iters", n(tc.steps)),
        ("max_iters", n(tc.steps)),
        ("weight_decay", f(tc.weight_decay)),
        ("beta1", f(tc.beta1)),
        ("beta2", f(tc.beta2)),
        ("grad_clip", f(tc.clip_norm)),
        ("batch_size", n(tc.batch_size as u64)),
        ("gradient_accumulation_steps", n(tc.grad_accum as u64)),
        ("block_size", n(args.block_size as u64)),
        ("eval_interval", n(tc.eval_every)),
        ("dropout", f(args.dropout)),
        ("bias", PickleValue::Bool(args.bias)),
    ];
    // The imported checkpoint's config, every key in its order (its `dataset` tells nanoGPT's
    // sample.py where meta.pkl is), with the settings this run trains with in place.
    let imported = state.imported.as_ref();
    let mut config: Vec<(String, PickleValue)> = imported
        .map(|r| {
            r.nanogpt_config
                .iter()
                .map(|(k, v)| (k.clone(), from_json(v)))
                .collect()
        })
        .unwrap_or_default();
    for (key, value) in ours {
        match config.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => config.push((key.to_string(), value)),
        }
    }
    let config = PickleValue::Dict(config.into_iter().map(|(k, v)| (s(&k), v)).collect());
    // The lowest loss either run saw (nanoGPT's initial 1e9 when neither evaluated).
    let best = [
        state.best.as_ref().map(|b| b.eval.loss),
        imported.and_then(|r| r.best_val_loss),
    ]
    .into_iter()
    .flatten()
    .fold(1e9, f64::min);
    let checkpoint = PickleValue::Dict(vec![
        (s("model"), model),
        (s("optimizer"), optimizer),
        (s("model_args"), model_args),
        (s("iter_num"), n(state.step)),
        (s("best_val_loss"), f(best)),
        (s("config"), config),
    ]);
    save_torch(&staged.path().join("ckpt.pt"), &checkpoint)?;
    staged.finish()
}
