//! The checkpoint formats a run comes from and goes back to, one module each, holding its
//! read and its write: [`hf_gpt2`] (Hugging Face `GPT2LMHeadModel`), [`nanogpt`] (nanoGPT's
//! `ckpt.pt` with its optimizer, step and settings, and its `meta.pkl`), [`hf_llama`] (Hugging
//! Face `LlamaForCausalLM`, `Qwen2ForCausalLM`, `MistralForCausalLM`), [`peft`] (PEFT's LoRA
//! adapter directory). GPT-2's and nanoGPT's
//! names for our blocks are [`gpt2_names`]'s; `hf_dir` reads what every Hugging Face
//! directory shares.
//!
//! Reading gives an [`Imported`] run, written as an ordinary run directory (`mha import`);
//! [`export_hugging_face`] and [`export_nanogpt`] write a run back (`mha export`).

use std::path::Path;

use candle::{DType, Device, Result};
use candle_mha::checkpoint::{load_into_varmap_owned, LoadOptions, StateDict};
use candle_mha::zeroed_var_builder;
use candle_nn::VarMap;

use crate::data::{Codec, TextTokenizer};
use crate::models::{NextTokenPredictor, NextTokenPredictorConfig};
use crate::run::staged_dir::StagedDir;
use crate::{ImportedRecord, TrainConfig, Trainer, Unverified};
use gpt2_names::{Gpt2Format, Gpt2Report};
use hf_dir::json;

pub mod gpt2_names;
pub(crate) mod hf_dir;
pub mod hf_gpt2;
pub mod hf_llama;
pub mod nanogpt;
pub mod peft;

pub use hf_gpt2::read_hugging_face;
pub use hf_llama::{read_hf_dir, read_llama, write_hf_dir, HfWeights};
pub use nanogpt::{export_nanogpt, read_nanogpt};
pub use peft::{export_peft, import_peft};

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
pub(crate) fn hugging_face_tokenizer(dir: &Path) -> Result<Option<TextTokenizer>> {
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
pub(crate) fn codec_for(
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

/// Writes the model of the run (or checkpoint) directory `run` into `out` (new or empty;
/// written as a unit) as a Hugging Face directory: a GPT-2 run as a `GPT2LMHeadModel`
/// (`hf_gpt2::write_export`), a Llama-family run as its own class
/// (`hf_llama::write_export`). Returns the transformers class written.
///
/// PyTorch equivalent: `model.save_pretrained(out)`.
pub fn export_hugging_face(run: &Path, out: &Path, unverified: Unverified) -> Result<&'static str> {
    let staged = StagedDir::new(out, "mha export")?;
    let ckpt = crate::Checkpoint::open(run, unverified)?;
    let class = match (ckpt.config.llama_config()?, &ckpt.config.llama) {
        (Some(llama), Some(record)) => {
            hf_llama::write_export(&ckpt, &llama, record, staged.path())?;
            llama.family.architecture()
        }
        _ => {
            hf_gpt2::write_export(&ckpt, staged.path())?;
            "GPT2LMHeadModel"
        }
    };
    staged.finish()?;
    Ok(class)
}

impl Imported {
    /// A Hugging Face model read for import: no optimizer, step 0, the text defaults with
    /// decay on the matrices only (as transformers' examples group AdamW).
    pub(crate) fn hugging_face(
        source: String,
        config: NextTokenPredictorConfig,
        weights: StateDict,
        codec: Codec,
        report: Gpt2Report,
        notes: Vec<String>,
    ) -> Self {
        Self {
            source,
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
        }
    }

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
            if !crate::run::trainer::all_finite(t)? {
                candle::bail!(
                    "{}: {} holds NaN or infinite values; expected finite weights",
                    self.source,
                    gpt2_names::gpt2_name(name).unwrap_or_else(|| name.clone())
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
