//! [`AttentionGraph`]: an attention matrix read as a weighted, directed graph, exported to DOT,
//! GraphML and CSV.
//!
//! # Is the attention matrix a weighted adjacency matrix? Directed?
//! Yes: row `i` of an `(L, S)` attention matrix is query `i`'s distribution over the keys, so
//! `A[i][j]` is the weight of an edge from query `i` to key `j`. The graph is **directed**:
//! `A[i][j]` (how much `i` reads from `j`) and `A[j][i]` (how much `j` reads from `i`) come
//! from different softmax rows and are in general different ([`is_symmetric`] is almost never
//! true for a real model; a causal mask even makes the matrix triangular). Each node's
//! out-weights sum to 1; in-weights do not. [`GraphOptions::symmetrize`] gives the undirected
//! graph of `(A + Aᵀ) / 2` when a symmetric view is wanted.

use candle::{DType, Device, Result, Tensor};

use super::escape::{csv_field, dot_escape, xml_escape};

/// Which entries of the matrix become edges.
///
/// Applied in this order: symmetrize, drop self-loops, threshold, top-k.
///
/// PyTorch equivalent: none.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphOptions {
    /// Keep only weights strictly greater than this. Default 0, which drops exactly-zero
    /// weights (masked keys) and keeps everything else.
    pub threshold: f64,
    /// Keep at most this many edges per query (the largest; ties by smaller key index). In an
    /// undirected (symmetrized) graph an edge is kept when either endpoint keeps it. Default
    /// `None` (no limit).
    pub top_k: Option<usize>,
    /// Keep edges from a node to itself (only possible when query and key nodes are shared).
    /// Default true.
    pub self_loops: bool,
    /// Use `(A + Aᵀ) / 2` and build an undirected graph. Needs shared nodes (a square matrix
    /// with the same query and key labels). Default false.
    pub symmetrize: bool,
}

impl Default for GraphOptions {
    fn default() -> Self {
        Self {
            threshold: 0.0,
            top_k: None,
            self_loops: true,
            symmetrize: false,
        }
    }
}

/// An attention matrix as a weighted graph.
///
/// Query `i` is always node `i`. For self-attention (a square matrix whose query and key
/// labels are equal) queries and keys are the same tokens, so the nodes are shared:
/// `key_offset == 0` and key `j` is node `j`. Otherwise (cross-attention, or different labels)
/// query and key nodes are separate: `nodes = query labels ++ key labels`, `key_offset == L`
/// and key `j` is node `L + j`, a bipartite graph.
///
/// PyTorch equivalent: none (`networkx.from_numpy_array(A, create_using=nx.DiGraph)`).
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionGraph {
    /// Node labels, by node index.
    pub nodes: Vec<String>,
    /// Edges `(source, target, weight)`: source = query node, target = key node, sorted by
    /// source then target. In an undirected graph each edge appears once, with
    /// `source <= target`.
    pub edges: Vec<(usize, usize, f64)>,
    /// Whether the graph is directed (false only with [`GraphOptions::symmetrize`]).
    pub directed: bool,
    /// The node index of key 0: 0 when query and key nodes are shared, `L` when separate.
    pub key_offset: usize,
}

/// `matrix` as `(rows, cols, row-major f64 values)`, checking it is a 2-D float tensor.
fn matrix_values(name: &str, matrix: &Tensor) -> Result<(usize, usize, Vec<f64>)> {
    let (l, s) = match matrix.dims() {
        [l, s] => (*l, *s),
        d => candle::bail!(
            "{name} must be a 2-D (L, S) attention matrix, got shape {d:?} (index the batch \
             and head, or average the heads, first)"
        ),
    };
    if !matrix.dtype().is_float() {
        candle::bail!(
            "{name} must be a float tensor, got dtype {:?}",
            matrix.dtype()
        )
    }
    let values = matrix
        .to_device(&Device::Cpu)?
        .to_dtype(DType::F64)?
        .flatten_all()?
        .to_vec1()?;
    Ok((l, s, values))
}

