//! A run handed back to PyTorch users: a Hugging Face `GPT2LMHeadModel` directory
//! (`mha export`), which `GPT2LMHeadModel.from_pretrained(dir)` loads with no missing or
//! unexpected key.

use std::path::Path;

use candle::Result;
use candle_mha::checkpoint::StateDict;

use crate::data::Codec;
use crate::models::gpt2::{self, Gpt2Format};
use crate::models::NextTokenPredictorConfig;
use crate::{verify_checkpoint, CONFIG_FILE, MODEL_FILE};

/// Writes the model of the run (or checkpoint) directory `run` into `out` as a Hugging Face
/// GPT-2 directory: `config.json` ([`gpt2::config_to_hf`]), `model.safetensors` (GPT-2's
/// names, `Conv1D` weights stored `(in, out)`, the tied head left to `tie_word_embeddings`
/// as `save_pretrained` does) and the run's `tokenizer.json` when it has one. Errors, before
/// anything is written, for a model GPT-2 cannot hold: one without biases (GPT-2 always has
/// them) or with an untied head that has a bias (GPT-2's `lm_head` has none).
///
/// PyTorch equivalent: `model.save_pretrained(out)`.
pub fn export_hugging_face(run: &Path, out: &Path) -> Result<()> {
    let codec_file = Codec::file_in(run)?;
    verify_checkpoint(run, &[CONFIG_FILE, MODEL_FILE, codec_file])?;
    let cfg = NextTokenPredictorConfig::load(run.join(CONFIG_FILE))?;
    if !cfg.bias {
        candle::bail!(
            "{}: the model has no biases, which Hugging Face's GPT-2 always has",
            run.display()
        )
    }
    if !cfg.tie_embeddings {
        candle::bail!(
            "{}: the model's head is not tied to the token embedding and has a bias; GPT2LMHeadModel's lm_head is tied and has none",
            run.display()
        )
    }
    let ours = StateDict::load(run.join(MODEL_FILE))?;
    let theirs = gpt2::to_gpt2(&ours, Gpt2Format::HuggingFace, &cfg)?;
    let weights = StateDict::from_tensors(
        theirs
            .tensors()
            .iter()
            .filter(|(n, _)| n != "lm_head.weight")
            .cloned(),
    );
    let mut config = gpt2::config_to_hf(&cfg);
    let codec = Codec::load_dir(run)?;
    if let Some(id) = codec.bos_id() {
        config["bos_token_id"] = id.into();
    }
    if let Some(id) = codec.eos_id() {
        config["eos_token_id"] = id.into();
    }
    let config = serde_json::to_string_pretty(&config)
        .map_err(|e| candle::Error::Msg(format!("serializing config.json: {e}")))?;
    let _lock = crate::io::DirLock::acquire(out, "mha export")?;
    crate::io::write_atomic(&out.join("config.json"), config.as_bytes())?;
    weights.save_safetensors(out.join("model.safetensors"))?;
    if let Codec::Text(_) = codec {
        codec.save_dir(out)?;
    }
    Ok(())
}
