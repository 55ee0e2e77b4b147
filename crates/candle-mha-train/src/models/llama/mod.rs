//! [`Llama`]: the Llama-family causal language model (Llama, Qwen2, Mistral) with Hugging
//! Face's parameter names, its key/value cache ([`LlamaCache`]: only the key/value heads) and
//! greedy or sampled generation.

use candle::{DType, Device, Module, Result, Tensor, D};
use candle_mha::attention::{scaled_dot_product_attention, SdpaOptions};
use candle_mha::nn::{Embedding, Linear, RmsNorm, RmsNormKind, RotaryEmbedding, SwiGlu};
use candle_nn::{Init, VarBuilder};

mod config;
mod lora;

pub(crate) use config::eos_ids;
pub use config::{LlamaConfig, LlamaFamily};

use crate::models::lora::linear_t;

/// A training call's LoRA dropout: the layer's seed and the batch's first row (`None`:
/// evaluation).
type Train = Option<(u64, usize)>;

/// Grouped-query self-attention with rotary positions.
///
/// PyTorch equivalent: transformers' `LlamaAttention` (`q_proj`, `k_proj`, `v_proj`, `o_proj`)
/// with `F.scaled_dot_product_attention(..., is_causal, enable_gqa)`.
#[derive(Clone, Debug)]
pub struct LlamaAttention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl LlamaAttention {
    fn new(cfg: &LlamaConfig, vb: VarBuilder) -> Result<Self> {
        let (e, d) = (cfg.hidden_size, cfg.head_dim);
        let (h, hk) = (cfg.num_heads, cfg.num_kv_heads);
        Ok(Self {
            q: Linear::new(e, h * d, cfg.qkv_bias, vb.pp("q_proj"))?,
            k: Linear::new(e, hk * d, cfg.qkv_bias, vb.pp("k_proj"))?,
            v: Linear::new(e, hk * d, cfg.qkv_bias, vb.pp("v_proj"))?,
            o: Linear::new(h * d, e, cfg.o_bias, vb.pp("o_proj"))?,
            heads: h,
            kv_heads: hk,
            head_dim: d,
        })
    }

    /// q, k (rotated, positions `offset..`) and v of `x (B, L, E)`, as `(B, heads, L, D)`.
    fn heads_of(
        &self,
        x: &Tensor,
        rope: &RotaryEmbedding,
        offset: usize,
        train: Train,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let (b, l, _) = x.dims3()?;
        let split = |t: Tensor, h: usize| t.reshape((b, l, h, self.head_dim))?.transpose(1, 2);
        let proj = |layer: &Linear, label: &str| linear_t(layer, x, train, label);
        let q = rope.apply(&split(proj(&self.q, "q_proj")?, self.heads)?, offset)?;
        let k = rope.apply(&split(proj(&self.k, "k_proj")?, self.kv_heads)?, offset)?;
        Ok((q, k, split(proj(&self.v, "v_proj")?, self.kv_heads)?))
    }

