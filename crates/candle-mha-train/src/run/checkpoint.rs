//! [`Checkpoint`]: a checkpoint directory opened once, the same way for every reader (the
//! command line's `eval`, `generate`, `inspect`, `export`, a new run's `--init-from`, the
//! imports onto a base run).

use std::path::{Path, PathBuf};

use candle::{DType, Device, Result};
use candle_mha::checkpoint::{load_into_varmap_owned, CheckpointError, LoadOptions, StateDict};
use candle_nn::VarMap;

use super::lora::{merged_weights, LoraRecord};
use super::state::{verify_model_files, Unverified};
use crate::data::Codec;
use crate::models::{NextTokenPredictor, NextTokenPredictorConfig};
use crate::run_dir::{CONFIG_FILE, MODEL_FILE};

/// A checkpoint directory (a run, its `best/`, an import) whose files were checked to be one
/// save (against `checkpoint.json`, unless [`Unverified::Allow`]), with its configuration,
/// tokenization and, for a LoRA run, its record; the weights are read on demand.
///
/// What its files say is checked before anything is built: `config.json`'s sizes, a weights
/// file large enough for the parameters `config.json` describes, a tokenization no larger than
/// the vocabulary.
///
/// PyTorch equivalent: `AutoModelForCausalLM.from_pretrained(dir)` with its tokenizer.
pub struct Checkpoint {
    /// The directory.
    pub dir: PathBuf,
    /// Its `config.json`.
    pub config: NextTokenPredictorConfig,
    /// Its vocabulary or tokenizer.
    pub codec: Codec,
    /// A LoRA run's `lora.json` (its adapter on a base run); `None` for any other checkpoint.
    pub lora: Option<LoraRecord>,
    /// The file that holds the model's weights: `model.safetensors`, or a LoRA run's base's.
    pub weights_file: PathBuf,
    /// That file's size in bytes.
    pub weights_bytes: u64,
}

impl Checkpoint {
    /// Opens the checkpoint directory `dir`. Errors: no `config.json` (not a checkpoint
    /// directory), files that are not one save, a `config.json` out of bounds or larger than
    /// its weights, a tokenization beyond the vocabulary, a LoRA run whose base is gone.
    pub fn open(dir: &Path, unverified: Unverified) -> Result<Self> {
        let config_path = dir.join(CONFIG_FILE);
        if std::fs::symlink_metadata(&config_path).is_err() {
            return Err(CheckpointError::Unreadable {
                path: config_path,
                reason: "no such file; expected a checkpoint directory written by `mha train`"
                    .into(),
            }
            .into_candle());
        }
        // The files below must be one checkpoint, not parts of two saves.
        verify_model_files(dir, unverified)?;
        let config = NextTokenPredictorConfig::load(&config_path)?;
        let lora = LoraRecord::load(dir, &config)?;
        let weights_file = match &lora {
            Some(record) => record.base.dir.join(MODEL_FILE),
            None => dir.join(MODEL_FILE),
        };
        let weights_bytes = std::fs::metadata(&weights_file)
            .map_err(|e| CheckpointError::Unreadable {
                path: weights_file.clone(),
                reason: e.to_string(),
            })
            .map_err(CheckpointError::into_candle)?
            .len();
        // Every parameter takes at least 2 bytes in the file (bf16/f16; the trainer writes f32).
        let params = config.parameter_count();
        if u128::from(weights_bytes) < params * 2 {
            candle::bail!(
                "{}: config.json describes a model of {params} parameters, but {} has only {weights_bytes} bytes: they are not one checkpoint",
                dir.display(),
                weights_file.display()
            )
        }
        let codec = Codec::load_dir(dir)?;
        if codec.vocab_size() > config.vocab_size {
            candle::bail!(
                "{}: the tokenization has {} ids but config.json says vocab_size {}",
                dir.display(),
                codec.vocab_size(),
                config.vocab_size
            )
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            config,
            codec,
            lora,
            weights_file,
            weights_bytes,
        })
    }

    /// The model's weights under our names (a LoRA run's merged into its base's, the base
    /// checked by its hash).
    pub fn weights(&self) -> Result<StateDict> {
        merged_weights(&self.dir, &self.config, self.lora.as_ref())
    }

    /// The model in `dtype` on `device`, loaded strictly (a `config.json` that does not match
    /// the weights is a [`CheckpointError::Mismatch`]). Each weight is let go once copied: the
    /// model is held once, not twice, while it loads.
    pub fn model(&self, dtype: DType, device: &Device) -> Result<NextTokenPredictor> {
        let varmap = VarMap::new();
        let vb = candle_mha::zeroed_var_builder(&varmap, dtype, device);
        let model = NextTokenPredictor::new(self.config.clone(), vb)?;
        let opts = LoadOptions::new()
            .with_module("NextTokenPredictor")
            .with_source(&self.weights_file.display().to_string());
        load_into_varmap_owned(&varmap, self.weights()?, &opts)?;
        Ok(model)
    }
}
