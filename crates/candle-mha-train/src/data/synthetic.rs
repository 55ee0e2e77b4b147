//! Associative recall: the default synthetic task, solvable only by attention.
//!
//! Each example shows a few key–value pairs, then a query key; the model must output the value
//! that was paired with it. Position alone says nothing about the answer, so a model has to look
//! back at the matching key, which is exactly what attention does.

use candle::Result;
use rand::seq::index::sample;
use rand::Rng;

use super::dataset::Dataset;
use super::example::Example;
use super::vocab::{Vocab, BOS_ID};
use candle_mha::rng::{derive_seed, rng_from_seed};

/// The query marker symbol.
const QUERY: &str = "?";
/// The id of the first key in [`AssociativeRecall::vocab`] (after the 4 specials).
const FIRST_KEY_ID: u32 = 4;

/// The associative-recall task:
/// `BOS k_a v_x k_b v_y … ? k_q v_answer`, where the `pairs` keys are distinct, the values are
/// drawn with repetition, `k_q` is one of the keys shown and `v_answer` is its value. Only the
/// final prediction (of `v_answer`) counts in the loss.
///
/// PyTorch equivalent: none (the task of Ba et al. 2016, "Using Fast Weights to Attend to the
/// Recent Past", and of the Zoology/H3 papers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AssociativeRecall {
    /// The number of distinct keys `k0..k{K-1}`.
    pub num_keys: usize,
    /// The number of distinct values `v0..v{V-1}`.
    pub num_values: usize,
    /// The number of key–value pairs shown per example (at most `num_keys`).
    pub pairs: usize,
}

impl Default for AssociativeRecall {
    /// 16 keys, 16 values, 4 pairs.
    fn default() -> Self {
        AssociativeRecall {
            num_keys: 16,
            num_values: 16,
            pairs: 4,
        }
    }
}

impl AssociativeRecall {
    /// Checks the settings: at least one key, one value and one pair, `pairs <= num_keys` (the
    /// keys of an example are distinct) and a vocabulary that fits `u32` ids.
    pub fn validate(&self) -> Result<()> {
        if self.num_keys == 0 || self.num_values == 0 || self.pairs == 0 {
            return Err(candle::Error::Msg(format!(
                "associative recall with num_keys = {}, num_values = {}, pairs = {}; expected \
                 each to be at least 1",
                self.num_keys, self.num_values, self.pairs
            )));
        }
        if self.pairs > self.num_keys {
            return Err(candle::Error::Msg(format!(
                "associative recall with pairs = {} but num_keys = {}; expected pairs <= \
                 num_keys (the keys of an example are distinct)",
                self.pairs, self.num_keys
            )));
        }
        if !self.ids_fit() {
            return Err(candle::Error::Msg(format!(
                "associative recall with num_keys = {} and num_values = {} needs {} ids; \
                 expected at most {}",
                self.num_keys,
                self.num_values,
                self.num_keys as u128 + self.num_values as u128 + 5,
                u32::MAX
            )));
        }
        Ok(())
    }

    /// The task's vocabulary: the 4 specials, then `"k0".."k{K-1}"`, `"v0".."v{V-1}"`, `"?"`.
    pub fn vocab(&self) -> Vocab {
        let keys = (0..self.num_keys).map(|i| format!("k{i}"));
        let values = (0..self.num_values).map(|i| format!("v{i}"));
        let symbols: Vec<String> = keys
            .chain(values)
            .chain(std::iter::once(QUERY.to_string()))
            .collect();
        let refs: Vec<&str> = symbols.iter().map(String::as_str).collect();
        Vocab::from_symbols(&refs)
    }

    /// The number of pairs actually shown: `pairs` capped at `num_keys`.
    fn effective_pairs(&self) -> usize {
        self.pairs.min(self.num_keys)
    }

    /// Tokens per example: `BOS`, `2 * pairs` key–value tokens, `?`, the query key and the
    /// answer (`2 * pairs + 4`; `pairs` capped at `num_keys`).
    pub fn seq_len(&self) -> usize {
        2 * self.effective_pairs() + 4
    }

    /// `n` examples drawn with `seed` (example `i` from `derive_seed(seed, "recall{i}")`, so the
    /// first examples do not depend on `n`). Settings that [`AssociativeRecall::validate`]
    /// rejects never panic: `pairs` is capped at `num_keys`, and with no key, value or pair the
    /// dataset is empty.
    pub fn generate(&self, n: usize, seed: u64) -> Dataset {
        let pairs = self.effective_pairs();
        if pairs == 0 || self.num_values == 0 || !self.ids_fit() {
            return Dataset::default();
        }
        let first_value = FIRST_KEY_ID + self.num_keys as u32;
        let query = first_value + self.num_values as u32;
        let examples = (0..n)
            .map(|i| {
                let mut rng = rng_from_seed(derive_seed(seed, &format!("recall{i}")));
                let keys = sample(&mut rng, self.num_keys, pairs);
                let mut tokens = Vec::with_capacity(2 * pairs + 4);
                tokens.push(BOS_ID);
                let mut values = Vec::with_capacity(pairs);
                for k in keys.iter() {
                    let v = rng.random_range(0..self.num_values);
                    tokens.push(FIRST_KEY_ID + k as u32);
                    tokens.push(first_value + v as u32);
                    values.push(v);
                }
                let q = rng.random_range(0..pairs);
                tokens.push(query);
                tokens.push(FIRST_KEY_ID + keys.index(q) as u32);
                tokens.push(first_value + values[q] as u32);
                let mut loss_mask = vec![false; tokens.len() - 1];
                if let Some(last) = loss_mask.last_mut() {
                    *last = true;
                }
                Example { tokens, loss_mask }
            })
            .collect();
        Dataset { examples }
    }

    /// Whether every id (4 specials, keys, values, `?`) fits in a `u32`.
    fn ids_fit(&self) -> bool {
        self.num_keys as u128 + self.num_values as u128 + 5 <= u128::from(u32::MAX)
    }
}
