//! [`VocabMatrix`]: which token attends to which, summed over a whole corpus.
//!
//! A single attention matrix is indexed by *position*, and position `i` holds a different token
//! in every sequence, so per-sequence matrices cannot be added up. Re-indexing each weight by
//! the *tokens* at its query and key positions gives a vocabulary × vocabulary matrix that can
//! be accumulated over any number of sequences, batch by batch.

use std::collections::HashMap;
use std::path::Path;

use candle::{DType, Device, IndexOp, Result, Tensor};

use super::escape::csv_field;

use candle_mha::checkpoint::StateDict;

/// A streaming vocabulary × vocabulary attention accumulator.
///
/// For every query position that is not skipped, with token `q`, and every key position `j`
/// of the same sequence, with token `k`, the weight `w` that the query puts on key `j` is added
/// to cell `(q, k)`. Each cell holds:
///
/// - **sum**: the total weight that queries of token `q` put on keys of token `k`. A query that
///   sees `k` at several key positions adds all of them, so this is attention *to the token*,
///   not to one occurrence.
/// - **count**: the number of query positions of token `q` that *looked at* a key of token
///   `k`, i.e. that gave a strictly positive weight to at least one key position holding `k`.
///   A query adds at most 1 to a cell however many occurrences of `k` it sees. Keys hidden by a
///   causal or padding mask get weight exactly 0 after the softmax and are therefore not
///   counted (a visible key whose weight underflows to 0 is not counted either).
///
/// From these, [`mean`](Self::mean) = sum / count is the average weight a query of token `q`
/// puts on token `k` *when `k` is in its view*, and [`row_normalized`](Self::row_normalized)
/// is each query token's share of attention over key tokens.
///
/// The cells are a sparse map, so large vocabularies cost memory only for the pairs seen, and
/// at most [`DEFAULT_MAX_CELLS`] of them ([`with_max_cells`](Self::with_max_cells)): a corpus
/// that would add more is an error naming the count, not an unbounded allocation. The dense
/// exports ([`sum`](Self::sum), [`mean`](Self::mean), …) allocate `V × V` f64s and are refused
/// above [`MAX_DENSE_VOCAB`] ids; [`save_sparse_safetensors`](Self::save_sparse_safetensors)
/// writes the nonzero cells of any vocabulary.
///
/// PyTorch equivalent: none (a `torch.zeros(V, V).index_put_((q_ids, k_ids), w,
/// accumulate=True)` loop over batches).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VocabMatrix {
    vocab_size: usize,
    cells: HashMap<(u32, u32), (f64, u64)>,
    /// Query positions added per query token (the pages sort query tokens by it).
    query_counts: HashMap<u32, u64>,
    num_queries: u64,
    total_mass: f64,
    /// The most cells kept (`None`: [`DEFAULT_MAX_CELLS`]).
    max_cells: Option<usize>,
}

/// The most nonzero cells a [`VocabMatrix`] keeps unless told otherwise (about 1.5 GiB with
/// the exports' copies).
pub const DEFAULT_MAX_CELLS: usize = 1 << 24;

/// The largest vocabulary whose matrices are exported dense (`V × V` f64: 512 MiB each at
/// this size); larger ones are written sparse.
pub const MAX_DENSE_VOCAB: usize = 8192;

/// `t` as a flat vector of ids, checking dtype and range.
fn ids_of(name: &str, t: &Tensor, vocab_size: usize) -> Result<Vec<u32>> {
    let ids: Vec<i64> = match t.dtype() {
        DType::U32 | DType::U8 | DType::I64 => t
            .to_device(&Device::Cpu)?
            .to_dtype(DType::I64)?
            .flatten_all()?
            .to_vec1()?,
        d => candle::bail!("{name} must hold integer token ids (u32 or i64), got dtype {d:?}"),
    };
    ids.iter()
        .enumerate()
        .map(|(pos, &id)| {
            if id < 0 || id as u64 >= vocab_size as u64 {
                candle::bail!(
                    "{name} holds id {id} at flat position {pos}; expected ids in [0, {vocab_size})"
                )
            }
            Ok(id as u32)
        })
        .collect()
}

impl VocabMatrix {
    /// An empty accumulator for ids in `[0, vocab_size)`.
    pub fn new(vocab_size: usize) -> Self {
        Self {
            vocab_size,
            ..Self::default()
        }
    }

