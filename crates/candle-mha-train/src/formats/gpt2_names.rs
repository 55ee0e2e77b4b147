//! GPT-2's and nanoGPT's names for a [`NextTokenPredictor`](super::NextTokenPredictor): both
//! are our pre-LayerNorm blocks and packed causal attention under other names. Hugging Face
//! stores the projections as `Conv1D` (`(in, out)`, transposed here), nanoGPT as `nn.Linear`
//! (`(out, in)`, as ours); both tie the head to the token embedding.
//!
//! | ours | GPT-2 / nanoGPT |
//! |---|---|
//! | `token_embedding.weight`, `position_embedding.weight` | `transformer.wte.weight`, `transformer.wpe.weight` |
//! | `blocks.{i}.ln1.*`, `blocks.{i}.ln2.*` | `transformer.h.{i}.ln_1.*`, `transformer.h.{i}.ln_2.*` |
//! | `blocks.{i}.attn.in_proj_weight`, `in_proj_bias` | `transformer.h.{i}.attn.c_attn.weight`, `.bias` |
//! | `blocks.{i}.attn.out_proj.*` | `transformer.h.{i}.attn.c_proj.*` |
//! | `blocks.{i}.mlp.fc1.*`, `blocks.{i}.mlp.fc2.*` | `transformer.h.{i}.mlp.c_fc.*`, `transformer.h.{i}.mlp.c_proj.*` |
//! | `ln_f.*` | `transformer.ln_f.*` |
//! | (tied) | `lm_head.weight` |

use std::collections::HashMap;

use candle::{Result, Tensor};
use candle_mha::checkpoint::StateDict;

use crate::models::NextTokenPredictorConfig;

/// How a GPT-2-family state_dict stores its projection weights.
///
/// PyTorch equivalent: `transformers.GPT2LMHeadModel` (`Conv1D`) or nanoGPT's `GPT`
/// (`nn.Linear`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gpt2Format {
    /// Hugging Face's `Conv1D`: `c_attn`, `c_proj`, `c_fc` weights stored `(in, out)`.
    HuggingFace,
    /// nanoGPT's `nn.Linear`: `(out, in)`, as ours.
    NanoGpt,
}

/// What a conversion did: the tensors mapped (and how many transposed), and the entries it
/// left out with the reason (buffers, the tied head).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Gpt2Report {
    /// Tensors taken, by their name in the source.
    pub mapped: Vec<String>,
    /// Of those, the `Conv1D` weights transposed.
    pub transposed: usize,
    /// Entries of the source left out: name and why.
    pub skipped: Vec<(String, String)>,
}

impl std::fmt::Display for Gpt2Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} tensors mapped ({} Conv1D weights transposed), {} left out",
            self.mapped.len(),
            self.transposed,
            self.skipped.len()
        )?;
        for (name, why) in &self.skipped {
            write!(f, "\n  {name}: {why}")?;
        }
        Ok(())
    }
}

/// Projection weights stored transposed in Hugging Face's `Conv1D`.
const CONV1D: [&str; 4] = [
    "attn.c_attn.weight",
    "attn.c_proj.weight",
    "mlp.c_fc.weight",
    "mlp.c_proj.weight",
];

/// Our names and GPT-2's, outside the blocks (the head aside).
const TOP: [(&str, &str); 4] = [
    ("token_embedding.weight", "transformer.wte.weight"),
    ("position_embedding.weight", "transformer.wpe.weight"),
    ("ln_f.weight", "transformer.ln_f.weight"),
    ("ln_f.bias", "transformer.ln_f.bias"),
];

/// Our names and GPT-2's of a block's parameters, after `blocks.{i}.` / `transformer.h.{i}.`.
const BLOCK: [(&str, &str); 12] = [
    ("ln1.weight", "ln_1.weight"),
    ("ln1.bias", "ln_1.bias"),
    ("attn.in_proj_weight", "attn.c_attn.weight"),
    ("attn.in_proj_bias", "attn.c_attn.bias"),
    ("attn.out_proj.weight", "attn.c_proj.weight"),
    ("attn.out_proj.bias", "attn.c_proj.bias"),
    ("ln2.weight", "ln_2.weight"),
    ("ln2.bias", "ln_2.bias"),
    ("mlp.fc1.weight", "mlp.c_fc.weight"),
    ("mlp.fc1.bias", "mlp.c_fc.bias"),
    ("mlp.fc2.weight", "mlp.c_proj.weight"),
    ("mlp.fc2.bias", "mlp.c_proj.bias"),
];

