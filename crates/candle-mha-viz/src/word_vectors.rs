//! Word vectors and the "classic walkthrough" of self-attention on them: cosine similarity as
//! attention, then scaled dot-product attention `softmax(XXᵀ/√d)·X` — exactly what
//! [`MultiheadAttention`](candle_mha::MultiheadAttention) computes with one head, no bias,
//! `in_proj_weight = [I; I; I]` and `out_proj.weight = I`.
//!
//! [`load_glove`] reads the GloVe text format (e.g. `glove.6B.50d.txt`, or the small file the
//! crate ships in `weights/`, see its README).

use std::collections::HashMap;
use std::io::BufRead;
use std::path::Path;

use candle::{DType, Device, Result, Tensor, D};

/// A vocabulary of words, each with a `D`-dimensional f32 vector, held on the CPU.
///
/// PyTorch equivalent: none in torch itself; torchtext's `GloVe` / gensim's `KeyedVectors`.
#[derive(Clone, Debug)]
pub struct WordVectors {
    words: Vec<String>,
    index: HashMap<String, usize>,
    vectors: Tensor,
}

impl WordVectors {
    /// Builds a vocabulary from `words` and their vectors `(V, D)` (converted to f32 on the
    /// CPU).
    ///
    /// # Errors
    /// `vectors` not 2-D, a row count other than `words.len()`, `D = 0`, or a repeated word.
    pub fn new(words: Vec<String>, vectors: &Tensor) -> Result<Self> {
        let (v, d) = match vectors.dims() {
            &[v, d] => (v, d),
            dims => candle::bail!("WordVectors::new: vectors must be 2-D (V, D), got {dims:?}"),
        };
        if v != words.len() || d == 0 {
            candle::bail!(
                "WordVectors::new: vectors has shape [{v}, {d}] for {} words; expected [{}, D] with D ≥ 1",
                words.len(),
                words.len()
            )
        }
        let mut index = HashMap::with_capacity(v);
        for (i, w) in words.iter().enumerate() {
            if let Some(first) = index.insert(w.clone(), i) {
                candle::bail!("WordVectors::new: word {w:?} appears at rows {first} and {i}; expected each word once")
            }
        }
        let vectors = vectors.to_dtype(DType::F32)?.to_device(&Device::Cpu)?;
        Ok(Self {
            words,
            index,
            vectors,
        })
    }

    /// The words, in file order (row `i` of [`vectors`](Self::vectors) is `words()[i]`).
    pub fn words(&self) -> &[String] {
        &self.words
    }

    /// The number of words `V`.
    pub fn len(&self) -> usize {
        self.words.len()
    }

    /// Whether there are no words (never true for a loaded file).
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// The vector dimension `D`.
    pub fn dim(&self) -> usize {
        self.vectors.dims()[1]
    }

    /// All vectors, `(V, D)` f32 on the CPU.
    ///
    /// PyTorch equivalent: `nn.Embedding.from_pretrained(vectors).weight`.
    pub fn vectors(&self) -> &Tensor {
        &self.vectors
    }

    /// The row of `word`, or `None` when it is not in the vocabulary (lookups are exact: no
    /// lower-casing).
    pub fn index(&self, word: &str) -> Option<usize> {
        self.index.get(word).copied()
    }

    /// The vector of `word`, `(D,)`, or `None` when it is not in the vocabulary.
    pub fn get(&self, word: &str) -> Option<Tensor> {
        self.index(word).and_then(|i| self.vectors.get(i).ok())
    }

    /// The vectors of `words` stacked in order, `(L, D)` (words may repeat).
    ///
    /// PyTorch equivalent: `embedding(torch.tensor([vocab[w] for w in words]))`.
    ///
    /// # Errors
    /// An empty `words`, or words not in the vocabulary (all of them are named).
    pub fn stack(&self, words: &[&str]) -> Result<Tensor> {
        if words.is_empty() {
            candle::bail!("WordVectors::stack: `words` is empty; expected at least one word")
        }
        let mut ids = Vec::with_capacity(words.len());
        let mut unknown = Vec::new();
        for w in words {
            match self.index(w) {
                Some(i) => ids.push(i as u32),
                None => unknown.push(*w),
            }
        }
        if !unknown.is_empty() {
            candle::bail!(
                "WordVectors::stack: {} not in the vocabulary of {} words: {unknown:?}",
                if unknown.len() == 1 { "word" } else { "words" },
                self.len()
            )
        }
        let ids = Tensor::new(ids, &Device::Cpu)?;
        self.vectors.index_select(&ids, 0)
    }
}

