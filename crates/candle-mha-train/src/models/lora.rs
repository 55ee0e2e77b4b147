//! LoRA on a [`NextTokenPredictor`](super::NextTokenPredictor): which layers an adapter goes on ([`LoraSpec`], Hugging
//! Face's module names of the model's family), where each one is ([`LoraSite`]: our module
//! name, the base weight it updates, PEFT's name), and the merge of an adapter into the base
//! weights.
//!
//! | target | GPT-2 / nanoGPT family: our module | Llama family: our module (Hugging Face's own) |
//! |---|---|---|
//! | `c_attn` | `blocks.{i}.attn.in_proj` (`[3E, E]`, packed q/k/v) | |
//! | `c_proj` | `blocks.{i}.attn.out_proj` and `blocks.{i}.mlp.fc2` | |
//! | `c_fc` | `blocks.{i}.mlp.fc1` | |
//! | `q_proj` … `o_proj` | | `model.layers.{i}.self_attn.{target}` |
//! | `gate_proj`, `up_proj`, `down_proj` | | `model.layers.{i}.mlp.{target}` |
//!
//! An adapter's tensors are `{module}.lora_A.weight [r, in]` and `{module}.lora_B.weight
//! [out, r]`; PEFT's file names them `base_model.model.{hf}.lora_A.weight`, with `hf`
//! Hugging Face's module name (GPT-2: `transformer.h.{i}.attn.c_attn`, …).

use std::collections::HashMap;

use candle::{DType, Result, Tensor};
use candle_mha::checkpoint::StateDict;
use candle_mha::nn::{Lora, LoraConfig};
use serde::{Deserialize, Serialize};

use super::NextTokenPredictorConfig;

/// The targets of the GPT-2 / nanoGPT family (Hugging Face's `GPT2LMHeadModel` names).
pub const GPT_TARGETS: [&str; 3] = ["c_attn", "c_proj", "c_fc"];
/// The targets of the Llama family.
pub const LLAMA_TARGETS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// Which layers of a model get an adapter, and its hyper-parameters.
///
/// PyTorch equivalent: PEFT's `LoraConfig(r, lora_alpha, lora_dropout, use_rslora,
/// target_modules)` (`target_modules` as module-name suffixes).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoraSpec {
    /// The rank `r` (PEFT's default 8).
    pub rank: usize,
    /// `lora_alpha` (PEFT's default 8): the scaling is `alpha / r`.
    pub alpha: f64,
    /// Dropout on each adapter's input in training (PEFT's default 0).
    pub dropout: f64,
    /// Scale by `alpha / √r` (PEFT's `use_rslora`).
    #[serde(default)]
    pub use_rslora: bool,
    /// Hugging Face module names of the model's family ([`GPT_TARGETS`], [`LLAMA_TARGETS`]),
    /// each matching every module whose name ends with it; empty: PEFT's default for the
    /// family ([`default_targets`]).
    pub targets: Vec<String>,
}

impl Default for LoraSpec {
    fn default() -> Self {
        let c = LoraConfig::default();
        Self {
            rank: c.rank,
            alpha: c.alpha,
            dropout: c.dropout,
            use_rslora: c.use_rslora,
            targets: Vec::new(),
        }
    }
}

/// PEFT's default targets for a family (`TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`):
/// GPT-2 `c_attn`; Llama, Qwen2 and Mistral `q_proj`, `v_proj`.
pub fn default_targets(cfg: &NextTokenPredictorConfig) -> Vec<String> {
    let t: &[&str] = match cfg.llama.is_some() {
        true => &["q_proj", "v_proj"],
        false => &["c_attn"],
    };
    t.iter().map(|s| s.to_string()).collect()
}

impl LoraSpec {
    /// The core's adapter configuration.
    pub fn config(&self) -> LoraConfig {
        LoraConfig {
            rank: self.rank,
            alpha: self.alpha,
            dropout: self.dropout,
            use_rslora: self.use_rslora,
        }
    }

