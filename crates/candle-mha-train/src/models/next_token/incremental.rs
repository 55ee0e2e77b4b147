//! Incremental decoding of [`NextTokenPredictor`]: only the new positions go through the
//! model; each block's attention reads the earlier keys and values from a [`StackKvCache`].

use candle::{Module, Result, Tensor};

use super::{Block, NextTokenPredictor};
use candle_mha::attention::{IncrementalOptions, KvCache};
use candle_mha::StackKvCache;

impl Block {
    /// [`Block::forward`] in evaluation mode for the new positions `x (N, T, E)`, attending
    /// over `cache` (which it extends by `T` columns).
    fn forward_incremental(
        &self,
        x: &Tensor,
        cache: &mut KvCache,
        opts: &IncrementalOptions,
    ) -> Result<Tensor> {
        let h = self.ln1.forward(x)?;
        let attn = self.attn.forward_incremental(&h, cache, opts)?;
        let x = (x + attn.output)?;
        let (fc1, h) = (&self.fc1, self.ln2.forward(&x)?);
        let approximate = self.gelu.approximate();
        let h = candle_mha::nn::linear_gelu_with(&h, fc1.weight(), fc1.bias(), approximate)?;
        x + self.fc2.forward(&h)?
    }
}

impl NextTokenPredictor {
    /// An empty [`StackKvCache`] for `batch_size` rows, with room for `max_len` columns.
    ///
    /// PyTorch equivalent: `past_key_values = None`.
    pub fn new_cache(&self, batch_size: usize) -> Result<StackKvCache> {
        StackKvCache::with_capacity(&self.attentions(), batch_size, self.config.max_len)
    }

    /// Logits `(N, T, V)` of the new tokens `tokens_new (N, T)` (u32 or i64) given the
    /// `cache.len()` earlier columns in `cache`, which it extends by `T` columns, in
    /// evaluation mode (no dropout).
    ///
    /// Feeding a sequence in blocks of any sizes gives, position by position, the logits
    /// that [`forward`](Self::forward) gives on the whole sequence (causal within each block
    /// and over every cached column). `key_padding_mask_new (N, T)` (u8, 1 = padding) marks
    /// padding among the new columns; earlier columns keep the padding they were given.
    /// Positions continue from the cache: column `c` of row `r` has position
    /// `c - cache.left_padding()[r]` (see [`StackKvCache`]).
    ///
    /// Errors (the cache is left unchanged): tokens not `(N, T)` with `T ≥ 1` or ids outside
    /// `[0, V)`; a mask not `(N, T)`; a cache of another layer count or batch size; a real
    /// position at or past `max_len` (learned positions end there: to go on, start a new cache
    /// from the last `max_len` tokens, as [`generate`](crate::models::generate) does).
    ///
    /// PyTorch equivalent: Hugging Face's `model(input_ids_new, past_key_values=cache,
    /// attention_mask=..., position_ids=..., use_cache=True)`.
    pub fn forward_incremental(
        &self,
        tokens_new: &Tensor,
        cache: &mut StackKvCache,
        key_padding_mask_new: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (n, t) = self.check_tokens(tokens_new, key_padding_mask_new)?;
        if self.has_lora() {
            candle::bail!(
                "forward_incremental: this model has LoRA adapters; decode with `merged()`"
            )
        }
        let g = self.gpt()?;
        if t == 0 {
            candle::bail!("forward_incremental: tokens_new must hold at least one column, got (N, T) = ({n}, 0)")
        }
        if cache.num_layers() != g.blocks.len() {
            candle::bail!(
                "forward_incremental: the cache has {} layers, the model {}; expected a cache \
                 from this model's new_cache",
                cache.num_layers(),
                g.blocks.len()
            )
        }
        if cache.batch_size() != n {
            candle::bail!(
                "forward_incremental: the cache holds {} rows but tokens_new is {:?}; the batch \
                 size cannot change mid-way (start a new cache)",
                cache.batch_size(),
                tokens_new.dims()
            )
        }
        let start = cache.len();
        let max_len = self.config.max_len;
        let mut positions = Vec::with_capacity(n * t);
        for (r, &pad) in cache.left_padding().iter().enumerate() {
            for c in start..start + t {
                // Columns before a row's left padding ends are padding: any position will do.
                let p = c.saturating_sub(pad);
                if p >= max_len {
                    candle::bail!(
                        "forward_incremental: row {r} reaches position {p}, past the model's \
                         context (max_len = {max_len}); recompute a new cache from the last \
                         {max_len} tokens"
                    )
                }
                positions.push(p as u32);
            }
        }
        let dev = tokens_new.device();
        let positions = Tensor::from_vec(positions, (n, t), dev)?;
        let x = g.token_embedding.forward(tokens_new)?;
        let mut x = (x + g.position_embedding.forward(&positions)?)?;
        let mut opts = IncrementalOptions::new().with_kernel(self.attention_kernel);
        if let Some(m) = key_padding_mask_new {
            opts = opts.with_key_padding_mask(m.clone());
        }
        for (block, layer_cache) in g.blocks.iter().zip(cache.layers_mut()) {
            x = block.forward_incremental(&x, layer_cache, &opts)?;
        }
        g.head.forward(&g.ln_f.forward(&x)?)
    }
}
