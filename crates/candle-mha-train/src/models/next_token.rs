//! [`NextTokenPredictor`]: a small causal transformer over token ids, with PyTorch names.

use candle::{DType, Module, Result, Tensor, D};
use candle_nn::VarBuilder;

use super::llama::Llama;
use super::{Gelu, NextTokenPredictorConfig};
use candle_mha::attention::dropout::{seeded_dropout_add, seeded_dropout_at};
use candle_mha::attention::{
    AttentionKernel, AttentionOptions, MultiheadAttention, MultiheadAttentionConfig,
};
use candle_mha::nn::{Embedding, LayerNorm, Linear};
use candle_mha::rng::derive_seed;

mod incremental;
mod lora;

/// One pre-LayerNorm transformer block: `x + attn(ln1(x))`, then `x + mlp(ln2(x))`.
///
/// PyTorch equivalent: `Block` in `scripts/reference_model.py` (`ln1`, `attn`, `ln2`,
/// `mlp.fc1`, `mlp.fc2`, exact-erf GELU), or GPT-2's / nanoGPT's `Block` (`ln_1`,
/// `attn.c_attn`, `attn.c_proj`, `ln_2`, `mlp.c_fc`, `mlp.c_proj`) under other names.
#[derive(Clone, Debug)]
pub struct Block {
    ln1: LayerNorm,
    attn: MultiheadAttention,
    ln2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    gelu: Gelu,
}

impl Block {
    fn new(cfg: &NextTokenPredictorConfig, vb: VarBuilder) -> Result<Self> {
        let (e, bias, eps) = (cfg.embed_dim, cfg.bias, cfg.layer_norm_eps);
        let attn_cfg = MultiheadAttentionConfig::new(e, cfg.num_heads)
            .with_batch_first(true)
            .with_bias(bias)
            .with_dropout(cfg.dropout);
        Ok(Self {
            ln1: LayerNorm::new_with_bias(e, eps, bias, vb.pp("ln1"))?,
            attn: MultiheadAttention::new(attn_cfg, vb.pp("attn"))?,
            ln2: LayerNorm::new_with_bias(e, eps, bias, vb.pp("ln2"))?,
            fc1: Linear::new(e, cfg.ff_dim, bias, vb.pp("mlp").pp("fc1"))?,
            fc2: Linear::new(cfg.ff_dim, e, bias, vb.pp("mlp").pp("fc2"))?,
            gelu: cfg.gelu,
        })
    }

    /// The MLP on `h`: `fc2(gelu(fc1(h)))`, two fused ops that keep the hidden activation out
    /// of the autograd graph; with adapters, the layers one by one (`lora`: their dropout's
    /// seed and the batch's first row in training).
    fn mlp(&self, h: &Tensor, lora: Option<(u64, usize)>) -> Result<Tensor> {
        let (fc1, fc2) = (&self.fc1, &self.fc2);
        if fc1.lora().is_none() && fc2.lora().is_none() {
            let (first, second) = ((fc1.weight(), fc1.bias()), (fc2.weight(), fc2.bias()));
            return candle_mha::nn::mlp_with(h, first, second, self.gelu.approximate());
        }
        let pre = crate::models::lora::linear_t(fc1, h, lora, "fc1")?;
        let act = candle_mha::nn::gelu_with(&pre, self.gelu.approximate())?;
        crate::models::lora::linear_t(fc2, &act, lora, "fc2")
    }

    /// The block's attention module.
    pub fn attn(&self) -> &MultiheadAttention {
        &self.attn
    }

    /// `resid`: residual dropout `(p, seed, offset)` in training mode (`offset`: where this
    /// batch's first row starts in the mask's element stream, see `DropoutMask::with_offset`).
    fn forward(
        &self,
        x: &Tensor,
        opts: &AttentionOptions,
        resid: Option<(f64, u64, u64)>,
        lora: Option<(u64, usize)>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        // `x + dropout(branch)`, one op on the CPU.
        let add = |x: &Tensor, branch: &Tensor, label: &str| -> Result<Tensor> {
            match resid {
                Some((p, seed, offset)) if p > 0.0 => {
                    seeded_dropout_add(x, branch, p, derive_seed(seed, label), offset)
                }
                _ => x + branch,
            }
        };
        let h = self.ln1.forward(x)?;
        let attn = self.attn.forward(&h, &h, &h, opts)?;
        let x = add(x, &attn.output, "attn")?;
        let m = self.mlp(&self.ln2.forward(&x)?, lora)?;
        Ok((add(&x, &m, "mlp")?, attn.weights))
    }
}

