//! Finding PyTorch's Transformer layers, stacks and whole models in a checkpoint and inferring
//! their sizes from the tensors.

use std::fmt;

use candle::{DType, Result};

use super::discover::InferredAttention;
use super::state_dict::{natural_cmp, normalize_prefix, StateDict};

/// A Transformer encoder or decoder layer found in a checkpoint: its prefix and what its
/// tensors tell.
///
/// The tensors cannot tell `nhead`, the activation, `norm_first`, `batch_first`,
/// `layer_norm_eps` or `dropout`: the loader takes them from its options.
///
/// PyTorch equivalent: an `nn.TransformerEncoderLayer` / `nn.TransformerDecoderLayer` in
/// `model.named_modules()`.
#[derive(Clone, Debug, PartialEq)]
pub struct InferredTransformerLayer {
    /// The prefix in the checkpoint (`""` or ending with `.`).
    pub prefix: String,
    /// Whether it is a decoder layer (it holds `multihead_attn.*`).
    pub decoder: bool,
    /// `d_model`, from `self_attn.in_proj_weight [3·d_model, d_model]`.
    pub d_model: usize,
    /// `dim_feedforward`, from `linear1.weight [dim_feedforward, d_model]`.
    pub dim_feedforward: usize,
    /// Whether biases are stored (`linear1.bias`, `self_attn.in_proj_bias`): PyTorch's `bias`.
    pub bias: bool,
    /// The stored dtype of `self_attn`'s projection weight.
    pub dtype: DType,
}

/// A stack of Transformer layers (`layers.N.*`, and `norm.*` when it has a final norm).
///
/// PyTorch equivalent: an `nn.TransformerEncoder` / `nn.TransformerDecoder`.
#[derive(Clone, Debug, PartialEq)]
pub struct InferredTransformerStack {
    /// The prefix in the checkpoint (`""` or ending with `.`).
    pub prefix: String,
    /// What its first layer tells (sizes, bias, decoder or not); prefix `…layers.N.`.
    pub layer: InferredTransformerLayer,
    /// Number of layers: the highest `layers.N` index + 1 (a gap shows as missing keys when
    /// loading).
    pub num_layers: usize,
    /// Whether `norm.weight` is stored: the stack has a final layer norm.
    pub final_norm: bool,
}

/// A whole encoder-decoder Transformer (`encoder.*`, `decoder.*`).
///
/// PyTorch equivalent: an `nn.Transformer`.
#[derive(Clone, Debug, PartialEq)]
pub struct InferredTransformer {
    /// The prefix in the checkpoint (`""` or ending with `.`).
    pub prefix: String,
    /// The encoder stack (prefix `…encoder.`).
    pub encoder: InferredTransformerStack,
    /// The decoder stack (prefix `…decoder.`).
    pub decoder: InferredTransformerStack,
}

/// One module [`find_transformer_modules`] recognised.
#[derive(Clone, Debug, PartialEq)]
pub enum InferredTransformerModule {
    /// An encoder or decoder layer.
    Layer(InferredTransformerLayer),
    /// An encoder or decoder stack.
    Stack(InferredTransformerStack),
    /// A whole `nn.Transformer`.
    Transformer(InferredTransformer),
}

fn dim(sd: &StateDict, name: &str, axis: usize) -> Option<usize> {
    sd.get(name).and_then(|t| t.dims().get(axis).copied())
}

fn has_attention(sd: &StateDict, prefix: &str) -> bool {
    sd.get(&format!("{prefix}in_proj_weight")).is_some()
        || sd.get(&format!("{prefix}q_proj_weight")).is_some()
}

fn found_list(state_dict: &StateDict) -> Vec<String> {
    find_transformer_modules(state_dict)
        .iter()
        .map(|m| m.to_string())
        .collect()
}

impl InferredTransformerLayer {
    /// Reads the encoder or decoder layer at `prefix` of `state_dict`. It needs
    /// `self_attn.in_proj_weight` (or `self_attn.q_proj_weight`) and `linear1.weight`; any
    /// other missing tensor shows when loading, in the report.
    ///
    /// PyTorch equivalent: none; PyTorch needs the constructor arguments up front.
    pub fn infer(state_dict: &StateDict, prefix: &str) -> Result<Self> {
        let prefix = normalize_prefix(prefix);
        match Self::find(state_dict, &prefix) {
            Some(l) => Ok(l),
            None => candle::bail!(
                "no Transformer layer at prefix \"{prefix}\": expected \"{prefix}self_attn.in_proj_weight\" and \"{prefix}linear1.weight\"; Transformer modules in this checkpoint: {:?}",
                found_list(state_dict)
            ),
        }
    }