    /// The same accumulator keeping at most `max_cells` nonzero cells: an
    /// [`add`](Self::add) that would make more is an error and changes nothing.
    pub fn with_max_cells(mut self, max_cells: usize) -> Self {
        self.max_cells = Some(max_cells);
        self
    }

    /// The number of token ids `V`.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Adds one batch of attention weights.
    ///
    /// Weight `weights[n, i, j]` goes to cell `(query_ids[n, i], key_ids[n, j])`; see the type's
    /// documentation for how `count` is defined. Query positions where `query_mask` is nonzero
    /// (padding) are skipped entirely, whatever their weights (a fully masked row may be NaN).
    /// The batch is checked before anything is added: on error the accumulator is unchanged.
    ///
    /// For self-attention pass the same ids as `query_ids` and `key_ids`.
    ///
    /// # Shapes
    /// `query_ids (N, L)` and `key_ids (N, S)` integer ids (u32 or i64) below `V`;
    /// `weights (N, L, S)` in any float dtype, finite and non-negative on non-skipped rows (one
    /// head, or heads averaged: index or `mean(1)` a `(N, H, L, S)` tensor first);
    /// `query_mask (N, L)`, nonzero = skip.
    pub fn add(
        &mut self,
        query_ids: &Tensor,
        key_ids: &Tensor,
        weights: &Tensor,
        query_mask: Option<&Tensor>,
    ) -> Result<()> {
        let (n, l) = match query_ids.dims() {
            [n, l] => (*n, *l),
            d => candle::bail!("query_ids must be (N, L), got shape {d:?}"),
        };
        let s = match key_ids.dims() {
            [kn, s] if *kn == n => *s,
            d => candle::bail!(
                "key_ids must be (N, S) with N = {n} like query_ids {:?}, got shape {d:?}",
                query_ids.dims()
            ),
        };
        if weights.dims() != [n, l, s] {
            candle::bail!(
                "weights must be (N, L, S) = {:?} from query_ids {:?} and key_ids {:?}, got \
                 shape {:?} (index one head or average a (N, H, L, S) tensor first)",
                [n, l, s],
                query_ids.dims(),
                key_ids.dims(),
                weights.dims()
            )
        }
        if !weights.dtype().is_float() {
            candle::bail!(
                "weights must be a float tensor, got dtype {:?}",
                weights.dtype()
            )
        }
        let skip: Vec<bool> = match query_mask {
            None => vec![false; n * l],
            Some(m) => {
                if m.dims() != [n, l] {
                    candle::bail!(
                        "query_mask must be (N, L) = {:?} like query_ids, got shape {:?}",
                        [n, l],
                        m.dims()
                    )
                }
                m.to_device(&Device::Cpu)?
                    .ne(0.0)?
                    .flatten_all()?
                    .to_vec1::<u8>()?
                    .into_iter()
                    .map(|b| b != 0)
                    .collect()
            }
        };
        let q = ids_of("query_ids", query_ids, self.vocab_size)?;
        let k = ids_of("key_ids", key_ids, self.vocab_size)?;
        let w: Vec<f64> = weights
            .to_device(&Device::Cpu)?
            .to_dtype(DType::F64)?
            .flatten_all()?
            .to_vec1()?;
        for b in 0..n {
            for i in (0..l).filter(|&i| !skip[b * l + i]) {
                let row = &w[(b * l + i) * s..(b * l + i + 1) * s];
                if let Some(j) = row.iter().position(|x| !x.is_finite() || *x < 0.0) {
                    candle::bail!(
                        "weights[{b}, {i}, {j}] = {}; expected finite non-negative weights on \
                         every query that is not skipped (mark padded queries in query_mask)",
                        row[j]
                    )
                }
            }
        }
        // The cells this batch would add, counted before anything changes.
        let limit = self.max_cells.unwrap_or(DEFAULT_MAX_CELLS);
        let mut new_cells = std::collections::HashSet::new();
        for b in 0..n {
            for i in (0..l).filter(|&i| !skip[b * l + i]) {
                let row = &w[(b * l + i) * s..(b * l + i + 1) * s];
                let qi = q[b * l + i];
                for (j, _) in row.iter().enumerate().filter(|(_, x)| **x > 0.0) {
                    let cell = (qi, k[b * s + j]);
                    if !self.cells.contains_key(&cell)
                        && new_cells.insert(cell)
                        && self.cells.len() + new_cells.len() > limit
                    {
                        candle::bail!(
                            "the vocabulary matrix would hold more than {limit} nonzero cells (query × key token pairs seen): aggregate over a smaller corpus, or raise the limit (with_max_cells)"
                        )
                    }
                }
            }
        }
        // Checked: now accumulate. Per query row, merge the key positions by token first so
        // that `count` grows by one per (query position, key token), not per occurrence.
        let mut per_token: HashMap<u32, f64> = HashMap::new();
        for b in 0..n {
            for i in (0..l).filter(|&i| !skip[b * l + i]) {
                per_token.clear();
                let row = &w[(b * l + i) * s..(b * l + i + 1) * s];
                for (j, &x) in row.iter().enumerate() {
                    if x > 0.0 {
                        *per_token.entry(k[b * s + j]).or_insert(0.0) += x;
                    }
                }
                let qi = q[b * l + i];
                for (&kt, &mass) in &per_token {
                    let cell = self.cells.entry((qi, kt)).or_insert((0.0, 0));
                    cell.0 += mass;
                    cell.1 += 1;
                    self.total_mass += mass;
                }
                *self.query_counts.entry(qi).or_insert(0) += 1;
                self.num_queries += 1;
            }
        }
        Ok(())
    }