/// Token embedding + learned positions + causal transformer blocks + LayerNorm + output head.
///
/// PyTorch equivalent: `NextTokenPredictor` in `scripts/reference_model.py`, with the same
/// state_dict names (`token_embedding.weight`, `position_embedding.weight`,
/// `blocks.{i}.attn.in_proj_weight`, …, `ln_f.*`, `head.*`): checkpoints move both ways.
///
/// # Shapes
/// tokens `(N, L)` u32 with `L ≤ max_len`; key padding mask `(N, L)` u8 (1 = padding);
/// logits `(N, L, V)`: position `i` predicts token `i + 1`.
#[derive(Clone, Debug)]
pub struct NextTokenPredictor {
    config: NextTokenPredictorConfig,
    arch: Arch,
    /// The attention implementation of every block (a runtime choice, not saved).
    attention_kernel: AttentionKernel,
}

/// The layers of a [`NextTokenPredictor`]: GPT blocks, or a Llama-family model.
#[derive(Clone, Debug)]
enum Arch {
    Gpt(Gpt),
    Llama(Box<Llama>),
}

/// The GPT layers.
#[derive(Clone, Debug)]
struct Gpt {
    token_embedding: Embedding,
    position_embedding: Embedding,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    head: Linear,
}

impl NextTokenPredictor {
    /// Builds the model under `vb` (PyTorch's initialisation for new parameters).
    pub fn new(config: NextTokenPredictorConfig, vb: VarBuilder) -> Result<Self> {
        config.validate()?;
        if let Some(llama) = config.llama_config()? {
            return Ok(Self {
                arch: Arch::Llama(Box::new(Llama::new(llama, vb)?)),
                config,
                attention_kernel: AttentionKernel::Auto,
            });
        }
        let (v, e) = (config.vocab_size, config.embed_dim);
        let blocks = (0..config.num_layers)
            .map(|i| Block::new(&config, vb.pp("blocks").pp(i)))
            .collect::<Result<Vec<_>>>()?;
        let token_embedding = Embedding::new(v, e, vb.pp("token_embedding"))?;
        // Tied: the head's weight is the embedding's tensor itself, so autograd adds the
        // gradients of both uses into the one parameter (PyTorch's `lm_head.weight = wte.weight`).
        let head = match config.tie_embeddings {
            true => Linear::from_weights(token_embedding.weight().clone(), None),
            false => Linear::new(e, v, config.head_has_bias(), vb.pp("head"))?,
        };
        let gpt = Gpt {
            token_embedding,
            position_embedding: Embedding::new(config.max_len, e, vb.pp("position_embedding"))?,
            blocks,
            ln_f: LayerNorm::new_with_bias(e, config.layer_norm_eps, config.bias, vb.pp("ln_f"))?,
            head,
        };
        Ok(Self {
            arch: Arch::Gpt(gpt),
            config,
            attention_kernel: AttentionKernel::Auto,
        })
    }

    /// The same model with every block's attention computed by `kernel` (default
    /// [`AttentionKernel::Auto`]): to compare the fused kernel with the reference on a whole
    /// model. Not in PyTorch (its `sdpa_kernel` context plays this role).
    pub fn with_attention_kernel(mut self, kernel: AttentionKernel) -> Self {
        self.attention_kernel = kernel;
        self
    }

    /// The attention implementation the blocks use.
    pub fn attention_kernel(&self) -> AttentionKernel {
        self.attention_kernel
    }

    /// The configuration.
    pub fn config(&self) -> &NextTokenPredictorConfig {
        &self.config
    }

    /// The GPT blocks (none for a Llama-family model: see [`llama`](Self::llama)).
    pub fn blocks(&self) -> &[Block] {
        match &self.arch {
            Arch::Gpt(g) => &g.blocks,
            Arch::Llama(_) => &[],
        }
    }

    /// Each GPT block's self-attention, in order (what a [`candle_mha::StackKvCache`] caches).
    pub fn attentions(&self) -> Vec<&MultiheadAttention> {
        self.blocks().iter().map(Block::attn).collect()
    }