/// Our name of a GPT-2-family parameter (its name may carry `_orig_mod.` or `module.`, or
/// lack `transformer.`); `None` for `lm_head.weight` (the head: tied, or `head.weight`),
/// buffers and names of no parameter.
pub fn our_name(theirs: &str) -> Option<String> {
    let n = canonical(theirs);
    if let Some((ours, _)) = TOP.iter().find(|(_, t)| *t == n) {
        return Some(ours.to_string());
    }
    let (i, rest) = n.strip_prefix("transformer.h.")?.split_once('.')?;
    let i: usize = i.parse().ok()?;
    let (ours, _) = BLOCK.iter().find(|(_, t)| *t == rest)?;
    Some(format!("blocks.{i}.{ours}"))
}

/// The GPT-2 name of one of our parameters (the inverse of [`our_name`], and
/// `head.weight` → `lm_head.weight`).
pub(crate) fn gpt2_name(ours: &str) -> Option<String> {
    if ours == "head.weight" {
        return Some("lm_head.weight".into());
    }
    if let Some((_, theirs)) = TOP.iter().find(|(o, _)| *o == ours) {
        return Some(theirs.to_string());
    }
    let (i, rest) = ours.strip_prefix("blocks.")?.split_once('.')?;
    let (_, theirs) = BLOCK.iter().find(|(o, _)| *o == rest)?;
    Some(format!("transformer.h.{i}.{theirs}"))
}

/// The name with the prefixes a source may add removed: `_orig_mod.` (`torch.compile`),
/// `module.` (DDP), and `transformer.` added where a bare `GPT2Model`'s names lack it.
fn canonical(name: &str) -> String {
    let mut n = name;
    for prefix in ["_orig_mod.", "module."] {
        n = n.strip_prefix(prefix).unwrap_or(n);
    }
    match n.starts_with("transformer.") || n.starts_with("lm_head.") {
        true => n.to_string(),
        false => format!("transformer.{n}"),
    }
}

/// Our state_dict from a GPT-2-family one (`sd`, in `format`): names mapped, `Conv1D` weights
/// transposed, buffers (`attn.bias`, `attn.masked_bias`) left out; with `cfg.tie_embeddings`,
/// `lm_head.weight` is left out after checking that it equals the token embedding. Names
/// may carry `_orig_mod.` or `module.`, and lack `transformer.` (a bare `GPT2Model`). Errors
/// name an entry that is neither a parameter nor a known buffer, and a parameter whose shape
/// is not the one `cfg` implies.
///
/// PyTorch equivalent: nanoGPT's `GPT.from_pretrained` copy loop.
pub fn from_gpt2(
    sd: &StateDict,
    format: Gpt2Format,
    cfg: &NextTokenPredictorConfig,
) -> Result<(StateDict, Gpt2Report)> {
    let mut report = Gpt2Report::default();
    let mut out: Vec<(String, Tensor)> = Vec::new();
    let mut head = None;
    for (name, t) in sd.tensors() {
        let n = canonical(name);
        if n.ends_with(".attn.bias") || n.ends_with(".attn.masked_bias") {
            report.skipped.push((
                name.clone(),
                "the causal mask buffer (the attention builds its own)".into(),
            ));
            continue;
        }
        if n == "lm_head.weight" {
            head = Some((name.clone(), t.clone()));
            continue;
        }
        let Some(ours) = our_name(&n) else {
            candle::bail!(
                "{name}: not a GPT-2 parameter (expected transformer.wte/wpe/h.N/ln_f or lm_head names)"
            )
        };
        let transpose = format == Gpt2Format::HuggingFace && CONV1D.iter().any(|c| n.ends_with(c));
        let t = match transpose {
            true => {
                report.transposed += 1;
                t.t()?.contiguous()?
            }
            false => t.clone(),
        };
        report.mapped.push(name.clone());
        out.push((ours, t));
    }
    match (head, cfg.tie_embeddings) {
        (Some((name, h)), true) => {
            if let Some((_, wte)) = out.iter().find(|(n, _)| n == "token_embedding.weight") {
                let same = h.dims() == wte.dims()
                    && h.to_dtype(candle::DType::F64)?
                        .sub(&wte.to_dtype(candle::DType::F64)?)?
                        .abs()?
                        .max_all()?
                        .to_scalar::<f64>()?
                        == 0.0;
                if !same {
                    candle::bail!(
                        "{name} differs from transformer.wte.weight, but the model ties them (tie_word_embeddings): the checkpoint's head would be lost"
                    )
                }
            }
            report
                .skipped
                .push((name, "tied to transformer.wte.weight".into()));
        }
        (Some((name, h)), false) => {
            report.mapped.push(name);
            out.push(("head.weight".into(), h));
        }
        (None, _) => {}
    }
    let converted = StateDict::from_tensors(out);
    check_shapes(&converted, cfg)?;
    check_complete(&converted, cfg, format)?;
    Ok((converted, report))
}