    /// The number of query positions added (skipped positions excluded).
    pub fn num_queries(&self) -> u64 {
        self.num_queries
    }

    /// The number of query positions of token `query` added (skipped positions excluded); the
    /// per-token parts of [`num_queries`](Self::num_queries).
    pub fn query_count(&self, query: u32) -> u64 {
        self.query_counts.get(&query).copied().unwrap_or(0)
    }

    /// The total weight added: equals [`num_queries`](Self::num_queries) (up to rounding) when
    /// every weight row sums to 1, as softmax rows do.
    pub fn total_mass(&self) -> f64 {
        self.total_mass
    }

    /// The number of nonzero cells.
    pub fn num_cells(&self) -> usize {
        self.cells.len()
    }

    /// `(sum, count)` of cell `(query, key)`; `(0, 0)` for a cell never seen.
    pub fn cell(&self, query: u32, key: u32) -> (f64, u64) {
        self.cells.get(&(query, key)).copied().unwrap_or((0.0, 0))
    }

    /// The cells `((query, key), (sum, count))` sorted by query id, then key id.
    pub fn cells(&self) -> Vec<((u32, u32), (f64, u64))> {
        let mut cells: Vec<_> = self.cells.iter().map(|(k, v)| (*k, *v)).collect();
        cells.sort_by_key(|c| c.0);
        cells
    }

    /// Each query token's total mass (the sum of its row), by query id.
    fn row_totals(&self) -> HashMap<u32, f64> {
        let mut totals = HashMap::new();
        for (&(q, _), &(sum, _)) in &self.cells {
            *totals.entry(q).or_insert(0.0) += sum;
        }
        totals
    }

    /// The share of `query`'s attention that goes to `key`: `sum / row total`, 0 for an empty
    /// row.
    pub fn row_share(&self, query: u32, key: u32) -> f64 {
        let total: f64 = self
            .cells
            .iter()
            .filter(|(&(q, _), _)| q == query)
            .map(|(_, &(s, _))| s)
            .sum();
        let (sum, _) = self.cell(query, key);
        if total > 0.0 {
            sum / total
        } else {
            0.0
        }
    }

    /// A dense `(V, V)` f64 CPU tensor with `f(sum, count, row_total)` in every seen cell and 0
    /// elsewhere.
    fn dense(&self, f: impl Fn(f64, u64, f64) -> f64) -> Result<Tensor> {
        let v = self.vocab_size;
        if v > MAX_DENSE_VOCAB {
            candle::bail!(
                "a dense {v} x {v} matrix of f64 takes {} bytes: vocabularies above {MAX_DENSE_VOCAB} ids are exported sparse (cells(), to_csv(), save_sparse_safetensors())",
                (v as u128) * (v as u128) * 8
            )
        }
        let len = v * v;
        let totals = self.row_totals();
        let mut data = vec![0f64; len];
        for (&(q, k), &(sum, count)) in &self.cells {
            let total = totals.get(&q).copied().unwrap_or(0.0);
            data[q as usize * v + k as usize] = f(sum, count, total);
        }
        Tensor::from_vec(data, (v, v), &Device::Cpu)
    }

    /// The summed weights, dense.
    ///
    /// # Shapes
    /// `(V, V)` f64 on the CPU; row = query token, column = key token.
    pub fn sum(&self) -> Result<Tensor> {
        self.dense(|sum, _, _| sum)
    }