    /// The spec with its targets filled in (the family's default when empty), checked against
    /// the model: each a target of its family, none twice.
    pub fn resolved(&self, cfg: &NextTokenPredictorConfig) -> Result<Self> {
        self.config().validate()?;
        let mut spec = self.clone();
        if spec.targets.is_empty() {
            spec.targets = default_targets(cfg);
        }
        let allowed: &[&str] = match cfg.llama.is_some() {
            true => &LLAMA_TARGETS,
            false => &GPT_TARGETS,
        };
        for (i, t) in spec.targets.iter().enumerate() {
            if !allowed.contains(&t.as_str()) {
                candle::bail!(
                    "LoRA target {t:?} is not a module of this model; its family's are {}",
                    allowed.join(", ")
                )
            }
            if spec.targets[..i].contains(t) {
                candle::bail!("LoRA target {t:?} is given twice")
            }
        }
        Ok(spec)
    }

    /// The layers this spec adapts in a model of `cfg`, in the model's order.
    pub fn sites(&self, cfg: &NextTokenPredictorConfig) -> Result<Vec<LoraSite>> {
        let spec = self.resolved(cfg)?;
        Ok(all_sites(cfg)?
            .into_iter()
            .filter(|s| spec.targets.iter().any(|t| t == s.target))
            .collect())
    }
}

/// One layer an adapter can go on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoraSite {
    /// The Hugging Face target name it answers to (`c_attn`, `q_proj`, …).
    pub target: &'static str,
    /// Our module name: the adapter's tensors are `{module}.lora_A.weight` and
    /// `{module}.lora_B.weight`.
    pub module: String,
    /// The base weight `[out, in]` it updates (our state_dict name).
    pub weight: String,
    /// Hugging Face's module name (PEFT's file prefixes it with `base_model.model.`).
    pub hf_module: String,
    /// `(in, out)` features.
    pub features: (usize, usize),
}

/// Every layer of a model of `cfg` that an adapter can go on.
fn all_sites(cfg: &NextTokenPredictorConfig) -> Result<Vec<LoraSite>> {
    let mut out = Vec::new();
    let mut push = |target, module: String, hf: String, features| {
        out.push(LoraSite {
            target,
            weight: format!(
                "{module}{}",
                if target == "c_attn" {
                    "_weight"
                } else {
                    ".weight"
                }
            ),
            module,
            hf_module: hf,
            features,
        })
    };
    if let Some(l) = cfg.llama_config()? {
        let (e, i) = (l.hidden_size, l.intermediate_size);
        let (q, kv) = (l.num_heads * l.head_dim, l.num_kv_heads * l.head_dim);
        for n in 0..l.num_layers {
            let layer = format!("model.layers.{n}");
            for (t, f) in [
                ("q_proj", (e, q)),
                ("k_proj", (e, kv)),
                ("v_proj", (e, kv)),
                ("o_proj", (q, e)),
            ] {
                let m = format!("{layer}.self_attn.{t}");
                push(t, m.clone(), m, f);
            }
            for (t, f) in [
                ("gate_proj", (e, i)),
                ("up_proj", (e, i)),
                ("down_proj", (i, e)),
            ] {
                let m = format!("{layer}.mlp.{t}");
                push(t, m.clone(), m, f);
            }
        }
        return Ok(out);
    }
    let (e, ff) = (cfg.embed_dim, cfg.ff_dim);
    for n in 0..cfg.num_layers {
        let (ours, hf) = (format!("blocks.{n}"), format!("transformer.h.{n}"));
        push(
            "c_attn",
            format!("{ours}.attn.in_proj"),
            format!("{hf}.attn.c_attn"),
            (e, 3 * e),
        );
        push(
            "c_proj",
            format!("{ours}.attn.out_proj"),
            format!("{hf}.attn.c_proj"),
            (e, e),
        );
        push(
            "c_fc",
            format!("{ours}.mlp.fc1"),
            format!("{hf}.mlp.c_fc"),
            (e, ff),
        );
        push(
            "c_proj",
            format!("{ours}.mlp.fc2"),
            format!("{hf}.mlp.c_proj"),
            (ff, e),
        );
    }
    Ok(out)
}

/// The adapters of `spec` on a model of `cfg` from `vb` (created, as PEFT initialises them,
/// from a seeded `VarBuilder`; or read from a checkpoint), by module name.
pub(crate) fn adapters(
    cfg: &NextTokenPredictorConfig,
    spec: &LoraSpec,
    vb: &candle_nn::VarBuilder,
) -> Result<HashMap<String, Lora>> {
    let config = spec.resolved(cfg)?.config();
    spec.sites(cfg)?
        .into_iter()
        .map(|s| {
            let (i, o) = s.features;
            Ok((
                s.module.clone(),
                Lora::new(i, o, &config, vb.pp(&s.module))?,
            ))
        })
        .collect()
}