    /// `x (B, L, E)` at positions `offset..offset + L` after the `cache`d ones (`(B, H_kv, S, D)`
    /// keys and values, extended in place).
    fn forward(
        &self,
        x: &Tensor,
        rope: &RotaryEmbedding,
        cache: Option<&mut Option<(Tensor, Tensor)>>,
        pad: Option<&Tensor>,
        train: Train,
    ) -> Result<Tensor> {
        let (b, l, _) = x.dims3()?;
        let d = self.head_dim;
        let offset = match &cache {
            Some(Some((k, _))) => k.dim(2)?,
            _ => 0,
        };
        let (q, k, v) = self.heads_of(x, rope, offset, train)?;
        let (k, v) = match cache {
            Some(slot) => {
                let kv = match slot.take() {
                    Some((pk, pv)) => (
                        Tensor::cat(&[&pk, &k], 2)?,
                        Tensor::cat(&[&pv, &v.contiguous()?], 2)?,
                    ),
                    None => (k, v.contiguous()?),
                };
                *slot = Some(kv.clone());
                kv
            }
            None => (k, v),
        };
        let s = k.dim(2)?;
        let opts = SdpaOptions::new().gqa();
        let opts = match (offset, l, pad) {
            // Causal and no padded key: `(B, 1, L, S)`, 1 where key j takes part for query i.
            (0, _, Some(pad)) => {
                let causal: Vec<u8> = (0..l)
                    .flat_map(|i| (0..s).map(move |j| u8::from(j <= i)))
                    .collect();
                let causal = Tensor::from_vec(causal, (1, 1, l, s), x.device())?;
                let keep = pad.eq(0u8)?.reshape((b, 1, 1, s))?;
                opts.with_mask(causal.broadcast_mul(&keep)?)
            }
            (_, _, Some(_)) => {
                candle::bail!("Llama: a key padding mask with a cache is not supported")
            }
            (0, _, None) => opts.causal(),
            (_, 1, None) => opts,
            // Query i (position offset + i) sees keys j ≤ offset + i: bottom-right aligned.
            _ => {
                let keep: Vec<u8> = (0..l)
                    .flat_map(|i| (0..s).map(move |j| u8::from(j <= offset + i)))
                    .collect();
                opts.with_mask(Tensor::from_vec(keep, (l, s), x.device())?)
            }
        };
        let ctx = scaled_dot_product_attention(&q, &k, &v, &opts)?;
        let ctx = ctx
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b, l, self.heads * d))?;
        linear_t(&self.o, &ctx, train, "o_proj")
    }

    /// [`forward`](Self::forward) from position 0 without a cache, and the per-query-head
    /// attention weights `(B, H, L, L)` (each key/value head read by its group's query heads).
    fn forward_with_weights(&self, x: &Tensor, rope: &RotaryEmbedding) -> Result<(Tensor, Tensor)> {
        let (b, l, _) = x.dims3()?;
        let d = self.head_dim;
        let (q, k, v) = self.heads_of(x, rope, 0, None)?;
        let rep = self.heads / self.kv_heads;
        // Each key/value head repeated for its group (inspection only: the weights are L × L
        // per query head anyway).
        let repeat = |t: &Tensor| -> Result<Tensor> {
            t.unsqueeze(2)?
                .broadcast_as((b, self.kv_heads, rep, l, d))?
                .reshape((b, self.heads, l, d))
        };
        let (k, v) = (repeat(&k)?, repeat(&v)?);
        let causal: Vec<f32> = (0..l)
            .flat_map(|i| (0..l).map(move |j| if j > i { f32::NEG_INFINITY } else { 0.0 }))
            .collect();
        let causal = Tensor::from_vec(causal, (l, l), x.device())?.to_dtype(q.dtype())?;
        let scores = (q.contiguous()?.matmul(&k.t()?)? * (1.0 / (d as f64).sqrt()))?;
        let w =
            candle_mha::attention::softmax::safe_softmax_last_dim(&scores.broadcast_add(&causal)?)?;
        let ctx = w.matmul(&v.contiguous()?)?;
        let ctx = ctx
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b, l, self.heads * d))?;
        Ok((self.o.forward(&ctx)?, w))
    }

    /// The four projections: q, k, v, o.
    pub fn projections(&self) -> [&Linear; 4] {
        [&self.q, &self.k, &self.v, &self.o]
    }
}

/// One pre-RMSNorm block: `h = x + attn(norm1(x))`, `h + mlp(norm2(h))`.
///
/// PyTorch equivalent: transformers' `LlamaDecoderLayer` (`input_layernorm`, `self_attn`,
/// `post_attention_layernorm`, `mlp`).
#[derive(Clone, Debug)]
pub struct LlamaBlock {
    input_layernorm: RmsNorm,
    attn: LlamaAttention,
    post_attention_layernorm: RmsNorm,
    mlp: SwiGlu,
}

