//! What every Hugging Face model directory shares: its JSON files (bounded) and its weights
//! (`model.safetensors`, or the shards its index names, each checked to be a plain file of
//! the directory).

use std::path::{Path, PathBuf};

use candle::Result;
use candle_mha::checkpoint::StateDict;

pub(crate) fn json(path: &Path) -> Result<serde_json::Value> {
    let text = candle_mha::io::read_input_string(path, crate::limits::MAX_CONFIG_BYTES)?;
    serde_json::from_str(&text)
        .map_err(|e| candle::Error::Msg(format!("{}: not JSON ({e})", path.display())))
}

/// A plain file name from a checkpoint's index (untrusted: no path may leave the directory).
pub(crate) fn plain_file(dir: &Path, name: &str) -> Result<PathBuf> {
    let plain =
        !name.is_empty() && !name.starts_with('.') && !name.contains(['/', '\\']) && name != "..";
    if !plain {
        candle::bail!(
            "{}: the index names {}, not a file of the directory",
            dir.display(),
            candle_mha::io::quoted(name, 80)
        )
    }
    Ok(dir.join(name))
}

/// The weights of a Hugging Face directory: `model.safetensors`, the shards its
/// `model.safetensors.index.json` (or `pytorch_model.bin.index.json`) lists, or
/// `pytorch_model.bin`.
pub(crate) fn hugging_face_weights(dir: &Path) -> Result<StateDict> {
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