    /// The counts (see the type's documentation), dense.
    ///
    /// # Shapes
    /// `(V, V)` f64 on the CPU.
    pub fn count(&self) -> Result<Tensor> {
        self.dense(|_, count, _| count as f64)
    }

    /// `sum / count`: the average weight a query of token `q` gives token `k` when `k` is in
    /// view; 0 where the count is 0.
    ///
    /// # Shapes
    /// `(V, V)` f64 on the CPU.
    pub fn mean(&self) -> Result<Tensor> {
        self.dense(|sum, count, _| if count > 0 { sum / count as f64 } else { 0.0 })
    }

    /// Each row of [`sum`](Self::sum) divided by its total: rows with any mass sum to 1, the
    /// others stay 0.
    ///
    /// # Shapes
    /// `(V, V)` f64 on the CPU.
    pub fn row_normalized(&self) -> Result<Tensor> {
        self.dense(|sum, _, total| if total > 0.0 { sum / total } else { 0.0 })
    }

    /// For every query token with mass, in id order, its `k` key tokens of largest row share
    /// (largest first; ties by smaller key id). Tokens never seen as queries are left out.
    pub fn top_k(&self, k: usize) -> Vec<(u32, Vec<(u32, f64)>)> {
        let totals = self.row_totals();
        let mut rows: HashMap<u32, Vec<(u32, f64)>> = HashMap::new();
        for (&(q, key), &(sum, _)) in &self.cells {
            let total = totals.get(&q).copied().unwrap_or(0.0);
            if total > 0.0 {
                rows.entry(q).or_default().push((key, sum / total));
            }
        }
        let mut out: Vec<(u32, Vec<(u32, f64)>)> = rows
            .into_iter()
            .map(|(q, mut row)| {
                row.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                row.truncate(k);
                (q, row)
            })
            .collect();
        out.sort_by_key(|r| r.0);
        out
    }

    /// The nonzero cells as CSV, sorted by query id then key id:
    /// `query,key,sum,count,mean,row_share`, one line per cell after the header. Tokens are
    /// written as `labels[id]` (quoted when they hold a comma, quote or line break), or as the
    /// bare id when `labels` is too short. Numbers use Rust's shortest exact form, so they
    /// parse back to the same f64.
    pub fn to_csv(&self, labels: &[String]) -> String {
        let totals = self.row_totals();
        let label = |id: u32| match labels.get(id as usize) {
            Some(l) => csv_field(l),
            None => id.to_string(),
        };
        let mut out = String::from("query,key,sum,count,mean,row_share\n");
        for ((q, k), (sum, count)) in self.cells() {
            let total = totals.get(&q).copied().unwrap_or(0.0);
            let mean = if count > 0 { sum / count as f64 } else { 0.0 };
            let share = if total > 0.0 { sum / total } else { 0.0 };
            out.push_str(&format!(
                "{},{},{sum},{count},{mean},{share}\n",
                label(q),
                label(k)
            ));
        }
        out
    }

    /// The matrix as one self-contained, interactive HTML page: see
    /// [`vocab_matrix_html`](crate::html::vocab_matrix_html), which this calls (same
    /// arguments and errors).
    ///
    /// PyTorch equivalent: none.
    pub fn to_html(
        &self,
        labels: &[String],
        opts: &crate::html::VocabHtmlOptions,
    ) -> Result<String> {
        crate::html::vocab_matrix_html(self, labels, opts)
    }

    /// Writes `sum`, `count`, `mean` and `row_normalized` as dense `(V, V)` f64 tensors to a
    /// safetensors file, atomically, with `vocab_size`, `num_queries` and `total_mass` in the
    /// metadata.
    ///
    /// PyTorch equivalent: `safetensors.torch.save_file({"sum": ..., ...}, path, metadata)`;
    /// read back with `safetensors.torch.load_file(path)`.
    pub fn save_safetensors(&self, path: impl AsRef<Path>) -> Result<()> {
        self.with_metadata(StateDict::from_tensors([
            ("sum".to_string(), self.sum()?),
            ("count".to_string(), self.count()?),
            ("mean".to_string(), self.mean()?),
            ("row_normalized".to_string(), self.row_normalized()?),
        ]))
        .with_metadata(
            "description",
            "vocabulary x vocabulary attention: row = query token, column = key token",
        )
        .save_safetensors(path)
    }

