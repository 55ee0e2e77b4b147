//! GPT-2-family checkpoints people already have, read into an [`Imported`] run and written as
//! an ordinary run directory (`mha import`): a Hugging Face `GPT2LMHeadModel` directory, or
//! nanoGPT's `ckpt.pt` with its optimizer, step and settings (so `mha train --resume`
//! continues nanoGPT's run) and its `meta.pkl` character vocabulary.

use std::path::{Path, PathBuf};

use candle::{DType, Device, Result, Tensor};
use candle_mha::checkpoint::{
    load_into_varmap_owned, load_pickle, LoadOptions, PickleValue, StateDict,
};
use candle_mha::zeroed_var_builder;
use candle_nn::VarMap;

use crate::data::{Codec, TextTokenizer};
use crate::models::gpt2::{self, Gpt2Format, Gpt2Report, NanoGptArgs};
use crate::models::{NextTokenPredictor, NextTokenPredictorConfig};
use crate::staged_dir::StagedDir;
use crate::{TrainConfig, Trainer};

/// A checkpoint read for import: our configuration, weights and (nanoGPT) optimizer state,
/// the step it was at, the training settings it recorded, and its tokenization.
///
/// PyTorch equivalent: what `GPT2LMHeadModel.from_pretrained(dir)` or nanoGPT's
/// `init_from="resume"` rebuilds.
pub struct Imported {
    /// Where it came from, for messages.
    pub source: String,
    /// The model.
    pub config: NextTokenPredictorConfig,
    /// Its weights under our names.
    pub weights: StateDict,
    /// AdamW's moments and step counts under our names ([`candle_mha::optim::AdamW::state_dict`]), when
    /// the checkpoint has an optimizer.
    pub optimizer: Option<StateDict>,
    /// Optimizer steps done (nanoGPT's `iter_num`; 0 for Hugging Face).
    pub step: u64,
    /// The training settings: the checkpoint's where it records them (nanoGPT's `config`),
    /// else [`TrainConfig::for_text`]; decay on the matrices only, as both sources train.
    pub train: TrainConfig,
    /// The tokenization.
    pub codec: Codec,
    /// What the conversion did with each tensor.
    pub report: Gpt2Report,
    /// Lines worth telling the user (a tokenizer made up, a setting not carried over).
    pub notes: Vec<String>,
}

/// The kind of a checkpoint `mha import` reads, by what `path` is: a directory with
/// `config.json` (Hugging Face), else a `torch.save` file or a directory holding `ckpt.pt`
/// (nanoGPT).
pub fn detect(path: &Path) -> Result<Gpt2Format> {
    if path.is_dir() {
        if path.join("config.json").exists() {
            return Ok(Gpt2Format::HuggingFace);
        }
        if path.join("ckpt.pt").exists() {
            return Ok(Gpt2Format::NanoGpt);
        }
        candle::bail!(
            "{}: neither a Hugging Face directory (config.json) nor a nanoGPT out directory (ckpt.pt)",
            path.display()
        )
    }
    Ok(Gpt2Format::NanoGpt)
}

fn json(path: &Path) -> Result<serde_json::Value> {
    let text = candle_mha::io::read_input_string(path, crate::limits::MAX_CONFIG_BYTES)?;
    serde_json::from_str(&text)
        .map_err(|e| candle::Error::Msg(format!("{}: not JSON ({e})", path.display())))
}

/// A plain file name from a checkpoint's index (untrusted: no path may leave the directory).
fn plain_file(dir: &Path, name: &str) -> Result<PathBuf> {
    let plain =
        !name.is_empty() && !name.starts_with('.') && !name.contains(['/', '\\']) && name != "..";
    if !plain {
        candle::bail!(
            "{}: the index names {name:?}, not a file of the directory",
            dir.display()
        )
    }
    Ok(dir.join(name))
}