    /// The Llama-family model, when the configuration is one.
    pub fn llama(&self) -> Option<&Llama> {
        match &self.arch {
            Arch::Llama(m) => Some(m),
            Arch::Gpt(_) => None,
        }
    }

    /// The output head (the token embedding itself when tied).
    pub fn head(&self) -> &Linear {
        match &self.arch {
            Arch::Gpt(g) => &g.head,
            Arch::Llama(m) => m.lm_head(),
        }
    }

    /// The device of the weights.
    pub fn device(&self) -> candle::Device {
        self.head().weight().device().clone()
    }

    fn gpt(&self) -> Result<&Gpt> {
        match &self.arch {
            Arch::Gpt(g) => Ok(g),
            Arch::Llama(_) => candle::bail!("a Llama-family model has no GPT blocks"),
        }
    }

    fn check_tokens(&self, tokens: &Tensor, kpm: Option<&Tensor>) -> Result<(usize, usize)> {
        let (n, l) = match tokens.dims() {
            [n, l] => (*n, *l),
            d => candle::bail!("tokens must be (N, L), got shape {d:?}"),
        };
        if !matches!(tokens.dtype(), DType::U32 | DType::I64) {
            candle::bail!(
                "tokens must be u32 or i64 ids, got dtype {:?}",
                tokens.dtype()
            )
        }
        if l > self.config.max_len {
            candle::bail!(
                "sequence of length {l} is longer than the model's context (max_len = {})",
                self.config.max_len
            )
        }
        if tokens.elem_count() > 0 {
            let max = tokens
                .flatten_all()?
                .to_dtype(DType::I64)?
                .max(0)?
                .to_scalar::<i64>()?;
            let min = tokens
                .flatten_all()?
                .to_dtype(DType::I64)?
                .min(0)?
                .to_scalar::<i64>()?;
            if min < 0 || max as usize >= self.config.vocab_size {
                candle::bail!(
                    "token ids must be in [0, {}), got ids from {min} to {max}",
                    self.config.vocab_size
                )
            }
        }
        if let Some(m) = kpm {
            if m.dims() != [n, l] {
                candle::bail!(
                    "key_padding_mask must be {:?} like the tokens, got {:?}",
                    [n, l],
                    m.dims()
                )
            }
        }
        Ok((n, l))
    }

    /// The final hidden states `(N, L, E)` (after `ln_f`, before the head) and the attention
    /// weights when asked for. `graph: false` detaches each block's output: no gradient flows
    /// back, and each block's activations are freed once the next block has run instead of
    /// being held by the autograd graph until the result is dropped (evaluation).
    fn hidden(
        &self,
        tokens: &Tensor,
        kpm: Option<&Tensor>,
        dropout: Option<(u64, usize)>,
        need_weights: bool,
        graph: bool,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let cut = |t: Tensor| if graph { t } else { t.detach() };
        let (_, l) = self.check_tokens(tokens, kpm)?;
        let g = match &self.arch {
            Arch::Gpt(g) => g,
            Arch::Llama(m) => {
                if need_weights {
                    let (h, w) = m.hidden_with_weights(tokens)?;
                    return Ok((h, w));
                }
                // Llama-family models train without dropout (their attention_dropout is 0); a
                // LoRA adapter's dropout is drawn from the step's seed.
                let train = dropout.map(|(seed, row)| (derive_seed(seed, "lora"), row));
                return Ok((cut(m.hidden_train(tokens, kpm, graph, train)?), Vec::new()));
            }
        };
        let dropout_seed = dropout.map(|(seed, _)| seed);
        let first_row = dropout.map_or(0, |(_, row)| row);
        // The (N, L, E) dropouts of rows first_row.. of a larger batch.
        let offset = (first_row * l * self.config.embed_dim) as u64;
        let dev = tokens.device();
        let positions = Tensor::arange(0u32, l as u32, dev)?;
        // One op for both lookups and their sum (one autograd node instead of six).
        let mut x = candle_mha::nn::embedding_sum(
            &g.token_embedding,
            tokens,
            &g.position_embedding,
            &positions,
        )?;
        let p = self.config.resid_dropout;
        let pe = self.config.embed_dropout.unwrap_or(p);
        if let (Some(seed), true) = (dropout_seed, pe > 0.0) {
            x = seeded_dropout_at(&x, pe, derive_seed(seed, "embedding"), offset)?;
        }
        x = cut(x);
        let mut weights = Vec::new();
        for (i, block) in g.blocks.iter().enumerate() {
            // `is_causal` without a mask: the module builds the causal mask where it needs one
            // and the fused kernel skips the key tiles above the diagonal.
            let mut opts = AttentionOptions::new()
                .with_is_causal(true)
                .with_need_weights(need_weights)
                .with_average_attn_weights(false)
                .with_kernel(self.attention_kernel);
            if let Some(m) = kpm {
                opts = opts.with_key_padding_mask(m.clone());
            }
            if let Some(seed) = dropout_seed {
                // Each layer's mask comes from (seed, layer): resumable exactly.
                opts = opts
                    .with_train(true)
                    .with_dropout_seed(derive_seed(seed, &i.to_string()))
                    .with_dropout_first_row(first_row);
            }
            let resid = dropout_seed.map(|s| (p, derive_seed(s, &format!("resid/{i}")), offset));
            let lora = dropout.map(|(s, row)| (derive_seed(s, &format!("lora/{i}")), row));
            let (y, w) = block.forward(&x, &opts, resid, lora)?;
            x = cut(y);
            weights.extend(w);
        }
        Ok((cut(g.ln_f.forward(&x)?), weights))
    }