    /// [`infer`](Self::infer) without the error (which lists what the checkpoint holds, so
    /// discovery must not call it).
    fn find(state_dict: &StateDict, prefix: &str) -> Option<Self> {
        let sd = state_dict.under(prefix);
        let attn = InferredAttention::infer(&sd, "self_attn").ok()?;
        Some(Self {
            decoder: has_attention(&sd, "multihead_attn."),
            d_model: attn.embed_dim,
            dim_feedforward: dim(&sd, "linear1.weight", 0)?,
            bias: attn.bias || sd.get("linear1.bias").is_some(),
            dtype: attn.dtype,
            prefix: prefix.to_string(),
        })
    }

    /// The head counts that divide `d_model`.
    pub fn possible_nhead(&self) -> Vec<usize> {
        (1..=self.d_model)
            .filter(|h| self.d_model.is_multiple_of(*h))
            .collect()
    }
}

/// The indices `N` of `{prefix}layers.N.` that hold a recognisable layer, ascending.
fn layer_indices(state_dict: &StateDict, prefix: &str) -> Vec<usize> {
    let start = format!("{prefix}layers.");
    let mut found: Vec<usize> = state_dict
        .tensors()
        .iter()
        .filter_map(|(n, _)| n.strip_prefix(&start)?.split('.').next()?.parse().ok())
        .collect();
    found.sort_unstable();
    found.dedup();
    found
}

impl InferredTransformerStack {
    /// Reads the stack at `prefix`: its layers `layers.N.*` and its final norm `norm.*`.
    ///
    /// PyTorch equivalent: none; PyTorch needs the constructor arguments up front.
    pub fn infer(state_dict: &StateDict, prefix: &str) -> Result<Self> {
        let prefix = normalize_prefix(prefix);
        match Self::find(state_dict, &prefix) {
            Some(s) => Ok(s),
            None => candle::bail!(
                "no Transformer encoder or decoder at prefix \"{prefix}\": expected layers \"{prefix}layers.N.\" holding \"self_attn.in_proj_weight\" and \"linear1.weight\"; Transformer modules in this checkpoint: {:?}",
                found_list(state_dict)
            ),
        }
    }

    fn find(state_dict: &StateDict, prefix: &str) -> Option<Self> {
        let indices = layer_indices(state_dict, prefix);
        let layer = indices.iter().find_map(|i| {
            InferredTransformerLayer::find(state_dict, &format!("{prefix}layers.{i}."))
        })?;
        Some(Self {
            final_norm: state_dict.get(&format!("{prefix}norm.weight")).is_some(),
            num_layers: indices.last()? + 1,
            layer,
            prefix: prefix.to_string(),
        })
    }
}

impl InferredTransformer {
    /// Reads the encoder-decoder model at `prefix` (`encoder.*` and `decoder.*`).
    ///
    /// PyTorch equivalent: none; PyTorch needs the constructor arguments up front.
    pub fn infer(state_dict: &StateDict, prefix: &str) -> Result<Self> {
        let prefix = normalize_prefix(prefix);
        let stack = |part: &str| {
            InferredTransformerStack::infer(state_dict, &format!("{prefix}{part}")).map_err(|e| {
                candle::Error::Msg(format!("no Transformer at prefix \"{prefix}\": {e}"))
            })
        };
        Ok(Self {
            encoder: stack("encoder")?,
            decoder: stack("decoder")?,
            prefix,
        })
    }

    fn find(state_dict: &StateDict, prefix: &str) -> Option<Self> {
        Some(Self {
            encoder: InferredTransformerStack::find(state_dict, &format!("{prefix}encoder."))?,
            decoder: InferredTransformerStack::find(state_dict, &format!("{prefix}decoder."))?,
            prefix: prefix.to_string(),
        })
    }
}

