//! [`generate`]: greedy decoding or sampling (temperature, top-k, top-p) from a
//! [`NextTokenPredictor`], through its key/value cache; [`generate_stream`]: the same, token by
//! token; [`generate_batch`]: several prompts at once; [`sample_next`]: the choice of one token
//! from its logits.

use candle::{DType, Result, Tensor};
use rand::Rng;

use super::llama::{Llama, LlamaCache};
use super::NextTokenPredictor;
use candle_mha::autocast::{autocast, Precision};
use candle_mha::rng::rng_from_seed;
use candle_mha::StackKvCache;

/// How to continue a prompt.
///
/// PyTorch equivalent: the arguments of Hugging Face's `model.generate(max_new_tokens,
/// do_sample, temperature, top_k, top_p, eos_token_id)` (or nanoGPT's `generate()` loop).
///
/// **Greedy or sampling.** The next token is the most likely one (greedy, argmax) unless
/// [`do_sample`](Self::do_sample) is true or [`top_k`](Self::top_k) or [`top_p`](Self::top_p)
/// is set; then it is drawn at random. Setting `top_k` or `top_p` alone turns sampling on (in
/// Hugging Face they are ignored without `do_sample=True`).
///
/// **Order of operations when sampling** (that of Hugging Face's logits warpers,
/// `TemperatureLogitsWarper`, `TopKLogitsWarper`, `TopPLogitsWarper`):
/// 1. the logits are divided by `temperature`;
/// 2. `top_k`: only the `k` largest are kept (ties broken by the lower id);
/// 3. `top_p`: of the softmax of those, only the smallest set of most likely tokens whose
///    probabilities sum to at least `p` is kept (always at least the most likely token);
/// 4. one token is drawn from the softmax of what is left.
///
/// With neither `top_k` nor `top_p`, sampling draws from the whole distribution.
///
/// Build it with struct-update syntax:
/// `GenerateConfig { top_p: Some(0.9), temperature: 0.8, ..Default::default() }`.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateConfig {
    /// Tokens to add at most. Default 20. HF: `max_new_tokens`.
    pub max_new_tokens: usize,
    /// Sample even without `top_k` or `top_p` (from the whole distribution, after
    /// temperature). Default `false`: greedy unless `top_k` or `top_p` is set. HF: `do_sample`.
    pub do_sample: bool,
    /// Sample among the `k` most likely tokens (at least 1; turns sampling on). Default `None`:
    /// no top-k filtering. HF: `top_k` (HF's default is 50; here off).
    pub top_k: Option<usize>,
    /// Nucleus sampling: sample among the smallest set of most likely tokens whose
    /// probabilities (after temperature and top-k) sum to at least `p`; in (0, 1], 1 keeps all
    /// (turns sampling on). Default `None`: no top-p filtering. HF: `top_p`.
    pub top_p: Option<f64>,
    /// Softmax temperature when sampling (positive, finite; below 1 sharper, above 1 flatter;
    /// ignored when greedy). Default 1.0. HF: `temperature`.
    pub temperature: f64,
    /// Seed of the sampler: a seed gives the same tokens on every run and platform. Default 0.
    /// PyTorch: `torch.manual_seed(seed)` before `generate` (the streams differ).
    pub seed: u64,
    /// Stop after producing this id (end of sequence). Default `None`. HF: `eos_token_id`.
    pub eos_id: Option<u32>,
    /// Stop after producing any of these ids too (a Hugging Face model's
    /// `generation_config.json` may list several). Default none. HF: `eos_token_id` as a list.
    pub eos_ids: Vec<u32>,
    /// Decode through a key/value cache ([`NextTokenPredictor::forward_incremental`]): the
    /// prompt runs through the model once, then one position per new token. `false` runs the
    /// whole context for every token (the path before the cache, for comparison). Both give
    /// the same tokens. Default `true`. HF: `use_cache`.
    pub kv_cache: bool,
    /// The CPU's large products in bf16 with f32 sums ([`candle_mha::autocast`]): each weight
    /// rounded once, so every new token streams half the bytes. Other devices: no effect.
    /// Default `false`. PyTorch: `with torch.autocast("cpu", dtype=torch.bfloat16):` around
    /// `generate`.
    pub autocast_bf16: bool,
}

