//! [`BigramBaseline`]: count models of a token stream (unigram and bigram), the yardstick a
//! trained language model has to beat.

use std::collections::HashMap;

use candle::Result;

use super::Evaluation;
use crate::data::Example;

/// The smoothing strengths tried by [`BigramBaseline::evaluate`] (the best is kept).
const BETAS: [f64; 9] = [0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0];

/// Unigram and bigram counts of a token stream.
///
/// The unigram model is add-one smoothed, `Pu(b) = (c(b) + 1) / (N + V)`; the bigram model
/// interpolates towards it, `P(b | a) = (c(a, b) + β Pu(b)) / (c(a) + β)` (Dirichlet
/// smoothing; MacKay & Peto 1995). [`BigramBaseline::evaluate`] reports the β of a fixed grid
/// that scores best on the evaluated tokens themselves, so the bigram baseline is if anything
/// optimistic.
///
/// PyTorch equivalent: none (the count model of Karpathy's makemore, part 1).
#[derive(Clone, Debug, Default)]
pub struct BigramBaseline {
    vocab_size: usize,
    unigram: Vec<u64>,
    total: u64,
    context: Vec<u64>,
    bigram: HashMap<(u32, u32), u64>,
}

/// What [`BigramBaseline::evaluate`] found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BaselineEvaluation {
    /// The unigram model's metrics.
    pub unigram: Evaluation,
    /// The bigram model's metrics at the best β.
    pub bigram: Evaluation,
    /// The chosen smoothing strength β.
    pub beta: f64,
}

impl BigramBaseline {
    /// Empty counts over ids `0..vocab_size`.
    pub fn new(vocab_size: usize) -> Self {
        Self {
            vocab_size,
            unigram: vec![0; vocab_size],
            context: vec![0; vocab_size],
            ..Default::default()
        }
    }

    /// Counts a contiguous piece of the stream (its ids and the pairs inside it). Errors on
    /// an id outside the vocabulary.
    pub fn add(&mut self, ids: &[u32]) -> Result<()> {
        for (i, &b) in ids.iter().enumerate() {
            let bi = b as usize;
            if bi >= self.vocab_size {
                candle::bail!(
                    "id {b} is outside the vocabulary of {} ids",
                    self.vocab_size
                )
            }
            self.unigram[bi] += 1;
            self.total += 1;
            if i > 0 {
                let a = ids[i - 1];
                self.context[a as usize] += 1;
                *self.bigram.entry((a, b)).or_insert(0) += 1;
            }
        }
        Ok(())
    }

    fn p_unigram(&self, b: u32) -> f64 {
        (self.unigram[b as usize] as f64 + 1.0) / (self.total as f64 + self.vocab_size as f64)
    }

    fn p_bigram(&self, a: u32, b: u32, beta: f64) -> f64 {
        let c = self.bigram.get(&(a, b)).copied().unwrap_or(0) as f64;
        (c + beta * self.p_unigram(b)) / (self.context[a as usize] as f64 + beta)
    }

    /// Both models on the targets of `examples` (every token after each one's first, as the
    /// transformer predicts them), with bits per byte when `text_bytes` is given. Errors when
    /// there is no target or an id is outside the vocabulary.
    pub fn evaluate(
        &self,
        examples: &[Example],
        text_bytes: Option<u64>,
    ) -> Result<BaselineEvaluation> {
        let mut pairs = Vec::new();
        for e in examples {
            for w in e.tokens.windows(2) {
                if w.iter().any(|&t| t as usize >= self.vocab_size) {
                    candle::bail!(
                        "id {} is outside the vocabulary of {} ids",
                        w.iter().max().copied().unwrap_or(0),
                        self.vocab_size
                    )
                }
                pairs.push((w[0], w[1]));
            }
        }
        if pairs.is_empty() {
            candle::bail!("the evaluation set has no token to predict")
        }
        let metrics = |nll: f64, hits: usize| {
            let loss = nll / pairs.len() as f64;
            Evaluation {
                loss,
                perplexity: loss.exp(),
                accuracy: hits as f64 / pairs.len() as f64,
                tokens: pairs.len(),
                bits_per_byte: text_bytes
                    .filter(|&b| b > 0)
                    .map(|b| nll / std::f64::consts::LN_2 / b as f64),
            }
        };
        let top_unigram = (0..self.vocab_size as u32)
            .max_by_key(|&b| self.unigram[b as usize])
            .unwrap_or(0);
        let uni_nll: f64 = pairs.iter().map(|&(_, b)| -self.p_unigram(b).ln()).sum();
        let uni_hits = pairs.iter().filter(|&&(_, b)| b == top_unigram).count();
        // The most frequent successor of each context (ties: the smaller id).
        let mut best_next: HashMap<u32, (u64, u32)> = HashMap::new();
        for (&(a, b), &c) in &self.bigram {
            let e = best_next.entry(a).or_insert((c, b));
            if c > e.0 || (c == e.0 && b < e.1) {
                *e = (c, b);
            }
        }
        let bi_hits = pairs
            .iter()
            .filter(|&&(a, b)| best_next.get(&a).map_or(top_unigram, |e| e.1) == b)
            .count();
        let (beta, bi_nll) = BETAS
            .iter()
            .map(|&beta| {
                let nll: f64 = pairs
                    .iter()
                    .map(|&(a, b)| -self.p_bigram(a, b, beta).ln())
                    .sum();
                (beta, nll)
            })
            .min_by(|x, y| x.1.total_cmp(&y.1))
            .expect("the grid is not empty");
        Ok(BaselineEvaluation {
            unigram: metrics(uni_nll, uni_hits),
            bigram: metrics(bi_nll, bi_hits),
            beta,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_give_the_textbook_probabilities() -> Result<()> {
        // Stream 0 1 0 1 0 2 over 3 ids: c(0)=3, c(1)=2, c(2)=1, N=6; pairs (0,1)×2, (1,0)×2,
        // (0,2)×1.
        let mut m = BigramBaseline::new(3);
        m.add(&[0, 1, 0, 1, 0, 2])?;
        assert!((m.p_unigram(0) - 4.0 / 9.0).abs() < 1e-15);
        // P(1 | 0) = (2 + β·3/9) / (3 + β) at β = 3: (2 + 1) / 6 = 0.5.
        assert!((m.p_bigram(0, 1, 3.0) - 0.5).abs() < 1e-15);
        // Probabilities over the vocabulary sum to one for every context.
        for a in 0..3 {
            let s: f64 = (0..3).map(|b| m.p_bigram(a, b, 10.0)).sum();
            assert!((s - 1.0).abs() < 1e-12, "context {a}: {s}");
        }
        let e = m.evaluate(&[Example::full(vec![0, 1, 0])], Some(2))?;
        assert_eq!(e.bigram.tokens, 2);
        // The bigram model predicts "0 → 1" and "1 → 0" better than the unigram model.
        assert!(e.bigram.loss < e.unigram.loss, "{e:?}");
        assert_eq!(e.bigram.accuracy, 1.0);
        assert!(m.add(&[3]).is_err());
        Ok(())
    }
}