impl InferredTransformerModule {
    /// The module's prefix in the checkpoint.
    pub fn prefix(&self) -> &str {
        match self {
            Self::Layer(l) => &l.prefix,
            Self::Stack(s) => &s.prefix,
            Self::Transformer(t) => &t.prefix,
        }
    }
}

fn name(prefix: &str) -> &str {
    if prefix.is_empty() {
        "(root)"
    } else {
        prefix.trim_end_matches('.')
    }
}

fn sizes(f: &mut fmt::Formatter<'_>, l: &InferredTransformerLayer) -> fmt::Result {
    write!(
        f,
        "d_model={} dim_feedforward={} bias={} dtype={:?}",
        l.d_model, l.dim_feedforward, l.bias, l.dtype
    )
}

impl fmt::Display for InferredTransformerModule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d_model = match self {
            Self::Layer(l) => {
                let k = if l.decoder { "Decoder" } else { "Encoder" };
                write!(f, "{}: Transformer{k}Layer ", name(&l.prefix))?;
                sizes(f, l)?;
                l.d_model
            }
            Self::Stack(s) => {
                let k = if s.layer.decoder {
                    "Decoder"
                } else {
                    "Encoder"
                };
                write!(
                    f,
                    "{}: Transformer{k} num_layers={} final_norm={} ",
                    name(&s.prefix),
                    s.num_layers,
                    s.final_norm
                )?;
                sizes(f, &s.layer)?;
                s.layer.d_model
            }
            Self::Transformer(t) => {
                write!(
                    f,
                    "{}: Transformer num_encoder_layers={} num_decoder_layers={} ",
                    name(&t.prefix),
                    t.encoder.num_layers,
                    t.decoder.num_layers
                )?;
                sizes(f, &t.encoder.layer)?;
                if !(t.encoder.final_norm && t.decoder.final_norm) {
                    write!(
                        f,
                        " final norms: encoder={} decoder={}",
                        t.encoder.final_norm, t.decoder.final_norm
                    )?;
                }
                t.encoder.layer.d_model
            }
        };
        write!(f, " (nhead not stored: any divisor of {d_model})")
    }
}

/// Every Transformer layer, stack and whole model in `state_dict`, containers before their
/// contents, in natural order.
///
/// A layer is a prefix holding `self_attn.in_proj_weight` (or `q_proj_weight`) and
/// `linear1.weight` (a decoder layer also `multihead_attn.*`); a stack, a prefix whose
/// `layers.N.` are layers; a Transformer, a prefix with an encoder stack at `encoder.` and a
/// decoder stack at `decoder.`.
///
/// PyTorch equivalent: `[n for n, m in model.named_modules() if isinstance(m,
/// (nn.Transformer, nn.TransformerEncoder, nn.TransformerDecoder,
/// nn.TransformerEncoderLayer, nn.TransformerDecoderLayer))]`.
pub fn find_transformer_modules(state_dict: &StateDict) -> Vec<InferredTransformerModule> {
    let mut layers: Vec<InferredTransformerLayer> = state_dict
        .tensors()
        .iter()
        .filter_map(|(n, _)| {
            n.strip_suffix("self_attn.in_proj_weight")
                .or_else(|| n.strip_suffix("self_attn.q_proj_weight"))
        })
        .filter(|p| p.is_empty() || p.ends_with('.'))
        .filter_map(|p| InferredTransformerLayer::find(state_dict, p))
        .collect();
    layers.dedup_by(|a, b| a.prefix == b.prefix);
    // Stacks: the prefixes before `layers.N.` of the layers.
    let mut stack_prefixes: Vec<String> = layers
        .iter()
        .filter_map(|l| {
            let p = l.prefix.strip_suffix('.')?;
            let (head, index) = p.rsplit_once('.').unwrap_or(("", p));
            index.parse::<usize>().ok()?;
            let head = head.strip_suffix("layers")?;
            (head.is_empty() || head.ends_with('.')).then(|| head.to_string())
        })
        .collect();
    stack_prefixes.sort_by(|a, b| natural_cmp(a, b));
    stack_prefixes.dedup();
    let stacks: Vec<InferredTransformerStack> = stack_prefixes
        .iter()
        .filter_map(|p| InferredTransformerStack::find(state_dict, p))
        .collect();
    let transformers: Vec<InferredTransformer> = stacks
        .iter()
        .filter(|s| !s.layer.decoder)
        .filter_map(|s| {
            let p = s.prefix.strip_suffix("encoder.")?;
            (p.is_empty() || p.ends_with('.')).then_some(p)
        })
        .filter_map(|p| InferredTransformer::find(state_dict, p))
        .filter(|t| t.decoder.layer.decoder)
        .collect();
    let mut all: Vec<InferredTransformerModule> = transformers
        .into_iter()
        .map(InferredTransformerModule::Transformer)
        .chain(stacks.into_iter().map(InferredTransformerModule::Stack))
        .chain(layers.into_iter().map(InferredTransformerModule::Layer))
        .collect();
    // A container's prefix is a prefix of its contents', so it sorts first.
    all.sort_by(|a, b| natural_cmp(a.prefix(), b.prefix()));
    all
}

