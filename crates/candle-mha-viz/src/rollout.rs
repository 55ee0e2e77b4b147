//! Attention rollout and attention flow (Abnar & Zuidema 2020, "Quantifying Attention Flow in
//! Transformers"): how much each output position draws from each input token through all the
//! layers, not just one.
//!
//! Both read the layers as a layered graph: node `(ℓ, i)` is position `i` after layer `ℓ`
//! (`ℓ = 0` are the input tokens), and layer `ℓ`'s weight `A_ℓ[i][j]` is an edge from
//! `(ℓ, i)` down to `(ℓ-1, j)`. Rollout sums the products of the weights over all paths
//! (a matrix product); flow treats the weights as capacities and computes a maximum flow.
//!
//! Each layer is prepared the same way for both: heads fused ([`HeadFusion`]), then
//! (rollout only) the lowest weights discarded, then with `residual` the skip connection
//! added as `A' = 0.5 A + 0.5 I`, then every row renormalised to sum to 1 (rows that are all
//! zero stay zero). Renormalising keeps `Max`/`Min` fusion and discarding meaningful: each
//! layer stays a distribution over the previous layer's positions.

use candle::{DType, Device, Result, Tensor};

use super::heads::{fuse_heads, HeadFusion};

/// The longest sequence [`attention_flow`] accepts: it solves `L²` max-flow problems on a graph
/// of `L · (layers + 1)` nodes and `layers · L²` edges, which stays within seconds up to here.
pub const ATTENTION_FLOW_MAX_LEN: usize = 64;

/// Weights below this are treated as zero capacity (float max-flow would otherwise chase
/// rounding residues).
const FLOW_EPS: f64 = 1e-12;

/// Every layer as an `(L, L)` f64 row-major matrix with heads fused, plus `L`.
fn fused_layers(layers: &[Tensor], fusion: HeadFusion) -> Result<(usize, Vec<Vec<f64>>)> {
    if layers.is_empty() {
        candle::bail!("layers is empty; expected at least one (H, L, L) or (L, L) tensor")
    }
    let mut len = None;
    let mut out = Vec::with_capacity(layers.len());
    for (idx, t) in layers.iter().enumerate() {
        let (h, l) = match t.dims() {
            [l, s] if l == s => (1, *l),
            [h, l, s] if l == s => (*h, *l),
            d => candle::bail!(
                "layers[{idx}] must be (H, L, L) or (L, L) self-attention weights, got shape {d:?}"
            ),
        };
        if h == 0 {
            candle::bail!(
                "layers[{idx}] has 0 heads (shape {:?}); expected at least 1",
                t.dims()
            )
        }
        if !t.dtype().is_float() {
            candle::bail!(
                "layers[{idx}] must be a float tensor, got dtype {:?}",
                t.dtype()
            )
        }
        match len {
            None => len = Some(l),
            Some(l0) if l0 != l => candle::bail!(
                "layers[{idx}] has L = {l} (shape {:?}) but layers[0] has L = {l0}; expected \
                 every layer over the same sequence",
                t.dims()
            ),
            _ => {}
        }
        let t = t.to_device(&Device::Cpu)?.to_dtype(DType::F64)?;
        let v: Vec<f64> = t.flatten_all()?.to_vec1()?;
        if let Some(p) = v.iter().position(|x| !x.is_finite()) {
            candle::bail!(
                "layers[{idx}] has the non-finite weight {} at flat position {p}; expected \
                 finite attention weights",
                v[p]
            )
        }
        let fused: Vec<f64> = fuse_heads(&t.reshape((h, l, l))?, fusion)?
            .flatten_all()?
            .to_vec1()?;
        out.push(fused);
    }
    Ok((len.unwrap_or(0), out))
}

/// Discard, residual, renormalise one fused `(l, l)` layer in place (see the module docs).
fn prepare(a: &mut [f64], l: usize, residual: bool, discard_ratio: f64) {
    let n_drop = (discard_ratio * (l * l) as f64).floor() as usize;
    if n_drop > 0 {
        let mut order: Vec<usize> = (0..l * l).collect();
        order.sort_by(|&x, &y| a[x].total_cmp(&a[y]).then(x.cmp(&y)));
        for &e in &order[..n_drop.min(l * l)] {
            if e / l != e % l {
                a[e] = 0.0;
            }
        }
    }
    if residual {
        for i in 0..l {
            for j in 0..l {
                let id = if i == j { 1.0 } else { 0.0 };
                a[i * l + j] = 0.5 * a[i * l + j] + 0.5 * id;
            }
        }
    }
    for row in a.chunks_mut(l.max(1)) {
        let total: f64 = row.iter().sum();
        if total != 0.0 {
            row.iter_mut().for_each(|x| *x /= total);
        }
    }
}