/// Loads word vectors in the GloVe text format: one `word v1 … vD` line per word, fields
/// separated by whitespace (so words cannot contain spaces), UTF-8.
///
/// Also accepted: a first line of exactly two positive integers `V D`, the word2vec text
/// format's header (a file whose first word is an integer with a single integer value is read
/// as such a header); the file must then hold exactly `V` words of `D` values. Blank lines are
/// skipped; a leading byte-order mark and `\r\n` line ends are fine.
///
/// PyTorch equivalent: none; torchtext's `GloVe(...)` or gensim's
/// `KeyedVectors.load_word2vec_format(path, no_header=True)`.
///
/// # Errors
/// The file cannot be read, or (with the line number) a row with a different number of values
/// than the first (ragged), a value that is not a finite number, a word seen before, invalid
/// UTF-8, a header that disagrees with the file; or a file with no words.
pub fn load_glove(path: &Path) -> Result<WordVectors> {
    let file = candle_mha::io::open_input(path)
        .map_err(|e| candle::Error::Msg(format!("load_glove: {e}")))?;
    read_glove(std::io::BufReader::new(file), &path.display().to_string())
}

/// [`load_glove`] from any reader; `source` names it in error messages (e.g. a path).
///
/// # Errors
/// As [`load_glove`].
pub fn read_glove<R: BufRead>(reader: R, source: &str) -> Result<WordVectors> {
    let err = |line: usize, msg: String| candle::Error::Msg(format!("{source}:{line}: {msg}"));
    let mut words: Vec<String> = Vec::new();
    let mut first_line: HashMap<String, usize> = HashMap::new();
    let mut data: Vec<f32> = Vec::new();
    let mut dim: Option<usize> = None;
    let mut header: Option<(usize, usize, usize)> = None; // (V, D, line)
    for (i, line) in reader.lines().enumerate() {
        let n = i + 1;
        let line = line.map_err(|e| err(n, format!("cannot read line: {e}")))?;
        let line = if n == 1 {
            line.trim_start_matches('\u{feff}')
        } else {
            &line
        };
        let mut fields = line.split_whitespace();
        let Some(word) = fields.next() else {
            continue;
        };
        let rest: Vec<&str> = fields.collect();
        if words.is_empty() && header.is_none() && dim.is_none() && rest.len() == 1 {
            if let (Ok(v), Ok(d)) = (word.parse::<usize>(), rest[0].parse::<usize>()) {
                if v == 0 || d == 0 {
                    return Err(err(
                        n,
                        format!(
                            "header \"{word} {}\": expected V ≥ 1 words of D ≥ 1 values",
                            rest[0]
                        ),
                    ));
                }
                header = Some((v, d, n));
                dim = Some(d);
                continue;
            }
        }
        let d = *dim.get_or_insert(rest.len());
        if rest.len() != d || d == 0 {
            let why = match header {
                Some((_, hd, hl)) => format!("the header on line {hl} says {hd}"),
                None => "as the first word has".to_string(),
            };
            return Err(err(
                n,
                format!(
                    "word {word:?} has {} values; expected {d} ({why}) — a ragged row",
                    rest.len()
                ),
            ));
        }
        for (k, field) in rest.iter().enumerate() {
            match field.parse::<f32>() {
                Ok(x) if x.is_finite() => data.push(x),
                _ => {
                    return Err(err(
                        n,
                        format!(
                            "value {} of word {word:?} is {field:?}; expected a finite number",
                            k + 1
                        ),
                    ))
                }
            }
        }
        if let Some(prev) = first_line.insert(word.to_string(), n) {
            return Err(err(
                n,
                format!("word {word:?} already appeared on line {prev}; expected each word once"),
            ));
        }
        words.push(word.to_string());
    }
    let (Some(d), false) = (dim, words.is_empty()) else {
        candle::bail!("{source}: no word vectors found; expected lines of the form `word v1 … vD`")
    };
    if let Some((v, _, hl)) = header {
        if v != words.len() {
            candle::bail!(
                "{source}:{hl}: the header says {v} words but the file has {}",
                words.len()
            )
        }
    }
    let vectors = Tensor::from_vec(data, (words.len(), d), &Device::Cpu)?;
    WordVectors::new(words, &vectors)
}