impl LlamaBlock {
    fn new(cfg: &LlamaConfig, vb: VarBuilder) -> Result<Self> {
        let (e, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        Ok(Self {
            input_layernorm: RmsNorm::new(e, eps, RmsNormKind::Llama, vb.pp("input_layernorm"))?,
            attn: LlamaAttention::new(cfg, vb.pp("self_attn"))?,
            post_attention_layernorm: RmsNorm::new(
                e,
                eps,
                RmsNormKind::Llama,
                vb.pp("post_attention_layernorm"),
            )?,
            mlp: SwiGlu::new(e, cfg.intermediate_size, vb.pp("mlp"))?,
        })
    }

    fn forward(
        &self,
        x: &Tensor,
        rope: &RotaryEmbedding,
        cache: Option<&mut Option<(Tensor, Tensor)>>,
        pad: Option<&Tensor>,
        train: Train,
    ) -> Result<Tensor> {
        let normed = self.input_layernorm.forward(x)?;
        let h = (x + self.attn.forward(&normed, rope, cache, pad, train)?)?;
        let normed = self.post_attention_layernorm.forward(&h)?;
        let m = match train {
            Some((seed, row)) if self.has_lora() => {
                let s = |l: &str| candle_mha::rng::derive_seed(seed, l);
                let seeds = [s("gate_proj"), s("up_proj"), s("down_proj")];
                self.mlp.forward_train(&normed, seeds, row)?
            }
            _ => self.mlp.forward(&normed)?,
        };
        &h + m
    }

    /// The block's attention.
    pub fn attn(&self) -> &LlamaAttention {
        &self.attn
    }
}

/// The key/value cache of a [`Llama`]: per layer the keys (after RoPE) and values of the
/// positions seen so far, `(B, H_kv, S, D)` — the key/value heads only.
///
/// PyTorch equivalent: transformers' `DynamicCache`.
#[derive(Clone, Debug, Default)]
pub struct LlamaCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
}

impl LlamaCache {
    /// Positions cached.
    pub fn len(&self) -> usize {
        match self.layers.first() {
            Some(Some((k, _))) => k.dims()[2],
            _ => 0,
        }
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the cached keys and values.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(|(k, v)| (k.elem_count() + v.elem_count()) * k.dtype().size_in_bytes())
            .sum()
    }

    /// Layer `i`'s keys and values `(B, H_kv, S, D)`.
    pub fn layer(&self, i: usize) -> Option<&(Tensor, Tensor)> {
        self.layers.get(i).and_then(Option::as_ref)
    }
}

/// A Llama-family causal language model: token embedding, pre-RMSNorm blocks with
/// grouped-query attention, rotary positions and SwiGLU, a final RMSNorm and the head (the
/// embedding itself when tied).
///
/// PyTorch equivalent: transformers' `LlamaForCausalLM` / `Qwen2ForCausalLM` /
/// `MistralForCausalLM`, with the same state_dict names (`model.embed_tokens.weight`,
/// `model.layers.{i}.self_attn.q_proj.weight`, …, `model.norm.weight`, `lm_head.weight`).
///
/// # Shapes
/// tokens `(B, L)` u32 → logits `(B, L, V)`: position `i` predicts token `i + 1`.
#[derive(Clone, Debug)]
pub struct Llama {
    config: LlamaConfig,
    embed_tokens: Embedding,
    layers: Vec<LlamaBlock>,
    norm: RmsNorm,
    lm_head: Linear,
    rope: RotaryEmbedding,
}

