//! [`generate`]: greedy or top-k sampling from a [`NextTokenPredictor`].

use candle::{DType, Result, Tensor, D};
use rand::Rng;

use super::NextTokenPredictor;
use crate::rng::rng_from_seed;

/// How to continue a prompt.
///
/// PyTorch equivalent: the arguments of a `generate()` loop (nanoGPT's `max_new_tokens`,
/// `temperature`, `top_k`).
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateConfig {
    /// Tokens to add at most. Default 20.
    pub max_new_tokens: usize,
    /// Sample among the `k` most likely tokens; `None` = greedy (argmax). Default `None`.
    pub top_k: Option<usize>,
    /// Softmax temperature for sampling. Default 1.0.
    pub temperature: f64,
    /// Seed of the sampler. Default 0.
    pub seed: u64,
    /// Stop after producing this id (end of sequence). Default `None`.
    pub eos_id: Option<u32>,
}

impl Default for GenerateConfig {
    fn default() -> Self {
        Self {
            max_new_tokens: 20,
            top_k: None,
            temperature: 1.0,
            seed: 0,
            eos_id: None,
        }
    }
}

/// The ids that follow `prompt` (the prompt not included). The context is the last
/// `max_len` ids.
///
/// PyTorch equivalent: `for _ in range(n): logits = model(idx[:, -max_len:])[:, -1];
/// idx = cat(idx, argmax or multinomial(softmax(topk(logits / T))))`.
pub fn generate(
    model: &NextTokenPredictor,
    prompt: &[u32],
    cfg: &GenerateConfig,
) -> Result<Vec<u32>> {
    if prompt.is_empty() {
        candle::bail!("the prompt is empty: give at least one token")
    }
    if cfg.top_k == Some(0) {
        candle::bail!("top_k must be at least 1 (None: greedy), got 0")
    }
    if !(cfg.temperature > 0.0 && cfg.temperature.is_finite()) {
        candle::bail!(
            "temperature must be positive and finite, got {}",
            cfg.temperature
        )
    }
    let device = model
        .blocks()
        .first()
        .map(|b| b.attn().out_proj().weight().device().clone())
        .unwrap_or(candle::Device::Cpu);
    let max_len = model.config().max_len;
    let mut ids = prompt.to_vec();
    let mut out = Vec::new();
    let mut rng = rng_from_seed(cfg.seed);
    for _ in 0..cfg.max_new_tokens {
        let ctx = &ids[ids.len().saturating_sub(max_len)..];
        let input = Tensor::new(ctx, &device)?.unsqueeze(0)?;
        let logits = model
            .forward(&input, None)?
            .get(0)?
            .get(ctx.len() - 1)?
            .to_dtype(DType::F64)?;
        let next = match cfg.top_k {
            None => logits.argmax(D::Minus1)?.to_scalar::<u32>()?,
            Some(k) => {
                let mut scored: Vec<(usize, f64)> =
                    logits.to_vec1::<f64>()?.into_iter().enumerate().collect();
                scored.sort_by(|a, b| b.1.total_cmp(&a.1));
                scored.truncate(k);
                let top = scored[0].1;
                let weights: Vec<f64> = scored
                    .iter()
                    .map(|(_, l)| ((l - top) / cfg.temperature).exp())
                    .collect();
                let mut r = rng.random::<f64>() * weights.iter().sum::<f64>();
                let mut pick = scored[scored.len() - 1].0;
                for ((id, _), w) in scored.iter().zip(&weights) {
                    if r < *w {
                        pick = *id;
                        break;
                    }
                    r -= w;
                }
                pick as u32
            }
        };
        ids.push(next);
        out.push(next);
        if Some(next) == cfg.eos_id {
            break;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use candle::{DType, Device};

    use super::*;
    use crate::models::NextTokenPredictorConfig;

    #[test]
    fn bad_settings_are_errors_naming_them() -> Result<()> {
        let varmap = candle_nn::VarMap::new();
        let vb = crate::seeded_var_builder(&varmap, 0, DType::F32, &Device::Cpu);
        let model = NextTokenPredictor::new(NextTokenPredictorConfig::new(5), vb)?;
        for (cfg, message) in [
            (
                GenerateConfig {
                    top_k: Some(0),
                    ..Default::default()
                },
                "top_k must be at least 1 (None: greedy), got 0",
            ),
            (
                GenerateConfig {
                    top_k: Some(2),
                    temperature: 0.0,
                    ..Default::default()
                },
                "temperature must be positive and finite, got 0",
            ),
            (
                GenerateConfig {
                    temperature: f64::NAN,
                    ..Default::default()
                },
                "temperature must be positive and finite, got NaN",
            ),
        ] {
            let e = generate(&model, &[1, 2], &cfg).unwrap_err().to_string();
            assert!(e.contains(message), "{e}");
        }
        let e = generate(&model, &[], &GenerateConfig::default()).unwrap_err();
        assert!(e.to_string().contains("the prompt is empty"), "{e}");
        // Greedy with the defaults runs: the new ids only (no end-of-sequence id to stop at).
        assert_eq!(
            generate(&model, &[1, 2], &GenerateConfig::default())?.len(),
            20
        );
        Ok(())
    }
}