/// Names of an adapter's two tensors under `module`.
pub fn lora_names(module: &str) -> (String, String) {
    (
        format!("{module}.lora_A.weight"),
        format!("{module}.lora_B.weight"),
    )
}

/// The base weights with `adapter` (our names: `{module}.lora_A.weight`, …) merged in:
/// `W + s·B·A` for each site of `spec`, each in its base dtype. Errors, naming the tensor,
/// when the adapter lacks one, has one of another shape, or holds a name that is no site's.
///
/// PyTorch equivalent: `PeftModel.merge_and_unload().state_dict()`.
pub fn merge_into(
    base: StateDict,
    adapter: &StateDict,
    cfg: &NextTokenPredictorConfig,
    spec: &LoraSpec,
) -> Result<StateDict> {
    let sites = spec.sites(cfg)?;
    check_adapter(adapter, &sites, spec.rank)?;
    let scaling = spec.config().scaling();
    let by_weight: HashMap<&str, &LoraSite> =
        sites.iter().map(|s| (s.weight.as_str(), s)).collect();
    let mut merged = Vec::with_capacity(base.len());
    let mut found = 0;
    for (name, w) in base.tensors() {
        let w = match by_weight.get(name.as_str()) {
            Some(site) => {
                found += 1;
                let (a, b) = lora_names(&site.module);
                let (a, b) = (adapter_tensor(adapter, &a)?, adapter_tensor(adapter, &b)?);
                let lora = Lora::from_weights(
                    a.to_dtype(DType::F32)?,
                    b.to_dtype(DType::F32)?,
                    scaling,
                    0.0,
                )?;
                lora.merge(w)?
            }
            None => w.clone(),
        };
        merged.push((name.clone(), w));
    }
    if found != sites.len() {
        let missing: Vec<&str> = sites
            .iter()
            .filter(|s| base.get(&s.weight).is_none())
            .map(|s| s.weight.as_str())
            .collect();
        candle::bail!("LoRA merge: the base has no {missing:?}")
    }
    Ok(StateDict::from_tensors(merged))
}

fn adapter_tensor(adapter: &StateDict, name: &str) -> Result<Tensor> {
    adapter
        .get(name)
        .cloned()
        .ok_or_else(|| candle::Error::Msg(format!("the LoRA adapter has no {name}")))
}

/// `adapter` holds exactly the tensors of `sites`, each of its shape for rank `rank`.
pub fn check_adapter(adapter: &StateDict, sites: &[LoraSite], rank: usize) -> Result<()> {
    let mut expected = HashMap::new();
    for s in sites {
        let (a, b) = lora_names(&s.module);
        let (i, o) = s.features;
        expected.insert(a, vec![rank, i]);
        expected.insert(b, vec![o, rank]);
    }
    for (name, t) in adapter.tensors() {
        match expected.get(name) {
            None => candle::bail!(
                "the LoRA adapter holds {name}, which is no layer its configuration adapts"
            ),
            Some(shape) if t.dims() != shape.as_slice() => candle::bail!(
                "the LoRA adapter's {name} is {:?}, expected {shape:?}",
                t.dims()
            ),
            _ => {}
        }
    }
    for s in sites {
        let (a, b) = lora_names(&s.module);
        for name in [a, b] {
            if adapter.get(&name).is_none() {
                candle::bail!("the LoRA adapter has no {name}")
            }
        }
    }
    Ok(())
}

/// `layer(x)`, in training (`train`: the dropout seed of the block and the batch's first row)
/// with its adapter's dropout drawn from `(seed, label)` at the rows' offset.
pub(crate) fn linear_t(
    layer: &candle_mha::nn::Linear,
    x: &Tensor,
    train: Option<(u64, usize)>,
    label: &str,
) -> Result<Tensor> {
    use candle::Module;
    match train {
        Some((seed, row)) => {
            let seed = candle_mha::rng::derive_seed(seed, label);
            layer.forward_train(x, (seed, row_offset(x, row)))
        }
        None => layer.forward(x),
    }
}

/// Where row `row` of a batch like `x` (rows along its first dimension) starts, in elements.
pub(crate) fn row_offset(x: &Tensor, row: usize) -> u64 {
    let rows = x.dims().first().copied().unwrap_or(1).max(1);
    (row * (x.elem_count() / rows)) as u64
}
