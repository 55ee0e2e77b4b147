//! Opening a checkpoint directory written by `mha train`.

use std::path::Path;

use anyhow::{Context, Result};
use candle_mha::candle::{DType, Device};
use candle_mha::checkpoint::{load_into_varmap, LoadOptions, StateDict};
use candle_mha::seeded_var_builder;
use candle_mha_train::data::Codec;
use candle_mha_train::models::{NextTokenPredictor, NextTokenPredictorConfig};
use candle_mha_train::{CONFIG_FILE, MODEL_FILE};
use candle_nn::VarMap;

/// A trained model and its tokenization.
pub struct Checkpoint {
    pub model: NextTokenPredictor,
    pub codec: Codec,
}

/// Loads `config.json`, `model.safetensors` (strictly: a config that does not match the
/// weights is an error with the load report) and the vocabulary or tokenizer, after checking
/// them against the checkpoint's `checkpoint.json`.
pub fn open(dir: &Path, dtype: DType, device: &Device) -> Result<Checkpoint> {
    // The files below must be one checkpoint, not parts of two saves.
    candle_mha_train::io::verify_file_set(dir)?;
    let cfg = NextTokenPredictorConfig::load(dir.join(CONFIG_FILE))?;
    let codec = Codec::load_dir(dir)?;
    if codec.vocab_size() > cfg.vocab_size {
        anyhow::bail!(
            "{}: the tokenization has {} ids but config.json says vocab_size {}",
            dir.display(),
            codec.vocab_size(),
            cfg.vocab_size
        )
    }
    let varmap = VarMap::new();
    let model = NextTokenPredictor::new(cfg, seeded_var_builder(&varmap, 0, dtype, device))?;
    let path = dir.join(MODEL_FILE);
    let weights = StateDict::load(&path)?;
    let opts = LoadOptions::new()
        .with_module("NextTokenPredictor")
        .with_source(&path.display().to_string());
    load_into_varmap(&varmap, &weights, &opts)
        .with_context(|| format!("loading {}", dir.display()))?;
    Ok(Checkpoint { model, codec })
}