    /// Logits `(N, L, V)` in evaluation mode.
    ///
    /// PyTorch equivalent: `model.eval(); model(tokens, key_padding_mask)`.
    pub fn forward(&self, tokens: &Tensor, kpm: Option<&Tensor>) -> Result<Tensor> {
        self.head()
            .forward(&self.hidden(tokens, kpm, None, false, true)?.0)
    }

    /// Logits in training mode: attention dropout drawn from `dropout_seed`.
    ///
    /// PyTorch equivalent: `model.train(); model(tokens, key_padding_mask)`.
    pub fn forward_train(
        &self,
        tokens: &Tensor,
        kpm: Option<&Tensor>,
        dropout_seed: u64,
    ) -> Result<Tensor> {
        self.forward_train_rows(tokens, kpm, dropout_seed, 0)
    }

    /// [`forward_train`](Self::forward_train) on rows `first_row..` of a larger batch: every
    /// dropout mask (attention, embeddings, residual stream) is that batch's for these rows,
    /// so parts of a batch computed apart (data-parallel ranks) drop what the whole batch does,
    /// as long as they have its sequence length.
    ///
    /// PyTorch equivalent: none (PyTorch's dropout draws from a generator's state).
    pub fn forward_train_rows(
        &self,
        tokens: &Tensor,
        kpm: Option<&Tensor>,
        dropout_seed: u64,
        first_row: usize,
    ) -> Result<Tensor> {
        self.head().forward(
            &self
                .hidden(tokens, kpm, Some((dropout_seed, first_row)), false, true)?
                .0,
        )
    }

    /// The training loss of rows `first_row..` of a batch: [`masked_cross_entropy`] of
    /// [`forward_train_rows`](Self::forward_train_rows)' logits, with the output head and the
    /// loss as one op on the CPU in f32/f64 (the `(N, L, V)` logits never become a tensor:
    /// three buffers as large as them fewer per step, see `nn/linear_cross_entropy.rs`). The
    /// same value, and for `loss.backward()` the same gradients, bit for bit; what
    /// `Trainer` trains with.
    ///
    /// PyTorch equivalent: `model.train(); F.cross_entropy(model(tokens, kpm)[mask],
    /// targets[mask])`.
    ///
    /// # Shapes
    /// - `tokens`, `kpm`, `targets`, `mask`: `(N, L)`; result: a scalar.
    pub fn train_loss(
        &self,
        tokens: &Tensor,
        kpm: Option<&Tensor>,
        (dropout_seed, first_row): (u64, usize),
        targets: &Tensor,
        mask: &Tensor,
    ) -> Result<Tensor> {
        let (n, l) = self.check_tokens(tokens, kpm)?;
        check_loss_args((n, l), targets, mask)?;
        let (hidden, _) = self.hidden(tokens, kpm, Some((dropout_seed, first_row)), false, true)?;
        candle_mha::nn::linear_cross_entropy(
            &hidden,
            self.head().weight(),
            self.head().bias(),
            &targets.reshape(n * l)?,
            &mask.reshape(n * l)?,
        )
    }