/// The weights of a Hugging Face directory: `model.safetensors`, the shards its
/// `model.safetensors.index.json` (or `pytorch_model.bin.index.json`) lists, or
/// `pytorch_model.bin`.
fn hugging_face_weights(dir: &Path) -> Result<StateDict> {
    let single = dir.join("model.safetensors");
    if single.exists() {
        return StateDict::load(&single);
    }
    for index in [
        "model.safetensors.index.json",
        "pytorch_model.bin.index.json",
    ] {
        let index = dir.join(index);
        if !index.exists() {
            continue;
        }
        let map = json(&index)?;
        let Some(files) = map.get("weight_map").and_then(|m| m.as_object()) else {
            candle::bail!("{}: no weight_map", index.display())
        };
        let mut shards: Vec<&str> = files.values().filter_map(|v| v.as_str()).collect();
        shards.sort_unstable();
        shards.dedup();
        let mut tensors = Vec::new();
        for shard in shards {
            let sd = StateDict::load(plain_file(dir, shard)?)?;
            tensors.extend(sd.tensors().iter().cloned());
        }
        return Ok(StateDict::from_tensors(tensors));
    }
    let bin = dir.join("pytorch_model.bin");
    if bin.exists() {
        return StateDict::load(&bin);
    }
    candle::bail!(
        "{}: no model.safetensors, model.safetensors.index.json, pytorch_model.bin.index.json or pytorch_model.bin",
        dir.display()
    )
}

/// The tokenizer of a Hugging Face directory: `tokenizer.json`, else the slow tokenizer's
/// `vocab.json` and `merges.txt` (with `added_tokens.json` when present); `None` without
/// either.
fn hugging_face_tokenizer(dir: &Path) -> Result<Option<TextTokenizer>> {
    let own = dir.join("tokenizer.json");
    if own.exists() {
        return Ok(Some(TextTokenizer::load(&own)?));
    }
    let (vocab, merges) = (dir.join("vocab.json"), dir.join("merges.txt"));
    if !(vocab.exists() && merges.exists()) {
        return Ok(None);
    }
    let added_file = dir.join("added_tokens.json");
    let mut added = Vec::new();
    if added_file.exists() {
        let map = json(&added_file)?;
        let Some(map) = map.as_object() else {
            candle::bail!("{}: expected an object of token → id", added_file.display())
        };
        for (token, id) in map {
            let Some(id) = id.as_u64().and_then(|i| u32::try_from(i).ok()) else {
                candle::bail!(
                    "{}: {token:?} has id {id}; expected a whole number",
                    added_file.display()
                )
            };
            added.push((token.clone(), id));
        }
    }
    Ok(Some(TextTokenizer::gpt2_files(&vocab, &merges, &added)?))
}

/// The tokenization of an import: `tokenizer` when given, else `found` (the checkpoint's
/// own), else ids as tokens (with a note); its size must fit the model's vocabulary.
fn codec_for(
    tokenizer: Option<&Path>,
    found: Option<TextTokenizer>,
    vocab_size: usize,
    notes: &mut Vec<String>,
) -> Result<Codec> {
    let tok = match (tokenizer, found) {
        (Some(p), _) => TextTokenizer::load(p)?,
        (None, Some(t)) => t,
        (None, None) => {
            notes.push(format!(
                "no tokenizer: prompts and outputs are token ids (\"17 4 9\", 0 to {}); give a tokenizer.json, or nanoGPT's meta.pkl, for text",
                vocab_size - 1
            ));
            TextTokenizer::ids(vocab_size)?
        }
    };
    if tok.vocab_size() > vocab_size {
        candle::bail!(
            "the tokenizer has {} ids, more than the model's {vocab_size}",
            tok.vocab_size()
        )
    }
    Ok(Codec::Text(Box::new(tok)))
}