    /// Writes the nonzero cells, in [`cells`](Self::cells)' order, as six 1-D tensors of one
    /// entry per cell to a safetensors file, atomically: `query` and `key` (u32 ids), `sum`,
    /// `count`, `mean` and `row_share` (f64), with the metadata of
    /// [`save_safetensors`](Self::save_safetensors) and `layout: coo`. Any vocabulary size.
    ///
    /// PyTorch equivalent: `torch.sparse_coo_tensor(torch.stack([query, key]), sum, (V, V))`
    /// from the loaded tensors.
    pub fn save_sparse_safetensors(&self, path: impl AsRef<Path>) -> Result<()> {
        let totals = self.row_totals();
        let cells = self.cells();
        let n = cells.len();
        let (mut qs, mut ks) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut sums, mut counts) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut means, mut shares) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for ((q, k), (sum, count)) in cells {
            let total = totals.get(&q).copied().unwrap_or(0.0);
            qs.push(q);
            ks.push(k);
            sums.push(sum);
            counts.push(count as f64);
            means.push(if count > 0 { sum / count as f64 } else { 0.0 });
            shares.push(if total > 0.0 { sum / total } else { 0.0 });
        }
        let dev = &Device::Cpu;
        self.with_metadata(StateDict::from_tensors([
            ("query".to_string(), Tensor::from_vec(qs, n, dev)?),
            ("key".to_string(), Tensor::from_vec(ks, n, dev)?),
            ("sum".to_string(), Tensor::from_vec(sums, n, dev)?),
            ("count".to_string(), Tensor::from_vec(counts, n, dev)?),
            ("mean".to_string(), Tensor::from_vec(means, n, dev)?),
            ("row_share".to_string(), Tensor::from_vec(shares, n, dev)?),
        ]))
        .with_metadata("layout", "coo")
        .with_metadata(
            "description",
            "vocabulary x vocabulary attention, nonzero cells: query token, key token and their values",
        )
        .save_safetensors(path)
    }

    fn with_metadata(&self, sd: StateDict) -> StateDict {
        sd.with_metadata("vocab_size", &self.vocab_size.to_string())
            .with_metadata("num_queries", &self.num_queries.to_string())
            .with_metadata("total_mass", &self.total_mass.to_string())
    }
}

/// The vocabulary × vocabulary matrix of `layer`'s attention over a corpus, one batch in
/// memory at a time.
///
/// `batches` yields `(ids, key_padding_mask)`: token ids `u32` `(N, L)` and PyTorch's key
/// padding mask `u8` `(N, L)` (nonzero = padding). `attention(ids, key_padding_mask)` runs the
/// model in evaluation mode and returns each layer's weights, `(N, H, L, L)`; for the train
/// crate's `NextTokenPredictor` that is
/// `model.forward_with_attention(ids, Some(key_padding_mask)).map(|(_, w)| w)`.
///
/// `head` picks one head; `None` averages the heads (PyTorch's `average_attn_weights=True`).
/// Padded query positions are skipped, and padded keys get weight 0 from the key padding mask,
/// so padding never enters the matrix. Errors, at the first batch, on a `layer` or `head` the
/// model does not have; on the first error of `batches` or `attention`.
///
/// PyTorch equivalent: none (a loop over a `DataLoader` collecting
/// `model(x, need_weights=True)` weights into a `(V, V)` matrix).
pub fn corpus_vocab_matrix(
    vocab_size: usize,
    batches: impl IntoIterator<Item = Result<(Tensor, Tensor)>>,
    layer: usize,
    head: Option<usize>,
    mut attention: impl FnMut(&Tensor, &Tensor) -> Result<Vec<Tensor>>,
) -> Result<VocabMatrix> {
    let mut matrix = VocabMatrix::new(vocab_size);
    for batch in batches {
        let (ids, key_padding_mask) = batch?;
        let weights = attention(&ids, &key_padding_mask)?;
        let Some(w) = weights.get(layer) else {
            candle::bail!(
                "layer {layer} is out of range: the model has {n} layer(s); expected a layer below {n}",
                n = weights.len()
            )
        };
        // (N, H, L, L) → (N, L, L).
        let w = match head {
            Some(h) if h >= w.dim(1)? => candle::bail!(
                "head {h} is out of range: the model has {n} head(s); expected a head below {n} \
                 or None for the mean over heads",
                n = w.dim(1)?
            ),
            Some(h) => w.i((.., h))?,
            None => w.mean(1)?,
        };
        matrix.add(&ids, &ids, &w.detach(), Some(&key_padding_mask))?;
    }
    Ok(matrix)
}