/// A `(l, l)` f64 matrix as a tensor in the first layer's dtype and device.
fn to_tensor(m: Vec<f64>, l: usize, like: &Tensor) -> Result<Tensor> {
    Tensor::from_vec(m, (l, l), &Device::Cpu)?
        .to_dtype(like.dtype())?
        .to_device(like.device())
}

/// Attention rollout: `A'_n · … · A'_1`, where `A'_ℓ` is layer `ℓ` (`layers[ℓ-1]`) with heads
/// fused, the lowest weights discarded, the residual added when `residual` is true
/// (`0.5 A + 0.5 I`) and rows renormalised (see the module docs). Entry `[i][j]` is how much
/// output position `i` draws from input token `j`; rows sum to 1.
///
/// `discard_ratio` in `[0, 1)`: per layer, the `floor(discard_ratio · L²)` lowest fused
/// weights of the whole matrix (ties: earlier row-major entry first) are selected and set to
/// 0, except diagonal entries, which are kept. This follows the common ViT rollout
/// implementation (jacobgil/vit-explain), which selects the lowest entries of the flattened
/// matrix and then spares a protected entry (there `[CLS, CLS]`; here the whole diagonal, a
/// token's own position). Unlike that implementation, the renormalisation divides each row by
/// its own sum. 0 discards nothing.
///
/// Errors on an empty `layers`, a layer not `(H, L, L)` or `(L, L)`, layers of different `L`,
/// non-float or non-finite weights, and `discard_ratio` outside `[0, 1)`.
///
/// # Shapes
/// `layers[ℓ]`: `(H, L, L)` or `(L, L)` (first layer first); returns `(L, L)` in the dtype and
/// on the device of `layers[0]`.
///
/// PyTorch equivalent: `rollout(attentions, discard_ratio, head_fusion)` of vit-explain, with
/// `result = a @ result` over the layers.
pub fn attention_rollout(
    layers: &[Tensor],
    fusion: HeadFusion,
    residual: bool,
    discard_ratio: f64,
) -> Result<Tensor> {
    if !(0.0..1.0).contains(&discard_ratio) {
        candle::bail!("discard_ratio = {discard_ratio}; expected a value in [0, 1)")
    }
    let (l, mut mats) = fused_layers(layers, fusion)?;
    let mut result: Vec<f64> = (0..l * l)
        .map(|e| if e / l == e % l { 1.0 } else { 0.0 })
        .collect();
    for a in &mut mats {
        prepare(a, l, residual, discard_ratio);
        // result ← A'_ℓ · result.
        let mut next = vec![0f64; l * l];
        for i in 0..l {
            for k in 0..l {
                let aik = a[i * l + k];
                if aik != 0.0 {
                    for j in 0..l {
                        next[i * l + j] += aik * result[k * l + j];
                    }
                }
            }
        }
        result = next;
    }
    to_tensor(result, l, &layers[0])
}