impl Default for GenerateConfig {
    fn default() -> Self {
        Self {
            max_new_tokens: 20,
            do_sample: false,
            top_k: None,
            top_p: None,
            temperature: 1.0,
            seed: 0,
            eos_id: None,
            eos_ids: Vec::new(),
            kv_cache: true,
            autocast_bf16: false,
        }
    }
}

impl GenerateConfig {
    /// Whether the next token is drawn at random (`do_sample`, `top_k` or `top_p` set) rather
    /// than chosen greedily.
    pub fn samples(&self) -> bool {
        self.do_sample || self.top_k.is_some() || self.top_p.is_some()
    }

    /// Checks the settings; the error names the field and the value: `top_k` at least 1,
    /// `top_p` in (0, 1], `temperature` positive and finite (checked even when greedy).
    pub fn validate(&self) -> Result<()> {
        if self.top_k == Some(0) {
            candle::bail!("top_k must be at least 1 (None: greedy), got 0")
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                candle::bail!("top_p must be in (0, 1] (None: no nucleus filtering), got {p}")
            }
        }
        if !(self.temperature > 0.0 && self.temperature.is_finite()) {
            candle::bail!(
                "temperature must be positive and finite, got {}",
                self.temperature
            )
        }
        Ok(())
    }
}

/// The next token given the logits of the last position: the argmax (the lowest id among
/// equals) when `cfg` is greedy, else a draw after temperature, top-k and top-p (see
/// [`GenerateConfig`]), which takes one number from `rng`. Errors on empty logits or a `cfg`
/// that [`GenerateConfig::validate`] rejects.
///
/// PyTorch equivalent: `logits.argmax(-1)`, or `torch.multinomial(softmax(warpers(logits)),
/// 1)` with Hugging Face's temperature, top-k and top-p warpers.
pub fn sample_next<R: Rng + ?Sized>(
    logits: &[f64],
    cfg: &GenerateConfig,
    rng: &mut R,
) -> Result<u32> {
    cfg.validate()?;
    if logits.is_empty() {
        candle::bail!("sample_next: the logits are empty; expected one per token id")
    }
    if !cfg.samples() {
        let mut best = 0;
        for (i, l) in logits.iter().enumerate() {
            if l.total_cmp(&logits[best]).is_gt() {
                best = i;
            }
        }
        return Ok(best as u32);
    }
    // Most likely first, equal logits the lower id first (a stable sort's order). Only the
    // candidates that top-k and top-p can keep are ever sorted: a 50k vocabulary is selected
    // down (`select_nth_unstable_by`, linear time), not sorted, per token.
    let order = |a: &(usize, f64), b: &(usize, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let mut scored: Vec<(usize, f64)> = logits.iter().copied().enumerate().collect();
    let top = scored.iter().copied().min_by(order).map_or(0.0, |(_, l)| l);
    let weight = |l: f64| ((l - top) / cfg.temperature).exp();
    if let Some(k) = cfg.top_k.filter(|&k| k < scored.len()) {
        scored.select_nth_unstable_by(k - 1, order);
        scored.truncate(k);
    }
    // Unnormalized softmax of logits / temperature (the largest weighs 1).
    let (scored, weights) = match cfg.top_p.filter(|&p| p < 1.0) {
        // Keep a token while the tokens more likely than it sum to less than p (Hugging
        // Face's rule), so the kept ones are the smallest prefix reaching p, at least one.
        Some(p) => nucleus(scored, p, &order, &weight),
        None => {
            scored.sort_unstable_by(order);
            let weights = scored.iter().map(|&(_, l)| weight(l)).collect();
            (scored, weights)
        }
    };
    let mut r = rng.random::<f64>() * weights.iter().sum::<f64>();
    let mut pick = scored[scored.len() - 1].0;
    for ((id, _), w) in scored.iter().zip(&weights) {
        if r < *w {
            pick = *id;
            break;
        }
        r -= w;
    }
    Ok(pick as u32)
}

/// The smallest most-likely-first prefix of `scored` whose weights reach `p` of their total
/// (Hugging Face's top-p rule: a token is kept while those before it sum to less than `p`),
/// with its weights. Sorts only a growing head of the candidates (selected first) until the
/// prefix ends inside it.
#[allow(clippy::type_complexity)]
fn nucleus(
    mut scored: Vec<(usize, f64)>,
    p: f64,
    order: &dyn Fn(&(usize, f64), &(usize, f64)) -> std::cmp::Ordering,
    weight: &dyn Fn(f64) -> f64,
) -> (Vec<(usize, f64)>, Vec<f64>) {
    let total: f64 = scored.iter().map(|&(_, l)| weight(l)).sum();
    let mut head = 256;
    loop {
        let whole = head >= scored.len();
        if whole {
            scored.sort_unstable_by(order);
        } else {
            scored.select_nth_unstable_by(head - 1, order);
            scored[..head].sort_unstable_by(order);
        }
        let mut weights = Vec::new();
        let mut before = 0.0;
        for &(_, l) in &scored[..head.min(scored.len())] {
            if !weights.is_empty() && before / total >= p {
                break;
            }
            let w = weight(l);
            before += w;
            weights.push(w);
        }
        let reached = weights.len() < head || before / total >= p;
        if whole || reached {
            scored.truncate(weights.len());
            return (scored, weights);
        }
        head *= 8;
    }
}

/// The ids that follow `prompt` (the prompt not included). The context is the last
/// `max_len` ids. Each new token comes from [`sample_next`] with one generator seeded by
/// `cfg.seed`. [`generate_stream`] with no callback: see there for the cache.
///
/// PyTorch equivalent: Hugging Face's `model.generate(prompt, max_new_tokens, do_sample,
/// temperature, top_k, top_p, eos_token_id)[len(prompt):]`, or `for _ in range(n): logits =
/// model(idx[:, -max_len:])[:, -1]; idx = cat(idx, argmax or multinomial(softmax(warp(logits))))`.
pub fn generate(
    model: &NextTokenPredictor,
    prompt: &[u32],
    cfg: &GenerateConfig,
) -> Result<Vec<u32>> {
    generate_stream(model, prompt, cfg, |_| Ok(()))
}

/// [`generate`], calling `on_token` with each new id as soon as it is chosen (to print it),
/// and returning them all. An error from `on_token` stops generation and is returned.
///
/// **The cache** (`cfg.kv_cache`, the default): the prompt runs through the model once into
/// a [`StackKvCache`](candle_mha::StackKvCache), then each step runs only the newest
/// token. **Past `max_len`** the learned positions end, so the context must slide: from the
/// step where the sequence outgrows `max_len`, every step recomputes the last `max_len` ids
/// from scratch, exactly as without the cache (a cache cannot slide because every cached key
/// depends on its position). Those steps cost a full forward each, as before the cache;
/// only sequences within `max_len` decode fast. The tokens are the same with and without
/// the cache (up to the rounding of the two computations, which greedy decoding only feels
/// on exact ties).
///
/// PyTorch equivalent: Hugging Face's `model.generate(..., streamer=...)` with
/// `use_cache=True`.
pub fn generate_stream(
    model: &NextTokenPredictor,
    prompt: &[u32],
    cfg: &GenerateConfig,
    on_token: impl FnMut(u32) -> Result<()> + Send,
) -> Result<Vec<u32>> {
    in_context(model, cfg, || stream(model, prompt, cfg, on_token))
}

/// `f` inside candle's CPU thread pool (the calling thread takes part in each parallel op
/// instead of waking the pool and sleeping, which costs a one-token step much of its time on
/// few cores) and under `cfg`'s autocast precision (a thread's setting: set inside the pool).
fn in_context<R: Send>(
    model: &NextTokenPredictor,
    cfg: &GenerateConfig,
    f: impl FnOnce() -> R + Send,
) -> R {
    let precision = match cfg.autocast_bf16 {
        true => Precision::Bf16,
        false => Precision::F32,
    };
    model_device(model).with_context(|| autocast(precision, f))
}

fn stream(
    model: &NextTokenPredictor,
    prompt: &[u32],
    cfg: &GenerateConfig,
    mut on_token: impl FnMut(u32) -> Result<()>,
) -> Result<Vec<u32>> {
    if prompt.is_empty() {
        candle::bail!("the prompt is empty: give at least one token")
    }
    cfg.validate()?;
    if let Some(llama) = model.llama() {
        return llama_stream(llama, prompt, cfg, on_token);
    }
    let device = model_device(model);
    let max_len = model.config().max_len;
    let mut ids = prompt.to_vec();
    let mut out = Vec::new();
    let mut rng = rng_from_seed(cfg.seed);
    let mut cache: Option<StackKvCache> = None;
    for _ in 0..cfg.max_new_tokens {
        let logits = if cfg.kv_cache && ids.len() <= max_len {
            match cache.as_mut() {
                // Prefill: the whole prompt once.
                None => {
                    let room = (prompt.len() + cfg.max_new_tokens).min(max_len);
                    let mut c = StackKvCache::with_capacity(&model.attentions(), 1, room)?;
                    let input = Tensor::new(ids.as_slice(), &device)?.unsqueeze(0)?;
                    let logits = model.forward_incremental(&input, &mut c, None)?;
                    cache = Some(c);
                    logits
                }
                Some(c) => {
                    let input = Tensor::new(&ids[ids.len() - 1..], &device)?.unsqueeze(0)?;
                    model.forward_incremental(&input, c, None)?
                }
            }
        } else {
            // Truncate and recompute (also the path without the cache).
            cache = None;
            let ctx = &ids[ids.len().saturating_sub(max_len)..];
            let input = Tensor::new(ctx, &device)?.unsqueeze(0)?;
            model.forward(&input, None)?
        };
        if take_next(&logits, cfg, &mut rng, (&mut ids, &mut out), &mut on_token)? {
            break;
        }
    }
    Ok(out)
}

/// [`generate_stream`] of a Llama-family model: its cache holds the key/value heads; past
/// `max_position_embeddings` the last ones are recomputed without it, as for the GPT models.
fn llama_stream(
    model: &Llama,
    prompt: &[u32],
    cfg: &GenerateConfig,
    mut on_token: impl FnMut(u32) -> Result<()>,
) -> Result<Vec<u32>> {
    let device = model.device();
    let max_len = model.config().max_position_embeddings;
    let mut ids = prompt.to_vec();
    let mut out = Vec::new();
    let mut rng = rng_from_seed(cfg.seed);
    let mut cache: Option<LlamaCache> = None;
    for _ in 0..cfg.max_new_tokens {
        let logits = if cfg.kv_cache && ids.len() <= max_len {
            let c = cache.get_or_insert_with(|| model.new_cache());
            let fresh = &ids[c.len()..];
            model.forward_cached(&Tensor::new(fresh, &device)?.unsqueeze(0)?, c)?
        } else {
            cache = None;
            let ctx = &ids[ids.len().saturating_sub(max_len)..];
            model.forward(&Tensor::new(ctx, &device)?.unsqueeze(0)?)?
        };
        if take_next(&logits, cfg, &mut rng, (&mut ids, &mut out), &mut on_token)? {
            break;
        }
    }
    Ok(out)
}

/// The next token from the last position of `logits (1, T, V)`: sampled, appended to `ids`
/// and `out`, handed to `on_token`; whether it ends the sequence (an end id).
fn take_next(
    logits: &Tensor,
    cfg: &GenerateConfig,
    rng: &mut rand_chacha::ChaCha8Rng,
    (ids, out): (&mut Vec<u32>, &mut Vec<u32>),
    on_token: &mut impl FnMut(u32) -> Result<()>,
) -> Result<bool> {
    let logits = last_logits(logits)?.remove(0);
    let next = sample_next(&logits, cfg, rng)?;
    ids.push(next);
    out.push(next);
    on_token(next)?;
    Ok(Some(next) == cfg.eos_id || cfg.eos_ids.contains(&next))
}

/// The device of the model's weights.
fn model_device(model: &NextTokenPredictor) -> candle::Device {
    model.device()
}

/// The last position's logits of each row of `logits (N, T, V)`, as f64.
fn last_logits(logits: &Tensor) -> Result<Vec<Vec<f64>>> {
    let (_, t, _) = logits.dims3()?;
    logits
        .narrow(1, t - 1, 1)?
        .squeeze(1)?
        .to_dtype(DType::F64)?
        .to_vec2::<f64>()
}

mod batch;
pub use batch::generate_batch;

#[cfg(test)]
mod tests;