    /// The summed cross-entropy (nats) and the number of correct argmax predictions over the
    /// positions `mask` counts, in evaluation mode. The output head runs on blocks of rows, so
    /// the `(N, L, V)` logits never exist at once: about [`EVAL_LOGITS`] of them at a time
    /// (evaluating GPT-2's 50,257 ids on 4 × 1024 tokens held 823 MB of logits).
    ///
    /// PyTorch equivalent: `model.eval(); logits = model(tokens, kpm);
    /// (F.cross_entropy(logits[mask], targets[mask], reduction="sum"),
    /// (logits.argmax(-1) == targets)[mask].sum())`.
    ///
    /// # Shapes
    /// - `tokens`, `kpm`, `targets`, `mask`: `(N, L)`.
    pub fn eval_sums(
        &self,
        tokens: &Tensor,
        kpm: Option<&Tensor>,
        targets: &Tensor,
        mask: &Tensor,
    ) -> Result<(f64, f64)> {
        let (n, l) = self.check_tokens(tokens, kpm)?;
        check_loss_args((n, l), targets, mask)?;
        let (hidden, _) = self.hidden(tokens, kpm, None, false, false)?;
        let rows = n * l;
        let hidden = hidden.reshape((rows, self.config.embed_dim))?;
        let counted = mask.reshape(rows)?.ne(0u8)?;
        let targets = targets.reshape(rows)?;
        let block = (EVAL_LOGITS / self.config.vocab_size).clamp(1, rows.max(1));
        let (mut loss, mut correct) = (0f64, 0f64);
        for r0 in (0..rows).step_by(block) {
            let len = block.min(rows - r0);
            let m = counted.narrow(0, r0, len)?;
            let count = m.to_dtype(DType::F64)?.sum_all()?.to_scalar::<f64>()?;
            if count == 0.0 {
                continue;
            }
            let t = targets.narrow(0, r0, len)?;
            let logits = self.head().forward(&hidden.narrow(0, r0, len)?)?;
            let mean = candle_mha::nn::cross_entropy_rows(&logits, &t, &m)?;
            loss += mean.to_dtype(DType::F64)?.to_scalar::<f64>()? * count;
            let hits = logits.argmax(D::Minus1)?.eq(&t)?.mul(&m)?;
            correct += hits.to_dtype(DType::F64)?.sum_all()?.to_scalar::<f64>()?;
        }
        Ok((loss, correct))
    }

    /// Logits and every layer's per-head attention weights `(N, H, L, L)`, in evaluation mode.
    pub fn forward_with_attention(
        &self,
        tokens: &Tensor,
        kpm: Option<&Tensor>,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let (hidden, weights) = self.hidden(tokens, kpm, None, true, true)?;
        Ok((self.head().forward(&hidden)?, weights))
    }
}

/// Logits [`NextTokenPredictor::eval_sums`] computes at a time (64 MiB in f32).
pub const EVAL_LOGITS: usize = 1 << 24;

/// Mean cross-entropy of `logits (N, L, V)` against `targets (N, L)` over the positions where
/// `mask (N, L)` (u8) is nonzero. Errors if no position counts or a counted target is outside
/// `[0, V)`; positions that do not count may hold any target (padding).
///
/// PyTorch equivalent: `F.cross_entropy(logits[mask], targets[mask])`.
pub fn masked_cross_entropy(logits: &Tensor, targets: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let (n, l, _) = logits.dims3()?;
    check_loss_args((n, l), targets, mask)?;
    // The logits go in as they are: a reshape would be one more autograd node (a zero tensor
    // and a sum as large as the logits in the backward pass).
    candle_mha::nn::cross_entropy_rows(logits, &targets.reshape(n * l)?, &mask.reshape(n * l)?)
}

/// `targets` and `mask` must be `(N, L)`.
fn check_loss_args((n, l): (usize, usize), targets: &Tensor, mask: &Tensor) -> Result<()> {
    if targets.dims() != [n, l] || mask.dims() != [n, l] {
        candle::bail!(
            "targets {:?} and mask {:?} must be (N, L) = {:?}",
            targets.dims(),
            mask.dims(),
            [n, l]
        )
    }
    Ok(())
}