impl Llama {
    /// Takes (or creates) every parameter under `vb` with Hugging Face's names. New
    /// parameters: the embedding (and an untied head) N(0, 0.02) as transformers draws them,
    /// the projections `nn.Linear`'s U(±1/√in), the norms ones.
    pub fn new(config: LlamaConfig, vb: VarBuilder) -> Result<Self> {
        config.validate()?;
        let m = vb.pp("model");
        let normal = Init::Randn {
            mean: 0.0,
            stdev: 0.02,
        };
        let (v, e) = (config.vocab_size, config.hidden_size);
        let embed = m
            .pp("embed_tokens")
            .get_with_hints((v, e), "weight", normal)?;
        let embed_tokens = Embedding::from_weight(embed.clone());
        let layers = (0..config.num_layers)
            .map(|i| LlamaBlock::new(&config, m.pp(format!("layers.{i}"))))
            .collect::<Result<Vec<_>>>()?;
        let norm = RmsNorm::new(e, config.rms_norm_eps, RmsNormKind::Llama, m.pp("norm"))?;
        let lm_head = match config.tie_word_embeddings {
            true => Linear::from_weights(embed, None),
            false => Linear::from_weights(
                vb.pp("lm_head").get_with_hints((v, e), "weight", normal)?,
                None,
            ),
        };
        let rope = RotaryEmbedding::new(config.head_dim, config.rope_theta, config.rope_scaling)?;
        Ok(Self {
            config,
            embed_tokens,
            layers,
            norm,
            lm_head,
            rope,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The blocks.
    pub fn layers(&self) -> &[LlamaBlock] {
        &self.layers
    }

    /// An empty cache for [`forward_cached`](Self::forward_cached).
    pub fn new_cache(&self) -> LlamaCache {
        LlamaCache {
            layers: vec![None; self.layers.len()],
        }
    }

    fn check_tokens(&self, tokens: &Tensor, past: usize) -> Result<(usize, usize)> {
        let (b, l) = tokens.dims2()?;
        if past + l > self.config.max_position_embeddings {
            candle::bail!(
                "Llama: {} positions, more than max_position_embeddings {}",
                past + l,
                self.config.max_position_embeddings
            )
        }
        let max = tokens
            .to_dtype(DType::U32)?
            .flatten_all()?
            .max(0)?
            .to_scalar::<u32>()?;
        if l > 0 && max as usize >= self.config.vocab_size {
            candle::bail!(
                "Llama: token id {max} is outside the vocabulary of {}",
                self.config.vocab_size
            )
        }
        Ok((b, l))
    }

    /// The final hidden states `(B, L, E)` (after `model.norm`).
    pub fn hidden(&self, tokens: &Tensor) -> Result<Tensor> {
        self.hidden_masked(tokens, None, true)
    }

    /// [`hidden`](Self::hidden) with padded keys (`pad (B, L)` u8, nonzero: a padding key no
    /// query attends to; positions are not shifted, so padding goes at the end). `graph:
    /// false` detaches each block's output (evaluation: no activation is held for a backward
    /// pass).
    pub fn hidden_masked(
        &self,
        tokens: &Tensor,
        pad: Option<&Tensor>,
        graph: bool,
    ) -> Result<Tensor> {
        self.hidden_train(tokens, pad, graph, None)
    }

    /// [`hidden_masked`](Self::hidden_masked) in training mode when `train` is given: the
    /// LoRA adapters' dropout drawn from its seed for rows `first_row..` of a larger batch.
    pub fn hidden_train(
        &self,
        tokens: &Tensor,
        pad: Option<&Tensor>,
        graph: bool,
        train: Option<(u64, usize)>,
    ) -> Result<Tensor> {
        let (b, l) = self.check_tokens(tokens, 0)?;
        if let Some(p) = pad {
            if p.dims() != [b, l] {
                candle::bail!(
                    "Llama: key padding mask {:?}, expected {:?}",
                    p.dims(),
                    [b, l]
                )
            }
        }
        let cut = |t: Tensor| if graph { t } else { t.detach() };
        let mut x = cut(self.embed_tokens.forward(tokens)?);
        for (i, layer) in self.layers.iter().enumerate() {
            let train =
                train.map(|(s, row)| (candle_mha::rng::derive_seed(s, &i.to_string()), row));
            x = cut(layer.forward(&x, &self.rope, None, pad, train)?);
        }
        self.norm.forward(&x)
    }

    /// The final hidden states and every layer's per-query-head attention weights
    /// `(B, H, L, L)`, from position 0 (what `mha inspect` shows).
    pub fn hidden_with_weights(&self, tokens: &Tensor) -> Result<(Tensor, Vec<Tensor>)> {
        self.check_tokens(tokens, 0)?;
        let mut x = self.embed_tokens.forward(tokens)?;
        let mut weights = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let (a, w) = layer
                .attn
                .forward_with_weights(&layer.input_layernorm.forward(&x)?, &self.rope)?;
            let h = (&x + a)?;
            x = (&h
                + layer
                    .mlp
                    .forward(&layer.post_attention_layernorm.forward(&h)?)?)?;
            weights.push(w);
        }
        Ok((self.norm.forward(&x)?, weights))
    }

    /// The output head (the token embedding when tied).
    pub fn lm_head(&self) -> &Linear {
        &self.lm_head
    }

    /// The device of the weights.
    pub fn device(&self) -> Device {
        self.lm_head.weight().device().clone()
    }

    /// Logits `(B, L, V)` of `tokens (B, L)` from position 0.
    pub fn forward(&self, tokens: &Tensor) -> Result<Tensor> {
        self.lm_head.forward(&self.hidden(tokens)?)
    }

    /// Logits `(B, L, V)` of `tokens` at the positions after those in `cache`, which it
    /// extends.
    pub fn forward_cached(&self, tokens: &Tensor, cache: &mut LlamaCache) -> Result<Tensor> {
        if cache.layers.len() != self.layers.len() {
            candle::bail!(
                "Llama: a cache of {} layers for a model of {}",
                cache.layers.len(),
                self.layers.len()
            )
        }
        self.check_tokens(tokens, cache.len())?;
        let mut x = self.embed_tokens.forward(tokens)?;
        for (layer, slot) in self.layers.iter().zip(cache.layers.iter_mut()) {
            x = layer.forward(&x, &self.rope, Some(slot), None, None)?;
        }
        self.lm_head.forward(&self.norm.forward(&x)?)
    }

    /// Mean cross-entropy of next-token prediction over `tokens (B, L)` (position `i`
    /// predicting token `i + 1`).
    ///
    /// PyTorch equivalent: `model(input_ids, labels=input_ids).loss`.
    pub fn loss(&self, tokens: &Tensor) -> Result<Tensor> {
        let (b, l) = tokens.dims2()?;
        if l < 2 {
            candle::bail!("Llama: the loss needs sequences of 2 tokens or more, got {l}")
        }
        let h = self.hidden(&tokens.narrow(1, 0, l - 1)?)?;
        let targets = tokens
            .narrow(1, 1, l - 1)?
            .flatten_all()?
            .to_dtype(DType::U32)?;
        let keep = Tensor::ones(b * (l - 1), DType::U8, tokens.device())?;
        // The head and the loss in one op on the CPU: the logits are never a graph tensor.
        let h = h
            .to_dtype(DType::F32)?
            .reshape((b * (l - 1), self.config.hidden_size))?;
        let w = self.lm_head.weight().to_dtype(DType::F32)?;
        candle_mha::nn::linear_cross_entropy(&h, &w, None, &targets, &keep)
    }

    /// Greedy continuation of `prompt` (token ids): up to `max_new` tokens, stopping after any
    /// id in `eos`, with the cache (`use_cache`) or recomputing every position.
    ///
    /// PyTorch equivalent: `model.generate(prompt, do_sample=False, max_new_tokens=max_new,
    /// use_cache=use_cache)`, new tokens only.
    pub fn generate_greedy(
        &self,
        prompt: &[u32],
        max_new: usize,
        eos: &[u32],
        use_cache: bool,
        device: &Device,
    ) -> Result<Vec<u32>> {
        if prompt.is_empty() {
            candle::bail!("Llama: generation needs a prompt of one token or more")
        }
        let mut all = prompt.to_vec();
        let mut cache = self.new_cache();
        let mut next_input = prompt.to_vec();
        let mut out = Vec::new();
        for _ in 0..max_new {
            let logits = if use_cache {
                let t = Tensor::new(next_input.as_slice(), device)?.unsqueeze(0)?;
                self.forward_cached(&t, &mut cache)?
            } else {
                self.forward(&Tensor::new(all.as_slice(), device)?.unsqueeze(0)?)?
            };
            let last = logits.squeeze(0)?.get(logits.dim(1)? - 1)?;
            let id = last
                .to_dtype(DType::F32)?
                .argmax(D::Minus1)?
                .to_scalar::<u32>()?;
            all.push(id);
            out.push(id);
            next_input = vec![id];
            if eos.contains(&id) {
                break;
            }
        }
        Ok(out)
    }
}

/// Every parameter of a model of `cfg`: Hugging Face's name and shape, in the model's order.
pub fn parameter_shapes(cfg: &LlamaConfig) -> Vec<(String, Vec<usize>)> {
    let (v, e, i) = (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size);
    let (q, kv) = (
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
    );
    let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, e])];
    for l in 0..cfg.num_layers {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        out.push((p("input_layernorm.weight"), vec![e]));
        for (name, rows) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
            out.push((p(&format!("self_attn.{name}.weight")), vec![rows, e]));
            if cfg.qkv_bias {
                out.push((p(&format!("self_attn.{name}.bias")), vec![rows]));
            }
        }
        out.push((p("self_attn.o_proj.weight"), vec![e, q]));
        if cfg.o_bias {
            out.push((p("self_attn.o_proj.bias"), vec![e]));
        }
        out.push((p("post_attention_layernorm.weight"), vec![e]));
        out.push((p("mlp.gate_proj.weight"), vec![i, e]));
        out.push((p("mlp.up_proj.weight"), vec![i, e]));
        out.push((p("mlp.down_proj.weight"), vec![e, i]));
    }
    out.push(("model.norm.weight".to_string(), vec![e]));
    if !cfg.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![v, e]));
    }
    out
}