/// The GPT-2-family state_dict of ours (`sd`), in `format`: the inverse of [`from_gpt2`],
/// with `lm_head.weight` written as the token embedding when tied (as PyTorch's
/// `state_dict()` holds both names).
///
/// PyTorch equivalent: `GPT2LMHeadModel.state_dict()` / nanoGPT's `model.state_dict()`.
pub fn to_gpt2(
    sd: &StateDict,
    format: Gpt2Format,
    cfg: &NextTokenPredictorConfig,
) -> Result<StateDict> {
    let mut out = Vec::new();
    for (name, t) in sd.tensors() {
        let Some(theirs) = gpt2_name(name) else {
            candle::bail!("{name}: not a parameter of a NextTokenPredictor")
        };
        let t =
            match format == Gpt2Format::HuggingFace && CONV1D.iter().any(|c| theirs.ends_with(c)) {
                true => t.t()?.contiguous()?,
                false => t.clone(),
            };
        out.push((theirs, t));
    }
    if cfg.tie_embeddings {
        if let Some(wte) = sd.get("token_embedding.weight") {
            out.push(("lm_head.weight".into(), wte.clone()));
        }
    }
    Ok(StateDict::from_tensors(out))
}

/// Errors naming the first parameter whose shape is not what `cfg` implies.
fn check_shapes(sd: &StateDict, cfg: &NextTokenPredictorConfig) -> Result<()> {
    let (v, l, e, f) = (cfg.vocab_size, cfg.max_len, cfg.embed_dim, cfg.ff_dim);
    // Every shape the configuration implies, biases included whatever `cfg.bias` says.
    let with_biases = NextTokenPredictorConfig {
        bias: true,
        ..cfg.clone()
    };
    let mut expected: HashMap<String, Vec<usize>> = nanogpt_parameters(&with_biases)
        .into_iter()
        .filter_map(|(theirs, shape)| Some((our_name(&theirs)?, shape)))
        .collect();
    expected.insert("head.weight".into(), vec![v, e]);
    expected.insert("head.bias".into(), vec![v]);
    for (name, t) in sd.tensors() {
        let Some(want) = expected.get(name.as_str()) else {
            continue;
        };
        if t.dims() != want.as_slice() {
            candle::bail!(
                "{name}: shape {}, but the configuration (vocab_size {v}, context {l}, width {e}, MLP {f}) implies {}",
                candle_mha::io::short_shape(t.dims()),
                candle_mha::io::short_shape(want)
            )
        }
    }
    Ok(())
}

/// Errors unless `sd` (our names) holds exactly the parameters `cfg` describes, naming the
/// missing and the unexpected ones as the description of `format` (`config.json`,
/// `model_args`) and the checkpoint call them.
fn check_complete(
    sd: &StateDict,
    cfg: &NextTokenPredictorConfig,
    format: Gpt2Format,
) -> Result<()> {
    let what = match format {
        Gpt2Format::HuggingFace => "config.json",
        Gpt2Format::NanoGpt => "model_args",
    };
    let mut expected: Vec<String> = nanogpt_parameters(cfg)
        .into_iter()
        .filter_map(|(theirs, _)| our_name(&theirs))
        .collect();
    if !cfg.tie_embeddings {
        expected.push("head.weight".into());
        if cfg.head_has_bias() {
            expected.push("head.bias".into());
        }
    }
    let listed: std::collections::HashSet<&str> = expected.iter().map(String::as_str).collect();
    let named = |ours: &String| gpt2_name(ours).unwrap_or_else(|| ours.clone());
    let list = |names: Vec<String>| {
        let more = names.len().saturating_sub(4);
        let mut shown: Vec<String> = names.into_iter().take(4).collect();
        if more > 0 {
            shown.push(format!("and {more} more"));
        }
        shown.join(", ")
    };
    let missing: Vec<String> = expected
        .iter()
        .filter(|n| sd.get(n).is_none())
        .map(named)
        .collect();
    if !missing.is_empty() {
        candle::bail!(
            "{what} describes parameters the weights lack: {}",
            list(missing)
        )
    }
    let extra: Vec<String> = sd
        .tensors()
        .iter()
        .filter(|(n, _)| !listed.contains(n.as_str()))
        .map(|(n, _)| named(n))
        .collect();
    if !extra.is_empty() {
        candle::bail!(
            "the weights hold parameters {what} does not describe: {}",
            list(extra)
        )
    }
    Ok(())
}

