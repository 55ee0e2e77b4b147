//! [`generate_batch`]: several prompts of different lengths continued at once, left-padded
//! into one key/value cache, each row giving the tokens its single-prompt call gives.

use candle::{DType, Result, Tensor};

use super::{generate, in_context, last_logits, model_device, sample_next, GenerateConfig};
use crate::models::NextTokenPredictor;
use candle_mha::rng::rng_from_seed;
use candle_mha::StackKvCache;

/// One prompt's progress.
struct Row {
    ids: Vec<u32>,
    out: Vec<u32>,
    rng: rand_chacha::ChaCha8Rng,
    done: bool,
}

/// The rows decoding together through one cache, and that cache.
struct Group {
    rows: Vec<usize>,
    cache: StackKvCache,
}

/// The continuation of each of `prompts` (prompt not included), as [`generate`] gives it for
/// that prompt alone with the same `cfg`: row `r` samples with its own generator seeded by
/// `cfg.seed`, as a single call would (so equal prompts give equal continuations; vary the
/// seed per call for different ones).
///
/// With `cfg.kv_cache`, the prompts are left-padded to the longest and run through one
/// [`StackKvCache`] (key padding mask over the padding; each row's positions start at its
/// first real token, see [`StackKvCache::set_left_padding`]); then every step runs one token
/// per row. A row stops at `cfg.eos_id` or after `max_new_tokens`. When a row outgrows
/// `max_len`, it falls back to truncate-and-recompute from then on (a full forward of its
/// last `max_len` ids per step, as [`generate`] does), and the rows still within `max_len` are
/// prefilled again into a fresh cache without it (also when a row stops early): a cost of
/// one prefill per such event. Without `cfg.kv_cache`, each prompt runs through [`generate`]
/// in turn.
///
/// Errors: an empty prompt (naming its index), settings that [`GenerateConfig::validate`]
/// rejects, ids outside the vocabulary.
///
/// PyTorch equivalent: Hugging Face's `model.generate(input_ids, attention_mask=...)` on a
/// left-padded batch (`tokenizer.padding_side = "left"`).
pub fn generate_batch(
    model: &NextTokenPredictor,
    prompts: &[Vec<u32>],
    cfg: &GenerateConfig,
) -> Result<Vec<Vec<u32>>> {
    in_context(model, cfg, || batch(model, prompts, cfg))
}

fn batch(
    model: &NextTokenPredictor,
    prompts: &[Vec<u32>],
    cfg: &GenerateConfig,
) -> Result<Vec<Vec<u32>>> {
    if let Some(i) = prompts.iter().position(Vec::is_empty) {
        candle::bail!("prompt {i} is empty: give at least one token per prompt")
    }
    cfg.validate()?;
    // Llama-family prompts go one at a time (their cache has no left padding yet): the same
    // tokens as each prompt alone, as for the GPT models.
    if !cfg.kv_cache || prompts.len() <= 1 || model.llama().is_some() {
        return prompts.iter().map(|p| generate(model, p, cfg)).collect();
    }
    let max_len = model.config().max_len;
    let mut rows: Vec<Row> = prompts
        .iter()
        .map(|p| Row {
            ids: p.clone(),
            out: Vec::new(),
            rng: rng_from_seed(cfg.seed),
            done: cfg.max_new_tokens == 0,
        })
        .collect();
    let mut group: Option<Group> = None;
    while rows.iter().any(|r| !r.done) {
        let within: Vec<usize> = (0..rows.len())
            .filter(|&i| !rows[i].done && rows[i].ids.len() <= max_len)
            .collect();
        let mut logits: Vec<(usize, Vec<f64>)> = Vec::new();
        // The cached rows: one token each, or a fresh prefill when the set of rows changed.
        if !within.is_empty() {
            match group.as_mut().filter(|g| g.rows == within) {
                Some(g) => {
                    let last: Vec<u32> = g
                        .rows
                        .iter()
                        .map(|&i| rows[i].ids[rows[i].ids.len() - 1])
                        .collect();
                    let input = Tensor::from_vec(last, (g.rows.len(), 1), &model_device(model))?;
                    let out = model.forward_incremental(&input, &mut g.cache, None)?;
                    logits.extend(g.rows.iter().copied().zip(last_logits(&out)?));
                }
                None => {
                    let (g, out) = prefill(model, &rows, within, cfg)?;
                    logits.extend(g.rows.iter().copied().zip(last_logits(&out)?));
                    group = Some(g);
                }
            }
        } else {
            group = None;
        }
        // Rows past max_len: the last max_len ids from scratch, as `generate` does.
        for (i, row) in rows.iter().enumerate() {
            if !row.done && row.ids.len() > max_len {
                let ctx = &row.ids[row.ids.len() - max_len..];
                let input = Tensor::new(ctx, &model_device(model))?.unsqueeze(0)?;
                let out = model.forward(&input, None)?;
                logits.push((i, last_logits(&out)?.remove(0)));
            }
        }
        for (i, l) in logits {
            let row = &mut rows[i];
            let next = sample_next(&l, cfg, &mut row.rng)?;
            row.ids.push(next);
            row.out.push(next);
            row.done = Some(next) == cfg.eos_id
                || cfg.eos_ids.contains(&next)
                || row.out.len() >= cfg.max_new_tokens;
        }
    }
    Ok(rows.into_iter().map(|r| r.out).collect())
}

/// A fresh cache for `members`, filled with their ids left-padded to the longest (padding id
/// 0, masked), and the logits `(G, L, V)` of that prefill.
fn prefill(
    model: &NextTokenPredictor,
    rows: &[Row],
    members: Vec<usize>,
    cfg: &GenerateConfig,
) -> Result<(Group, Tensor)> {
    let dev = model_device(model);
    let longest = members
        .iter()
        .map(|&i| rows[i].ids.len())
        .max()
        .unwrap_or(1);
    let pads: Vec<usize> = members
        .iter()
        .map(|&i| longest - rows[i].ids.len())
        .collect();
    let (mut tokens, mut mask) = (Vec::new(), Vec::new());
    for (&i, &pad) in members.iter().zip(&pads) {
        tokens.extend(std::iter::repeat_n(0u32, pad).chain(rows[i].ids.iter().copied()));
        mask.extend(std::iter::repeat_n(1u8, pad).chain(std::iter::repeat_n(0u8, longest - pad)));
    }
    let g = members.len();
    let room = (longest + cfg.max_new_tokens).min(model.config().max_len + longest);
    let mut cache = StackKvCache::with_capacity(&model.attentions(), g, room)?;
    cache.set_left_padding(&pads)?;
    let tokens = Tensor::from_vec(tokens, (g, longest), &dev)?;
    // Without padding the mask is left out (the kernels' unmasked causal path).
    let mask = match pads.iter().any(|&p| p > 0) {
        true => Some(Tensor::from_vec(mask, (g, longest), &dev)?.to_dtype(DType::U8)?),
        false => None,
    };
    let logits = model.forward_incremental(&tokens, &mut cache, mask.as_ref())?;
    Ok((
        Group {
            rows: members,
            cache,
        },
        logits,
    ))
}