/// Reads a Hugging Face `GPT2LMHeadModel` directory: `config.json`, the weights (`Conv1D`
/// transposed, buffers skipped), `tokenizer.json` when present (or `tokenizer`).
pub fn read_hugging_face(dir: &Path, tokenizer: Option<&Path>) -> Result<Imported> {
    let config = gpt2::config_from_hf(&json(&dir.join("config.json"))?)?;
    let sd = hugging_face_weights(dir)?;
    let (weights, report) = gpt2::from_gpt2(&sd, Gpt2Format::HuggingFace, &config)?;
    let mut notes = Vec::new();
    let found = hugging_face_tokenizer(dir)?;
    let codec = codec_for(tokenizer, found, config.vocab_size, &mut notes)?;
    Ok(Imported {
        source: format!("{} (Hugging Face GPT-2)", dir.display()),
        train: TrainConfig {
            decay_matrices_only: true,
            ..TrainConfig::for_text()
        },
        config,
        weights,
        optimizer: None,
        step: 0,
        codec,
        report,
        notes,
    })
}

fn count(v: &PickleValue, key: &str, what: &str) -> Result<usize> {
    v.get(key)
        .and_then(PickleValue::as_i64)
        .filter(|n| *n >= 0)
        .map(|n| n as usize)
        .ok_or_else(|| candle::Error::Msg(format!("{what}: {key} is missing or not a count")))
}

/// nanoGPT's `model_args`.
fn nanogpt_args(v: &PickleValue) -> Result<NanoGptArgs> {
    let what = "model_args";
    Ok(NanoGptArgs {
        n_layer: count(v, "n_layer", what)?,
        n_head: count(v, "n_head", what)?,
        n_embd: count(v, "n_embd", what)?,
        block_size: count(v, "block_size", what)?,
        vocab_size: count(v, "vocab_size", what)?,
        bias: v.get("bias").and_then(PickleValue::as_bool).unwrap_or(true),
        dropout: v
            .get("dropout")
            .and_then(PickleValue::as_f64)
            .unwrap_or(0.0),
    })
}

/// The training settings of nanoGPT's `config` (its `train.py` globals), with defaults for
/// those it lacks.
fn nanogpt_train(config: Option<&PickleValue>, notes: &mut Vec<String>) -> TrainConfig {
    let base = TrainConfig {
        decay_matrices_only: true,
        ..TrainConfig::for_text()
    };
    let Some(c) = config else {
        notes.push("no `config` in the checkpoint: the text defaults train it".into());
        return base;
    };
    let f = |k: &str, d: f64| c.get(k).and_then(PickleValue::as_f64).unwrap_or(d);
    let n = |k: &str, d: u64| {
        c.get(k)
            .and_then(PickleValue::as_i64)
            .map(|x| x.max(0) as u64)
            .unwrap_or(d)
    };
    if c.get("lr_decay_iters").is_some() || c.get("decay_lr").is_some() {
        notes.push("nanoGPT's schedule (warmup to learning_rate, cosine to min_lr at lr_decay_iters) becomes ours: warmup, then cosine to min_lr at the last step".into());
    }
    TrainConfig {
        steps: n("max_iters", base.steps),
        batch_size: n("batch_size", base.batch_size as u64).max(1) as usize,
        grad_accum: n("gradient_accumulation_steps", 1).max(1) as usize,
        lr: f("learning_rate", base.lr),
        min_lr: f("min_lr", f("learning_rate", base.lr) / 10.0),
        warmup_steps: n("warmup_iters", base.warmup_steps),
        weight_decay: f("weight_decay", base.weight_decay),
        beta1: f("beta1", base.beta1),
        beta2: f("beta2", base.beta2),
        clip_norm: f("grad_clip", base.clip_norm),
        eval_every: n("eval_interval", base.eval_every),
        ..base
    }
}