#[cfg(test)]
mod tests {
    use candle::{Device, Tensor};

    use super::*;

    fn sd(names: &[(&str, &[usize])]) -> StateDict {
        StateDict::from_tensors(names.iter().map(|(n, s)| {
            let t = Tensor::zeros(*s, DType::F32, &Device::Cpu).unwrap();
            (n.to_string(), t)
        }))
    }

    fn encoder_layer(prefix: &str, bias: bool) -> Vec<(String, Vec<usize>)> {
        let mut v = vec![
            ("self_attn.in_proj_weight", vec![24, 8]),
            ("self_attn.out_proj.weight", vec![8, 8]),
            ("linear1.weight", vec![12, 8]),
            ("linear2.weight", vec![8, 12]),
            ("norm1.weight", vec![8]),
            ("norm2.weight", vec![8]),
        ];
        if bias {
            v.push(("linear1.bias", vec![12]));
        }
        v.into_iter()
            .map(|(n, s)| (format!("{prefix}{n}"), s))
            .collect()
    }

    fn build(parts: Vec<Vec<(String, Vec<usize>)>>) -> StateDict {
        let all: Vec<(String, Vec<usize>)> = parts.into_iter().flatten().collect();
        let refs: Vec<(&str, &[usize])> = all
            .iter()
            .map(|(n, s)| (n.as_str(), s.as_slice()))
            .collect();
        sd(&refs)
    }

    #[test]
    fn stack_sizes_and_gaps() {
        // layers.0 and layers.2: three layers, the middle one missing (shows when loading).
        let mut parts = vec![
            encoder_layer("m.layers.0.", false),
            encoder_layer("m.layers.2.", false),
        ];
        parts.push(vec![("m.norm.weight".into(), vec![8])]);
        let s = InferredTransformerStack::infer(&build(parts), "m").unwrap();
        assert_eq!(
            (s.num_layers, s.final_norm, s.prefix.as_str()),
            (3, true, "m.")
        );
        assert_eq!((s.layer.d_model, s.layer.dim_feedforward), (8, 12));
        assert!(!s.layer.bias && !s.layer.decoder);
        assert_eq!(s.layer.possible_nhead(), [1, 2, 4, 8]);
    }

    #[test]
    fn finds_containers_before_contents() {
        let mut dec = encoder_layer("decoder.layers.0.", true);
        dec.push((
            "decoder.layers.0.multihead_attn.in_proj_weight".into(),
            vec![24, 8],
        ));
        let sd = build(vec![encoder_layer("encoder.layers.0.", true), dec]);
        let found: Vec<String> = find_transformer_modules(&sd)
            .iter()
            .map(|m| m.prefix().to_string())
            .collect();
        assert_eq!(
            found,
            [
                "",
                "decoder.",
                "decoder.layers.0.",
                "encoder.",
                "encoder.layers.0."
            ]
        );
        let t = InferredTransformer::infer(&sd, "").unwrap();
        assert!(t.decoder.layer.decoder && !t.encoder.layer.decoder && t.encoder.layer.bias);
    }

    #[test]
    fn missing_linear1_names_it() {
        let sd = sd(&[("self_attn.in_proj_weight", &[24, 8])]);
        let e = InferredTransformerLayer::infer(&sd, "")
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"linear1.weight\""), "{e}");
        let e = InferredTransformer::infer(&sd, "x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no Transformer at prefix \"x.\""), "{e}");
    }
}