impl AttentionGraph {
    /// The graph of `matrix`: an edge from query `i` to key `j` carrying `matrix[i][j]`, for
    /// the entries that `opts` keeps (see [`GraphOptions`]; the type's documentation says when
    /// nodes are shared).
    ///
    /// Errors on a matrix that is not 2-D float, on a non-finite entry, on label counts that
    /// differ from `L` and `S`, on a NaN threshold, and on `symmetrize` without shared nodes.
    ///
    /// # Shapes
    /// `matrix (L, S)`; `query_labels` has `L` entries, `key_labels` `S`.
    pub fn from_matrix(
        matrix: &Tensor,
        query_labels: &[String],
        key_labels: &[String],
        opts: &GraphOptions,
    ) -> Result<Self> {
        let (l, s, mut a) = matrix_values("matrix", matrix)?;
        if query_labels.len() != l {
            candle::bail!(
                "query_labels has {} entries; expected L = {l} for a matrix of shape {:?}",
                query_labels.len(),
                [l, s]
            )
        }
        if key_labels.len() != s {
            candle::bail!(
                "key_labels has {} entries; expected S = {s} for a matrix of shape {:?}",
                key_labels.len(),
                [l, s]
            )
        }
        if let Some(p) = a.iter().position(|x| !x.is_finite()) {
            candle::bail!(
                "matrix[{}][{}] = {}; expected finite weights",
                p / s,
                p % s,
                a[p]
            )
        }
        if opts.threshold.is_nan() {
            candle::bail!("GraphOptions::threshold is NaN; expected a number")
        }
        let shared = l == s && query_labels == key_labels;
        if opts.symmetrize {
            if !shared {
                candle::bail!(
                    "symmetrize needs shared query and key nodes: a square matrix with equal \
                     query and key labels; got shape {:?}{}",
                    [l, s],
                    if l == s { " with different labels" } else { "" }
                )
            }
            let orig = a.clone();
            for i in 0..l {
                for j in 0..l {
                    a[i * l + j] = 0.5 * (orig[i * l + j] + orig[j * l + i]);
                }
            }
        }
        let key_offset = if shared { 0 } else { l };
        let mut edges = Vec::new();
        for i in 0..l {
            let mut row: Vec<(usize, f64)> = (0..s)
                .filter(|&j| opts.self_loops || !shared || i != j)
                .map(|j| (j, a[i * s + j]))
                .filter(|&(_, w)| w > opts.threshold)
                .collect();
            if let Some(k) = opts.top_k {
                row.sort_by(|x, y| y.1.total_cmp(&x.1).then(x.0.cmp(&y.0)));
                row.truncate(k);
            }
            edges.extend(row.into_iter().map(|(j, w)| (i, key_offset + j, w)));
        }
        if opts.symmetrize {
            // i→j and j→i carry the same weight now: one undirected edge, kept if either
            // endpoint selected it.
            for e in &mut edges {
                if e.0 > e.1 {
                    *e = (e.1, e.0, e.2);
                }
            }
        }
        edges.sort_by_key(|e| (e.0, e.1));
        edges.dedup_by_key(|e| (e.0, e.1));
        let nodes = if shared {
            query_labels.to_vec()
        } else {
            query_labels.iter().chain(key_labels).cloned().collect()
        };
        Ok(Self {
            nodes,
            edges,
            directed: !opts.symmetrize,
            key_offset,
        })
    }

    /// The number of query nodes `L` (all the nodes when they are shared).
    pub fn num_query_nodes(&self) -> usize {
        if self.key_offset == 0 {
            self.nodes.len()
        } else {
            self.key_offset
        }
    }

    /// The graph in Graphviz DOT: a `digraph` (a `graph` when undirected), node `n{i}`
    /// labelled with `nodes[i]`, each edge labelled with its weight (`{:.6}`) and drawn with a
    /// pen width from 0.5 to 5 in proportion to its weight. Separate query and key nodes go in
    /// two clusters. Render with `dot -Tsvg`.
    pub fn to_dot(&self) -> String {
        let (kind, arrow) = if self.directed {
            ("digraph", "->")
        } else {
            ("graph", "--")
        };
        let max = self.edges.iter().map(|e| e.2.abs()).fold(0.0, f64::max);
        let mut out = format!("{kind} attention {{\n  rankdir=LR;\n  node [shape=box];\n");
        let node = |i: usize| format!("n{i} [label=\"{}\"];", dot_escape(&self.nodes[i]));
        if self.key_offset == 0 {
            for i in 0..self.nodes.len() {
                out.push_str(&format!("  {}\n", node(i)));
            }
        } else {
            for (name, range) in [
                ("queries", 0..self.key_offset),
                ("keys", self.key_offset..self.nodes.len()),
            ] {
                out.push_str(&format!(
                    "  subgraph cluster_{name} {{\n    label=\"{name}\";\n"
                ));
                for i in range {
                    out.push_str(&format!("    {}\n", node(i)));
                }
                out.push_str("  }\n");
            }
        }
        for &(a, b, w) in &self.edges {
            let pen = if max > 0.0 {
                0.5 + 4.5 * w.abs() / max
            } else {
                0.5
            };
            out.push_str(&format!(
                "  n{a} {arrow} n{b} [label=\"{w:.6}\", penwidth={pen:.3}];\n"
            ));
        }
        out.push_str("}\n");
        out
    }