/// nanoGPT's `GPT.named_parameters()`: names and shapes in the order its modules register
/// them (the tied head once, as `transformer.wte.weight`). The pickled state_dict's order is
/// not used: candle's pickle machine reverses the items of each `SETITEMS` batch.
pub fn nanogpt_parameters(cfg: &NextTokenPredictorConfig) -> Vec<(String, Vec<usize>)> {
    let (v, l, e, f) = (cfg.vocab_size, cfg.max_len, cfg.embed_dim, cfg.ff_dim);
    let mut out = vec![
        ("transformer.wte.weight".to_string(), vec![v, e]),
        ("transformer.wpe.weight".to_string(), vec![l, e]),
    ];
    let mut push = |name: String, w: Vec<usize>, b: usize| {
        out.push((format!("{name}.weight"), w));
        if cfg.bias {
            out.push((format!("{name}.bias"), vec![b]));
        }
    };
    for i in 0..cfg.num_layers {
        let h = format!("transformer.h.{i}");
        push(format!("{h}.ln_1"), vec![e], e);
        push(format!("{h}.attn.c_attn"), vec![3 * e, e], 3 * e);
        push(format!("{h}.attn.c_proj"), vec![e, e], e);
        push(format!("{h}.ln_2"), vec![e], e);
        push(format!("{h}.mlp.c_fc"), vec![f, e], f);
        push(format!("{h}.mlp.c_proj"), vec![e, f], e);
    }
    push("transformer.ln_f".to_string(), vec![e], e);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_both_ways() {
        for (theirs, ours) in [
            (
                "transformer.h.3.attn.c_attn.weight",
                "blocks.3.attn.in_proj_weight",
            ),
            ("transformer.h.0.mlp.c_proj.bias", "blocks.0.mlp.fc2.bias"),
            ("transformer.wpe.weight", "position_embedding.weight"),
        ] {
            assert_eq!(gpt2_name(ours).as_deref(), Some(theirs));
        }
        assert_eq!(
            canonical("_orig_mod.transformer.h.0.ln_1.weight"),
            "transformer.h.0.ln_1.weight"
        );
        assert_eq!(canonical("h.0.ln_1.weight"), "transformer.h.0.ln_1.weight");
        assert_eq!(gpt2_name("blocks.0.attn.nonsense"), None);
    }

    #[test]
    fn shapes_are_checked_against_the_configuration() -> Result<()> {
        let cfg = NextTokenPredictorConfig::new(11);
        let (e, f) = (cfg.embed_dim, cfg.ff_dim);
        let dev = candle::Device::Cpu;
        let good = |name: &str, shape: &[usize]| -> Result<StateDict> {
            Ok(StateDict::from_tensors(vec![(
                name.to_string(),
                Tensor::zeros(shape, candle::DType::F32, &dev)?,
            )]))
        };
        check_shapes(&good("blocks.1.mlp.fc1.weight", &[f, e])?, &cfg)?;
        check_shapes(&good("head.bias", &[11])?, &cfg)?;
        let err = check_shapes(&good("blocks.1.mlp.fc1.weight", &[e, f])?, &cfg).unwrap_err();
        assert!(
            err.to_string().contains("blocks.1.mlp.fc1.weight: shape"),
            "{err}"
        );
        let err = check_shapes(&good("blocks.0.attn.in_proj_bias", &[e])?, &cfg).unwrap_err();
        assert!(
            err.to_string().contains(&format!("implies [{}]", 3 * e)),
            "{err}"
        );
        Ok(())
    }
}
