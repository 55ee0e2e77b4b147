//! GPT-2-family checkpoints people already have, read into an [`Imported`] run and written as
//! an ordinary run directory (`mha import`): a Hugging Face `GPT2LMHeadModel` directory, or
//! nanoGPT's `ckpt.pt` with its optimizer, step and settings (so `mha train --resume`
//! continues nanoGPT's run) and its `meta.pkl` character vocabulary.

use std::path::Path;

use candle::{DType, Device, Result};
use candle_mha::checkpoint::{load_into_varmap_owned, LoadOptions, StateDict};
use candle_mha::zeroed_var_builder;
use candle_nn::VarMap;

use crate::data::{Codec, TextTokenizer};
use crate::models::gpt2::{self, Gpt2Format, Gpt2Report};
use crate::models::hf_dir::{hugging_face_weights, json};
use crate::models::llama::read_hf_dir;
use crate::models::{LlamaRecord, NextTokenPredictor, NextTokenPredictorConfig};
use crate::staged_dir::StagedDir;
use crate::{ImportedRecord, TrainConfig, Trainer};

mod nanogpt;
pub use nanogpt::read_nanogpt;

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
    /// What the checkpoint recorded beyond the run's own settings (nanoGPT's `config` and
    /// `best_val_loss`), kept in the run for its export.
    pub record: Option<ImportedRecord>,
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
                    "{}: {} has id {id}; expected a whole number",
                    added_file.display(),
                    candle_mha::io::quoted(token, 40)
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
    let config_json = json(&dir.join("config.json"))?;
    let model_type = config_json.get("model_type").and_then(|v| v.as_str());
    if matches!(model_type, Some("llama" | "qwen2" | "mistral")) {
        return read_llama(dir, tokenizer);
    }
    let config = gpt2::config_from_hf(&config_json)?;
    let sd = hugging_face_weights(dir)?;
    let (weights, report) = gpt2::from_gpt2(&sd, Gpt2Format::HuggingFace, &config)
        .map_err(|e| candle::Error::Msg(format!("{}: {e}", dir.display())))?;
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
        record: None,
    })
}

/// Reads a Hugging Face `LlamaForCausalLM` / `Qwen2ForCausalLM` / `MistralForCausalLM`
/// directory ([`read_hf_dir`]: what the model cannot honour is refused by name) with its
/// `tokenizer.json` (or `tokenizer`); the weights keep Hugging Face's names, and what the export
/// writes back (the source's `config.json`, `generation_config.json`, each weight's dtype) is
/// kept in the run's `config.json`.
pub fn read_llama(dir: &Path, tokenizer: Option<&Path>) -> Result<Imported> {
    let hf = read_hf_dir(dir)?;
    let dtypes = hf
        .dtypes
        .iter()
        .map(|(n, d)| (n.clone(), dtype_name(*d).to_string()))
        .collect();
    let record = LlamaRecord {
        hf_config: hf.config_json,
        generation_config: hf.generation_config,
        dtypes,
    };
    let config = NextTokenPredictorConfig::from_llama(&hf.config, Some(record))?;
    let mut notes = Vec::new();
    let found = hugging_face_tokenizer(dir)?;
    let codec = codec_for(tokenizer, found, config.vocab_size, &mut notes)?;
    let report = Gpt2Report {
        mapped: hf
            .weights
            .tensors()
            .iter()
            .map(|(n, _)| n.clone())
            .collect(),
        ..Gpt2Report::default()
    };
    Ok(Imported {
        source: format!(
            "{} (Hugging Face {})",
            dir.display(),
            hf.config.family.architecture()
        ),
        train: TrainConfig {
            decay_matrices_only: true,
            ..TrainConfig::for_text()
        },
        config,
        weights: hf.weights,
        optimizer: None,
        step: 0,
        codec,
        report,
        notes,
        record: None,
    })
}

/// `"f32"`, `"f16"`, `"bf16"` (what a Llama record stores).
pub(crate) fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        _ => "f32",
    }
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
        // Caught here, by name: a NaN weight would be trained on and saved by every step.
        for (name, t) in self.weights.tensors() {
            if !crate::trainer::all_finite(t)? {
                candle::bail!(
                    "{}: {} holds NaN or infinite values; expected finite weights",
                    self.source,
                    gpt2::gpt2_name(name).unwrap_or_else(|| name.clone())
                )
            }
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
            self.record,
        )?
        .with_codec(self.codec);
        trainer.save(staged.path())?;
        staged.finish()
    }
}