/// nanoGPT's optimizer `state_dict()` under our parameter names. Its parameter ids follow
/// `configure_optimizers`: the model's parameters in order (the tied head once, as the
/// token embedding), those of rank ≥ 2 first (decayed), then the rest.
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
        let ours = gpt2::our_name(name).ok_or_else(|| {
            candle::Error::Msg(format!("optimizer: {name} is not a GPT-2 parameter"))
        })?;
        let slot = state.and_then(|s| s.get_index(i as i64));
        let step = slot
            .and_then(|s| s.get("step"))
            .and_then(PickleValue::as_f64)
            .unwrap_or(0.0);
        // A parameter never stepped has no moments (PyTorch keeps no state for it).
        for key in ["exp_avg", "exp_avg_sq"] {
            match slot
                .and_then(|s| s.get(key))
                .and_then(PickleValue::as_tensor)
            {
                Some(t) if t.dims() == shape.as_slice() => {
                    tensors.push((format!("{key}.{ours}"), t.to_dtype(DType::F32)?))
                }
                Some(t) => candle::bail!(
                    "optimizer: {key} of {name} has shape {:?}, the parameter {shape:?}",
                    t.dims()
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

/// Reads nanoGPT's `ckpt.pt` (or the `ckpt.pt` of an out directory): `model` (the
/// `_orig_mod.` prefix of `torch.compile` removed), `model_args`, `optimizer`, `iter_num`,
/// `config`; the character vocabulary of `meta` (nanoGPT's `meta.pkl`: `itos`) or
/// `tokenizer` for text.
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
    let Some(args) = v.get("model_args") else {
        candle::bail!(
            "{}: no model_args; expected a checkpoint saved by nanoGPT's train.py",
            ckpt.display()
        )
    };
    let config = gpt2::config_from_nanogpt(&nanogpt_args(args)?)?;
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
                "{}: model holds an entry that is not a named tensor",
                ckpt.display()
            )
        };
        tensors.push((name.to_string(), t.clone()));
    }
    let (weights, report) = gpt2::from_gpt2(
        &StateDict::from_tensors(tensors),
        Gpt2Format::NanoGpt,
        &config,
    )?;
    let mut notes = Vec::new();
    let optimizer = v
        .get("optimizer")
        .map(|o| nanogpt_optimizer(o, &gpt2::nanogpt_parameters(&config)))
        .transpose()?;
    let step = v
        .get("iter_num")
        .and_then(PickleValue::as_i64)
        .unwrap_or(0)
        .max(0) as u64;
    let train = nanogpt_train(v.get("config"), &mut notes);
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
    })
}

impl Imported {
    /// Writes it into `dir` as a run directory of `mha train` (`model.safetensors`,
    /// `config.json`, the tokenizer, `optimizer.safetensors`, `trainer_state.json`), as one
    /// unit ([`StagedDir`]: `dir` must be new or empty; a failure leaves nothing). Each weight
    /// is let go once the model holds it (about the model's size in memory, not twice).
    pub fn write_run(self, dir: &Path) -> Result<()> {
        let staged = StagedDir::new(dir, "mha import")?;
        // The model is built only as large as the weights read: a configuration promising more
        // (a crafted one) is refused before anything is allocated.
        let held: u128 = self
            .weights
            .tensors()
            .iter()
            .map(|(_, t)| t.elem_count() as u128)
            .sum();
        if held != self.config.parameter_count() {
            candle::bail!(
                "{}: the configuration describes {} parameters, the weights hold {held}: they are not one model",
                self.source,
                self.config.parameter_count()
            )
        }
        let varmap = VarMap::new();
        // Zeros that take no memory until the weights are copied in: no initialisation drawn.
        let vb = zeroed_var_builder(&varmap, DType::F32, &Device::Cpu);
        let model = NextTokenPredictor::new(self.config.clone(), vb)?;
        let opts = LoadOptions::new()
            .with_module("NextTokenPredictor")
            .with_source(&self.source);
        load_into_varmap_owned(&varmap, self.weights, &opts)?;
        let trainer = Trainer::from_imported(
            model,
            varmap,
            self.train,
            self.optimizer.as_ref(),
            self.step,
        )?
        .with_codec(self.codec);
        trainer.save(staged.path())?;
        staged.finish()
    }
}