fn check_matrix(func: &str, x: &Tensor) -> Result<(usize, usize)> {
    let (l, d) = match x.dims() {
        &[l, d] => (l, d),
        dims => candle::bail!("{func}: x must be 2-D (L, D), got shape {dims:?}"),
    };
    if l == 0 || d == 0 {
        candle::bail!("{func}: x has shape [{l}, {d}]; expected at least one row and one column")
    }
    if !x.dtype().is_float() {
        candle::bail!(
            "{func}: x has dtype {:?}; expected a float dtype (f16, bf16, f32, f64)",
            x.dtype()
        )
    }
    Ok((l, d))
}

/// Cosine similarity of every pair of rows: `S[i, j] = xᵢ·xⱼ / (‖xᵢ‖‖xⱼ‖)`, `(L, L)`,
/// symmetric with ones on the diagonal. A zero row has no direction: its similarities are 0
/// (its diagonal entry included), not NaN.
///
/// PyTorch equivalent: `F.cosine_similarity(x[:, None], x[None], dim=-1)` (which clamps the
/// norms with `eps` instead).
///
/// # Shapes
/// `x (L, D)`, any float dtype (kept) → `(L, L)`.
///
/// # Errors
/// `x` not 2-D, empty, or not a float dtype.
pub fn cosine_similarity_matrix(x: &Tensor) -> Result<Tensor> {
    check_matrix("cosine_similarity_matrix", x)?;
    let norms = x.sqr()?.sum_keepdim(1)?.sqrt()?; // (L, 1)
                                                  // 1/‖x‖ for non-zero rows, 0 for zero rows: a zero row's similarities become 0.
    let zero = norms.eq(0.0)?;
    let inv = zero.where_cond(&norms.zeros_like()?, &norms.ones_like()?.div(&norms)?)?;
    let unit = x.broadcast_mul(&inv)?;
    unit.matmul(&unit.t()?)
}

/// Cosine similarity used as attention: scores = [`cosine_similarity_matrix`]`(x)`, output =
/// scores·X (no softmax, no normalisation: each output row is the cosine-weighted sum of the
/// input rows). Returns `(output (L, D), scores (L, L))`.
///
/// PyTorch equivalent: `s = F.cosine_similarity(x[:, None], x[None], dim=-1); (s @ x, s)`.
///
/// # Errors
/// As [`cosine_similarity_matrix`].
pub fn cosine_attention(x: &Tensor) -> Result<(Tensor, Tensor)> {
    let scores = cosine_similarity_matrix(x)?;
    Ok((scores.matmul(x)?, scores))
}

/// Scaled dot-product self-attention with Q = K = V = X: weights = softmax(XXᵀ/√d) (row-wise),
/// output = weights·X. Returns `(output (L, d), weights (L, L))`; differentiable (the softmax
/// is `candle_nn::ops::softmax`, built from differentiable ops).
///
/// Equal to [`MultiheadAttention`](candle_mha::MultiheadAttention) with `embed_dim = d`, one head,
/// `bias = false`, `in_proj_weight = [I; I; I]`, `out_proj.weight = I`.
///
/// PyTorch equivalent: `F.scaled_dot_product_attention(x, x, x)` (output) and
/// `torch.softmax(x @ x.T / d**0.5, -1)` (weights).
///
/// # Shapes
/// `x (L, d)`, any float dtype (kept).
///
/// # Errors
/// `x` not 2-D, empty, or not a float dtype.
///
/// ```
/// use candle::{Device, Tensor};
/// use candle_mha_viz::word_vectors::self_attention;
/// # fn main() -> candle::Result<()> {
/// let x = Tensor::new(&[[1f32, 0.], [0., 1.], [1., 1.]], &Device::Cpu)?;
/// let (out, w) = self_attention(&x)?;
/// assert_eq!((out.dims(), w.dims()), (&[3, 2][..], &[3, 3][..]));
/// # Ok(())
/// # }
/// ```
pub fn self_attention(x: &Tensor) -> Result<(Tensor, Tensor)> {
    let (_, d) = check_matrix("self_attention", x)?;
    let scores = (x.matmul(&x.t()?)? / (d as f64).sqrt())?;
    let weights = candle_nn::ops::softmax(&scores, D::Minus1)?;
    Ok((weights.matmul(x)?, weights))
}