/// Attention flow: entry `[i][j]` is the maximum flow from output node `(n, i)` to input token
/// `(0, j)` in the layered graph whose edge `(ℓ, i) → (ℓ-1, j)` has capacity `A'_ℓ[i][j]`
/// (heads fused, with `residual` `0.5 A + 0.5 I`, rows renormalised; nothing discarded). Each
/// entry is at most 1 (the source's out-capacity); unlike rollout, rows need not sum to 1,
/// since each `(i, j)` is a separate max-flow problem. For one layer the flow equals the
/// prepared matrix; for two it is `Σ_k min(A'_2[i][k], A'_1[k][j])`.
///
/// Solved with Dinic's algorithm (capacities below 1e-12 count as 0). Errors as
/// [`attention_rollout`] does, and on `L > ATTENTION_FLOW_MAX_LEN` (64).
///
/// # Shapes
/// `layers[ℓ]`: `(H, L, L)` or `(L, L)` (first layer first); returns `(L, L)` in the dtype and
/// on the device of `layers[0]`.
///
/// PyTorch equivalent: `compute_flows` of the paper's code (samiraabnar/attention_flow), which
/// calls `networkx.maximum_flow` per pair.
pub fn attention_flow(layers: &[Tensor], fusion: HeadFusion, residual: bool) -> Result<Tensor> {
    let (l, mut mats) = fused_layers(layers, fusion)?;
    if l > ATTENTION_FLOW_MAX_LEN {
        candle::bail!(
            "attention_flow on sequences of length {l}; expected L <= {ATTENTION_FLOW_MAX_LEN} \
             (it solves L² max-flow problems; use attention_rollout for longer sequences)"
        )
    }
    for a in &mut mats {
        prepare(a, l, residual, 0.0);
    }
    let n = mats.len();
    let mut net = FlowNetwork::new(l * (n + 1));
    for (idx, a) in mats.iter().enumerate() {
        let upper = idx + 1;
        for i in 0..l {
            for j in 0..l {
                if a[i * l + j] > FLOW_EPS {
                    net.add_edge(upper * l + i, idx * l + j, a[i * l + j]);
                }
            }
        }
    }
    let mut flow = vec![0f64; l * l];
    for i in 0..l {
        for j in 0..l {
            flow[i * l + j] = net.max_flow(n * l + i, j);
        }
    }
    to_tensor(flow, l, &layers[0])
}

/// A small flow network for Dinic's algorithm; `max_flow` restores the capacities first, so
/// one network serves every (source, sink) pair.
struct FlowNetwork {
    /// Per node, indices into `to`/`cap`.
    adj: Vec<Vec<usize>>,
    /// Edge heads; edge `e ^ 1` is the reverse of edge `e`.
    to: Vec<usize>,
    cap: Vec<f64>,
    orig: Vec<f64>,
    level: Vec<i64>,
    next: Vec<usize>,
}

impl FlowNetwork {
    fn new(nodes: usize) -> Self {
        Self {
            adj: vec![Vec::new(); nodes],
            to: Vec::new(),
            cap: Vec::new(),
            orig: Vec::new(),
            level: vec![-1; nodes],
            next: vec![0; nodes],
        }
    }

    fn add_edge(&mut self, a: usize, b: usize, c: f64) {
        self.adj[a].push(self.to.len());
        self.to.push(b);
        self.orig.push(c);
        self.adj[b].push(self.to.len());
        self.to.push(a);
        self.orig.push(0.0);
    }

    /// Levels from `s` over edges with residual capacity; whether `t` is reachable.
    fn bfs(&mut self, s: usize, t: usize) -> bool {
        self.level.iter_mut().for_each(|x| *x = -1);
        self.level[s] = 0;
        let mut queue = std::collections::VecDeque::from([s]);
        while let Some(u) = queue.pop_front() {
            for &e in &self.adj[u] {
                let v = self.to[e];
                if self.cap[e] > FLOW_EPS && self.level[v] < 0 {
                    self.level[v] = self.level[u] + 1;
                    queue.push_back(v);
                }
            }
        }
        self.level[t] >= 0
    }

    /// Pushes up to `limit` from `u` to `t` along level-increasing edges.
    fn dfs(&mut self, u: usize, t: usize, limit: f64) -> f64 {
        if u == t {
            return limit;
        }
        while self.next[u] < self.adj[u].len() {
            let e = self.adj[u][self.next[u]];
            let v = self.to[e];
            if self.cap[e] > FLOW_EPS && self.level[v] == self.level[u] + 1 {
                let pushed = self.dfs(v, t, limit.min(self.cap[e]));
                if pushed > 0.0 {
                    self.cap[e] -= pushed;
                    self.cap[e ^ 1] += pushed;
                    return pushed;
                }
            }
            self.next[u] += 1;
        }
        0.0
    }

    fn max_flow(&mut self, s: usize, t: usize) -> f64 {
        self.cap.clone_from(&self.orig);
        let mut total = 0.0;
        while self.bfs(s, t) {
            self.next.iter_mut().for_each(|x| *x = 0);
            loop {
                let pushed = self.dfs(s, t, f64::INFINITY);
                if pushed <= 0.0 {
                    break;
                }
                total += pushed;
            }
        }
        total
    }
}