    /// The graph in GraphML: node `n{i}` with a `label` (and `role`: `token`, `query` or `key`),
    /// edge `e{k}` with a `weight` (double) written in Rust's shortest exact form, so it parses
    /// back to the same f64. Labels are XML-escaped. Opens in Gephi, yEd, Cytoscape and
    /// `networkx.read_graphml`.
    pub fn to_graphml(&self) -> String {
        let mut out = String::from(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
             <graphml xmlns=\"http://graphml.graphdrawing.org/xmlns\" \
             xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" \
             xsi:schemaLocation=\"http://graphml.graphdrawing.org/xmlns \
             http://graphml.graphdrawing.org/xmlns/1.0/graphml.xsd\">\n  \
             <key id=\"label\" for=\"node\" attr.name=\"label\" attr.type=\"string\"/>\n  \
             <key id=\"role\" for=\"node\" attr.name=\"role\" attr.type=\"string\"/>\n  \
             <key id=\"weight\" for=\"edge\" attr.name=\"weight\" attr.type=\"double\"/>\n",
        );
        let default = if self.directed {
            "directed"
        } else {
            "undirected"
        };
        out.push_str(&format!(
            "  <graph id=\"attention\" edgedefault=\"{default}\">\n"
        ));
        for (i, label) in self.nodes.iter().enumerate() {
            let role = match (self.key_offset, i < self.key_offset) {
                (0, _) => "token",
                (_, true) => "query",
                (_, false) => "key",
            };
            out.push_str(&format!(
                "    <node id=\"n{i}\"><data key=\"label\">{}</data><data key=\"role\">{role}</data></node>\n",
                xml_escape(label)
            ));
        }
        for (k, &(a, b, w)) in self.edges.iter().enumerate() {
            out.push_str(&format!(
                "    <edge id=\"e{k}\" source=\"n{a}\" target=\"n{b}\"><data key=\"weight\">{w}</data></edge>\n"
            ));
        }
        out.push_str("  </graph>\n</graphml>\n");
        out
    }

    /// The kept edges as a dense adjacency matrix in CSV (missing edges are 0): a header of
    /// target labels after an empty corner cell, then one row per source node starting with its
    /// label. With shared nodes it is `nodes × nodes` (symmetric when undirected); with
    /// separate nodes it is queries × keys. Weights in Rust's shortest exact form.
    pub fn to_csv_adjacency(&self) -> String {
        let l = self.num_query_nodes();
        let (rows, cols) = if self.key_offset == 0 {
            (0..l, 0..l)
        } else {
            (0..l, l..self.nodes.len())
        };
        let ncols = cols.len();
        let mut m = vec![0f64; rows.len() * ncols];
        for &(a, b, w) in &self.edges {
            let b = b - cols.start;
            m[a * ncols + b] = w;
            if !self.directed {
                m[b * ncols + a] = w;
            }
        }
        let mut out = String::new();
        for j in cols.clone() {
            out.push(',');
            out.push_str(&csv_field(&self.nodes[j]));
        }
        out.push('\n');
        for i in rows {
            out.push_str(&csv_field(&self.nodes[i]));
            for w in &m[i * ncols..(i + 1) * ncols] {
                out.push_str(&format!(",{w}"));
            }
            out.push('\n');
        }
        out
    }
}

/// Whether `matrix` equals its transpose within `tol` (`|A[i][j] - A[j][i]| <= tol` for all
/// pairs). A non-square matrix is not symmetric; non-finite entries never compare equal.
///
/// Errors on a tensor that is not 2-D float and on a negative or NaN `tol`.
///
/// # Shapes
/// `matrix (L, S)`.
///
/// PyTorch equivalent: `torch.allclose(A, A.T, rtol=0, atol=tol)` (for square `A`).
pub fn is_symmetric(matrix: &Tensor, tol: f64) -> Result<bool> {
    if tol.is_nan() || tol < 0.0 {
        candle::bail!("tol = {tol}; expected a non-negative tolerance")
    }
    Ok(match max_asymmetry(matrix)? {
        None => false,
        Some((_, _, d)) => d <= tol,
    })
}

/// The pair `(i, j)`, `i < j`, where `|A[i][j] - A[j][i]|` is largest, with that difference
/// (NaN where an entry is not finite); `Some((0, 0, 0.0))` for a 0×0 or 1×1 matrix and `None`
/// for a non-square one.
///
/// # Shapes
/// `matrix (L, S)`.
pub fn max_asymmetry(matrix: &Tensor) -> Result<Option<(usize, usize, f64)>> {
    let (l, s, a) = matrix_values("matrix", matrix)?;
    if l != s {
        return Ok(None);
    }
    let mut best = (0, 0, 0.0);
    for i in 0..l {
        for j in i + 1..l {
            let d = (a[i * l + j] - a[j * l + i]).abs();
            if d.is_nan() {
                return Ok(Some((i, j, f64::NAN)));
            }
            if d > best.2 {
                best = (i, j, d);
            }
        }
    }
    Ok(Some(best))
}
