//! Vocabulary × vocabulary matrices, attention graphs and their exports, rollout and flow,
//! checked against numbers worked out by hand.

use std::collections::HashMap;

use anyhow::Result;
use candle_mha::analysis::{
    attention_flow, attention_rollout, corpus_vocab_matrix, is_symmetric, max_asymmetry,
    AttentionGraph, GraphOptions, RolloutFusion, VocabMatrix,
};
use candle_mha::candle::{DType, Device, Tensor};
use candle_mha::checkpoint::StateDict;
use candle_mha::data::{Dataset, Example};
use candle_mha::models::{NextTokenPredictor, NextTokenPredictorConfig};
use candle_mha::seeded_var_builder;
use candle_nn::VarMap;

const TOL: f64 = 1e-12;

fn labels(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

fn assert_matrix(t: &Tensor, expected: &[&[f64]], tol: f64) -> Result<()> {
    let got = t.to_dtype(DType::F64)?.to_vec2::<f64>()?;
    assert_eq!(got.len(), expected.len(), "rows of {got:?}");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert_eq!(g.len(), e.len(), "row {i} of {got:?}");
        for (j, (x, y)) in g.iter().zip(e.iter()).enumerate() {
            assert!(
                close(*x, *y, tol),
                "[{i}][{j}]: got {x}, expected {y}; {got:?}"
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Vocabulary matrix
// ---------------------------------------------------------------------------------------------

/// Two sequences over V = 6 (ids 0..4 are the specials, 4 = "a", 5 = "b,c"):
///
/// ```text
/// seq 0: ids [4, 2, 4]           seq 1: ids [2, 5, pad]
///   q0 (4): [1.0, 0,   0  ]        q0 (2): [1.0, 0,   0]
///   q1 (2): [0.25, 0.75, 0 ]       q1 (5): [0.4, 0.6, 0]
///   q2 (4): [0.5, 0.2, 0.3]        q2 pad: [NaN, NaN, NaN]  (skipped)
/// ```
fn hand_batches() -> Result<[(Tensor, Tensor, Tensor); 2]> {
    let dev = Device::Cpu;
    let nan = f64::NAN;
    let b0 = (
        Tensor::new(&[[4u32, 2, 4]], &dev)?,
        Tensor::new(&[[1.0f64, 0., 0.], [0.25, 0.75, 0.], [0.5, 0.2, 0.3]], &dev)?.unsqueeze(0)?,
        Tensor::new(&[[0u8, 0, 0]], &dev)?,
    );
    let b1 = (
        Tensor::new(&[[2u32, 5, 0]], &dev)?,
        Tensor::new(&[[1.0f64, 0., 0.], [0.4, 0.6, 0.], [nan, nan, nan]], &dev)?.unsqueeze(0)?,
        Tensor::new(&[[0u8, 0, 1]], &dev)?,
    );
    Ok([b0, b1])
}

fn hand_matrix() -> Result<VocabMatrix> {
    let mut m = VocabMatrix::new(6);
    for (ids, w, mask) in hand_batches()? {
        m.add(&ids, &ids, &w, Some(&mask))?;
    }
    Ok(m)
}

/// Worked out by hand from [`hand_batches`]:
/// - (2,2): 0.75 (seq 0 q1) + 1.0 (seq 1 q0) = 1.75, count 2
/// - (2,4): 0.25, count 1
/// - (4,4): 1.0 (q0) + 0.5 + 0.3 (q2 sees "a" twice: one count) = 1.8, count 2
/// - (4,2): 0.2, count 1
/// - (5,2): 0.4, count 1; (5,5): 0.6, count 1
///
/// Row totals: 2 → 2.0, 4 → 2.0, 5 → 1.0.
#[test]
fn vocab_matrix_matches_hand_computation() -> Result<()> {
    let m = hand_matrix()?;
    let z = 0.0;
    assert_matrix(
        &m.sum()?,
        &[
            &[z, z, z, z, z, z],
            &[z, z, z, z, z, z],
            &[z, z, 1.75, z, 0.25, z],
            &[z, z, z, z, z, z],
            &[z, z, 0.2, z, 1.8, z],
            &[z, z, 0.4, z, z, 0.6],
        ],
        TOL,
    )?;
    assert_matrix(
        &m.count()?,
        &[
            &[z, z, z, z, z, z],
            &[z, z, z, z, z, z],
            &[z, z, 2., z, 1., z],
            &[z, z, z, z, z, z],
            &[z, z, 1., z, 2., z],
            &[z, z, 1., z, z, 1.],
        ],
        0.0,
    )?;
    assert_matrix(
        &m.mean()?,
        &[
            &[z, z, z, z, z, z],
            &[z, z, z, z, z, z],
            &[z, z, 0.875, z, 0.25, z],
            &[z, z, z, z, z, z],
            &[z, z, 0.2, z, 0.9, z],
            &[z, z, 0.4, z, z, 0.6],
        ],
        TOL,
    )?;
    assert_matrix(
        &m.row_normalized()?,
        &[
            &[z, z, z, z, z, z],
            &[z, z, z, z, z, z],
            &[z, z, 0.875, z, 0.125, z],
            &[z, z, z, z, z, z],
            &[z, z, 0.1, z, 0.9, z],
            &[z, z, 0.4, z, z, 0.6],
        ],
        TOL,
    )?;
    assert_eq!(m.cell(4, 4).1, 2);
    assert_eq!(m.cell(1, 1), (0.0, 0));
    assert_eq!(m.num_cells(), 6);
    Ok(())
}

/// Softmax rows sum to 1, so the total mass is the number of non-padded query positions.
#[test]
fn totals_count_non_padded_queries() -> Result<()> {
    let m = hand_matrix()?;
    assert_eq!(m.num_queries(), 5);
    assert!(close(m.total_mass(), 5.0, TOL), "{}", m.total_mass());
    Ok(())
}

#[test]
fn streaming_equals_one_shot() -> Result<()> {
    let streamed = hand_matrix()?;
    let [(i0, w0, m0), (i1, w1, m1)] = hand_batches()?;
    // One batch of both sequences (same L = 3).
    let ids = Tensor::cat(&[&i0, &i1], 0)?;
    let w = Tensor::cat(&[&w0, &w1], 0)?;
    let mask = Tensor::cat(&[&m0, &m1], 0)?;
    let mut once = VocabMatrix::new(6);
    once.add(&ids, &ids, &w, Some(&mask))?;
    assert_eq!(once.num_queries(), streamed.num_queries());
    let (a, b) = (once.cells(), streamed.cells());
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.0, y.0);
        assert_eq!(x.1 .1, y.1 .1);
        assert!(close(x.1 .0, y.1 .0, TOL), "{x:?} vs {y:?}");
    }
    Ok(())
}

#[test]
fn padding_is_skipped_and_errors_leave_the_matrix_unchanged() -> Result<()> {
    let [_, (ids, w, mask)] = hand_batches()?;
    let mut m = VocabMatrix::new(6);
    m.add(&ids, &ids, &w, Some(&mask))?;
    // The padded query (id 0, NaN weights) added nothing; key 0 received nothing either.
    assert_eq!(m.num_queries(), 2);
    assert_eq!(m.cell(0, 0), (0.0, 0));
    // Without the mask the NaN row is an error, and nothing is added.
    let before = m.clone();
    let err = m.add(&ids, &ids, &w, None).unwrap_err().to_string();
    assert!(err.contains("weights[0, 2, 0]"), "{err}");
    assert_eq!(m, before);
    Ok(())
}

#[test]
fn vocab_matrix_rejects_bad_input() -> Result<()> {
    let dev = Device::Cpu;
    let mut m = VocabMatrix::new(4);
    let ids = Tensor::new(&[[1u32, 2]], &dev)?;
    let w = Tensor::new(&[[[1f32, 0.], [0.5, 0.5]]], &dev)?;
    let err = |r: candle_mha::candle::Result<()>| r.unwrap_err().to_string();
    let e = err(m.add(&ids, &ids, &w.squeeze(0)?, None));
    assert!(
        e.contains("weights must be (N, L, S)") && e.contains("[2, 2]"),
        "{e}"
    );
    let e = err(m.add(&Tensor::new(&[[1u32, 9]], &dev)?, &ids, &w, None));
    assert!(e.contains("query_ids") && e.contains("id 9"), "{e}");
    let e = err(m.add(&ids.to_dtype(DType::F32)?, &ids, &w, None));
    assert!(e.contains("query_ids") && e.contains("F32"), "{e}");
    let e = err(m.add(&ids, &Tensor::new(&[[1u32, 2, 3]], &dev)?, &w, None));
    assert!(e.contains("weights must be (N, L, S)"), "{e}");
    let e = err(m.add(&ids, &ids, &w, Some(&Tensor::new(&[[0u8]], &dev)?)));
    assert!(e.contains("query_mask"), "{e}");
    let neg = Tensor::new(&[[[1f32, 0.], [1.5, -0.5]]], &dev)?;
    let e = err(m.add(&ids, &ids, &neg, None));
    assert!(e.contains("weights[0, 1, 1] = -0.5"), "{e}");
    assert_eq!(m.num_queries(), 0);
    Ok(())
}

#[test]
fn top_k_ranks_by_row_share() -> Result<()> {
    let m = hand_matrix()?;
    let top1 = m.top_k(1);
    assert_eq!(
        top1.iter()
            .map(|(q, r)| (*q, r.iter().map(|e| e.0).collect::<Vec<_>>()))
            .collect::<Vec<_>>(),
        vec![(2, vec![2]), (4, vec![4]), (5, vec![5])]
    );
    let top2 = m.top_k(2);
    assert_eq!(top2[0].0, 2);
    assert_eq!(top2[0].1.len(), 2);
    assert_eq!(top2[0].1[1].0, 4);
    assert!(close(top2[0].1[0].1, 0.875, TOL) && close(top2[0].1[1].1, 0.125, TOL));
    // Asking for more than a row has gives the whole row.
    assert_eq!(m.top_k(10)[2].1.len(), 2);
    assert!(m.top_k(0).iter().all(|(_, r)| r.is_empty()));
    Ok(())
}

/// Splits one CSV line, honouring RFC 4180 quotes.
fn csv_split(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted, mut chars) =
        (Vec::new(), String::new(), false, line.chars().peekable());
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => out.push(std::mem::take(&mut cur)),
            (c, _) => cur.push(c),
        }
    }
    out.push(cur);
    out
}

#[test]
fn csv_lists_every_cell() -> Result<()> {
    let m = hand_matrix()?;
    let names = labels(&["<pad>", "<unk>", "<bos>", "<eos>", "a", "b,c"]);
    let csv = m.to_csv(&names);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], "query,key,sum,count,mean,row_share");
    let expected: [(&str, &str, f64, u64, f64, f64); 6] = [
        ("<bos>", "<bos>", 1.75, 2, 0.875, 0.875),
        ("<bos>", "a", 0.25, 1, 0.25, 0.125),
        ("a", "<bos>", 0.2, 1, 0.2, 0.1),
        ("a", "a", 1.8, 2, 0.9, 0.9),
        ("b,c", "<bos>", 0.4, 1, 0.4, 0.4),
        ("b,c", "b,c", 0.6, 1, 0.6, 0.6),
    ];
    assert_eq!(lines.len(), 1 + expected.len(), "{csv}");
    assert!(lines[5].starts_with("\"b,c\","), "{}", lines[5]);
    for (line, e) in lines[1..].iter().zip(expected) {
        let f = csv_split(line);
        assert_eq!(f.len(), 6, "{line}");
        assert_eq!((f[0].as_str(), f[1].as_str()), (e.0, e.1), "{line}");
        assert_eq!(f[3].parse::<u64>()?, e.3, "{line}");
        for (field, want) in [(&f[2], e.2), (&f[4], e.4), (&f[5], e.5)] {
            assert!(close(field.parse::<f64>()?, want, TOL), "{line}");
        }
    }
    // Labels too short: bare ids.
    assert!(m.to_csv(&[]).contains("\n4,4,"), "{}", m.to_csv(&[]));
    Ok(())
}

#[test]
fn safetensors_holds_dense_matrices() -> Result<()> {
    let m = hand_matrix()?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("vm.safetensors");
    m.save_safetensors(&path)?;
    let sd = StateDict::load(&path)?;
    for name in ["sum", "count", "mean", "row_normalized"] {
        let t = sd.get(name).unwrap_or_else(|| panic!("missing {name}"));
        assert_eq!(t.dims(), &[6, 6]);
    }
    let sum = sd
        .get("sum")
        .map(|t| t.to_vec2::<f64>())
        .transpose()?
        .unwrap_or_default();
    assert!(close(sum[4][4], 1.8, TOL));
    assert_eq!(
        sd.metadata().get("num_queries").map(String::as_str),
        Some("5")
    );
    assert_eq!(
        sd.metadata().get("vocab_size").map(String::as_str),
        Some("6")
    );
    Ok(())
}

fn tiny_model(vocab: usize) -> Result<NextTokenPredictor> {
    let cfg = NextTokenPredictorConfig {
        vocab_size: vocab,
        max_len: 8,
        embed_dim: 8,
        num_heads: 2,
        num_layers: 2,
        ff_dim: 16,
        dropout: 0.0,
        resid_dropout: 0.0,
    };
    let varmap = VarMap::new();
    Ok(NextTokenPredictor::new(
        cfg,
        seeded_var_builder(&varmap, 3, DType::F32, &Device::Cpu),
    )?)
}

/// Sequences of different lengths: padding appears in some batchings and not others, and the
/// matrix must not change.
#[test]
fn corpus_matrix_ignores_batching_and_padding() -> Result<()> {
    let model = tiny_model(9)?;
    let data = Dataset {
        examples: vec![
            Example::full(vec![2, 4, 5, 6, 3]),
            Example::full(vec![2, 7, 3]),
            Example::full(vec![2, 8, 8, 4, 5, 6, 3]),
            Example::full(vec![2, 5, 3]),
        ],
    };
    let positions: usize = data.examples.iter().map(|e| e.tokens.len() - 1).sum();
    let dev = Device::Cpu;
    for layer in 0..2 {
        for head in [None, Some(0), Some(1)] {
            let one = corpus_vocab_matrix(&model, &data, layer, head, 1, &dev)?;
            let all = corpus_vocab_matrix(&model, &data, layer, head, 4, &dev)?;
            assert_eq!(one.num_queries() as usize, positions);
            assert_eq!(all.num_queries() as usize, positions);
            assert!(
                close(all.total_mass(), positions as f64, 1e-4),
                "{}",
                all.total_mass()
            );
            // No padding id (0) anywhere.
            assert!(all.cells().iter().all(|((q, k), _)| *q != 0 && *k != 0));
            let (a, b) = (one.cells(), all.cells());
            assert_eq!(a.len(), b.len());
            for (x, y) in a.iter().zip(&b) {
                assert_eq!((x.0, x.1 .1), (y.0, y.1 .1));
                assert!(close(x.1 .0, y.1 .0, 1e-5), "{x:?} vs {y:?}");
            }
        }
    }
    // The mean over heads is the mean of the per-head matrices.
    let h0 = corpus_vocab_matrix(&model, &data, 1, Some(0), 2, &dev)?.sum()?;
    let h1 = corpus_vocab_matrix(&model, &data, 1, Some(1), 2, &dev)?.sum()?;
    let mean = corpus_vocab_matrix(&model, &data, 1, None, 2, &dev)?.sum()?;
    let diff = ((h0 + h1)? * 0.5 - mean)?
        .abs()?
        .max_all()?
        .to_scalar::<f64>()?;
    assert!(diff < 1e-5, "{diff}");
    Ok(())
}

#[test]
fn corpus_matrix_rejects_bad_layer_and_head() -> Result<()> {
    let model = tiny_model(9)?;
    let data = Dataset {
        examples: vec![Example::full(vec![2, 4, 3])],
    };
    let dev = Device::Cpu;
    let e = corpus_vocab_matrix(&model, &data, 2, None, 1, &dev)
        .unwrap_err()
        .to_string();
    assert!(e.contains("layer 2") && e.contains("2 layer(s)"), "{e}");
    let e = corpus_vocab_matrix(&model, &data, 0, Some(5), 1, &dev)
        .unwrap_err()
        .to_string();
    assert!(e.contains("head 5") && e.contains("2 head(s)"), "{e}");
    let e = corpus_vocab_matrix(&model, &data, 0, None, 0, &dev)
        .unwrap_err()
        .to_string();
    assert!(e.contains("batch_size 0"), "{e}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Attention graphs
// ---------------------------------------------------------------------------------------------

fn words() -> Vec<String> {
    labels(&["the", "cat", "sat"])
}

/// Row-stochastic, not symmetric.
fn a3() -> Result<Tensor> {
    Ok(Tensor::new(
        &[[0.7f64, 0.2, 0.1], [0.3, 0.5, 0.2], [0.05, 0.15, 0.8]],
        &Device::Cpu,
    )?)
}

fn edge_set(g: &AttentionGraph) -> Vec<(usize, usize, f64)> {
    g.edges.clone()
}

fn assert_edges(g: &AttentionGraph, expected: &[(usize, usize, f64)]) {
    let got = edge_set(g);
    assert_eq!(got.len(), expected.len(), "{got:?}");
    for (x, y) in got.iter().zip(expected) {
        assert_eq!((x.0, x.1), (y.0, y.1), "{got:?}");
        assert!(close(x.2, y.2, TOL), "{got:?}");
    }
}

#[test]
fn self_attention_graph_is_directed_with_shared_nodes() -> Result<()> {
    let g = AttentionGraph::from_matrix(&a3()?, &words(), &words(), &GraphOptions::default())?;
    assert_eq!(g.nodes, words());
    assert!(g.directed);
    assert_eq!(g.key_offset, 0);
    assert_eq!(g.num_query_nodes(), 3);
    assert_edges(
        &g,
        &[
            (0, 0, 0.7),
            (0, 1, 0.2),
            (0, 2, 0.1),
            (1, 0, 0.3),
            (1, 1, 0.5),
            (1, 2, 0.2),
            (2, 0, 0.05),
            (2, 1, 0.15),
            (2, 2, 0.8),
        ],
    );
    // The default threshold 0 drops exactly-zero (masked) weights.
    let causal = Tensor::new(&[[1.0f64, 0.0], [0.4, 0.6]], &Device::Cpu)?;
    let two = labels(&["a", "b"]);
    let g = AttentionGraph::from_matrix(&causal, &two, &two, &GraphOptions::default())?;
    assert_edges(&g, &[(0, 0, 1.0), (1, 0, 0.4), (1, 1, 0.6)]);
    Ok(())
}

#[test]
fn threshold_top_k_and_self_loops() -> Result<()> {
    let (a, w) = (a3()?, words());
    let opts = GraphOptions {
        threshold: 0.15,
        ..GraphOptions::default()
    };
    // Strictly greater than 0.15: 0.15 itself is dropped.
    let g = AttentionGraph::from_matrix(&a, &w, &w, &opts)?;
    assert_edges(
        &g,
        &[
            (0, 0, 0.7),
            (0, 1, 0.2),
            (1, 0, 0.3),
            (1, 1, 0.5),
            (1, 2, 0.2),
            (2, 2, 0.8),
        ],
    );
    let opts = GraphOptions {
        top_k: Some(1),
        ..GraphOptions::default()
    };
    let g = AttentionGraph::from_matrix(&a, &w, &w, &opts)?;
    assert_edges(&g, &[(0, 0, 0.7), (1, 1, 0.5), (2, 2, 0.8)]);
    // Self-loops go first, then top-k picks among the rest.
    let opts = GraphOptions {
        top_k: Some(1),
        self_loops: false,
        ..GraphOptions::default()
    };
    let g = AttentionGraph::from_matrix(&a, &w, &w, &opts)?;
    assert_edges(&g, &[(0, 1, 0.2), (1, 0, 0.3), (2, 1, 0.15)]);
    // Top-k ties: the smaller key index wins.
    let tie = Tensor::new(&[[0.25f64, 0.25, 0.5]], &Device::Cpu)?;
    let opts = GraphOptions {
        top_k: Some(2),
        ..GraphOptions::default()
    };
    let g = AttentionGraph::from_matrix(&tie, &labels(&["q"]), &w, &opts)?;
    assert_edges(&g, &[(0, 1, 0.25), (0, 3, 0.5)]);
    Ok(())
}

/// `(A + Aᵀ) / 2`: s01 = (0.2 + 0.3) / 2, s02 = (0.1 + 0.05) / 2, s12 = (0.2 + 0.15) / 2.
#[test]
fn symmetrize_gives_an_undirected_graph() -> Result<()> {
    let (a, w) = (a3()?, words());
    let opts = GraphOptions {
        symmetrize: true,
        ..GraphOptions::default()
    };
    let g = AttentionGraph::from_matrix(&a, &w, &w, &opts)?;
    assert!(!g.directed);
    assert_edges(
        &g,
        &[
            (0, 0, 0.7),
            (0, 1, 0.25),
            (0, 2, 0.075),
            (1, 1, 0.5),
            (1, 2, 0.175),
            (2, 2, 0.8),
        ],
    );
    let opts = GraphOptions {
        symmetrize: true,
        self_loops: false,
        threshold: 0.1,
        ..GraphOptions::default()
    };
    let g = AttentionGraph::from_matrix(&a, &w, &w, &opts)?;
    assert_edges(&g, &[(0, 1, 0.25), (1, 2, 0.175)]);
    assert!(g.to_dot().starts_with("graph attention {"));
    assert!(g.to_dot().contains("n0 -- n1"));
    assert!(g.to_graphml().contains("edgedefault=\"undirected\""));
    // Needs shared nodes.
    let e = AttentionGraph::from_matrix(&a, &w, &labels(&["x", "y", "z"]), &opts)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("symmetrize") && e.contains("different labels"),
        "{e}"
    );
    let rect = Tensor::new(&[[0.5f64, 0.5]], &Device::Cpu)?;
    let e = AttentionGraph::from_matrix(&rect, &labels(&["q"]), &labels(&["a", "b"]), &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("symmetrize") && e.contains("[1, 2]"), "{e}");
    Ok(())
}

#[test]
fn cross_attention_graph_is_bipartite() -> Result<()> {
    let m = Tensor::new(&[[0.6f32, 0.4, 0.0], [0.1, 0.2, 0.7]], &Device::Cpu)?;
    let (q, k) = (labels(&["x", "y"]), labels(&["a", "b", "c"]));
    let g = AttentionGraph::from_matrix(&m, &q, &k, &GraphOptions::default())?;
    assert_eq!(g.nodes, labels(&["x", "y", "a", "b", "c"]));
    assert_eq!(g.key_offset, 2);
    assert_eq!(g.num_query_nodes(), 2);
    let got: Vec<(usize, usize)> = g.edges.iter().map(|e| (e.0, e.1)).collect();
    assert_eq!(got, vec![(0, 2), (0, 3), (1, 2), (1, 3), (1, 4)]);
    assert!(g.to_dot().contains("subgraph cluster_queries"));
    let csv = g.to_csv_adjacency();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], ",a,b,c");
    assert_eq!(lines.len(), 3);
    // Square matrix, different labels: separate nodes too.
    let sq = Tensor::new(&[[1f32, 0.], [0., 1.]], &Device::Cpu)?;
    let g = AttentionGraph::from_matrix(
        &sq,
        &labels(&["a", "b"]),
        &labels(&["c", "d"]),
        &GraphOptions::default(),
    )?;
    assert_eq!(g.key_offset, 2);
    assert_eq!(g.edges, vec![(0, 2, 1.0), (1, 3, 1.0)]);
    Ok(())
}

#[test]
fn graph_errors_name_the_problem() -> Result<()> {
    let w = words();
    let dev = Device::Cpu;
    let opts = GraphOptions::default();
    let e = AttentionGraph::from_matrix(&a3()?.unsqueeze(0)?, &w, &w, &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("2-D") && e.contains("[1, 3, 3]"), "{e}");
    let e = AttentionGraph::from_matrix(&a3()?, &w[..2], &w, &opts)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("query_labels has 2") && e.contains("L = 3"),
        "{e}"
    );
    let e = AttentionGraph::from_matrix(&a3()?, &w, &w[..1], &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("key_labels has 1") && e.contains("S = 3"), "{e}");
    let nan = Tensor::new(&[[f64::NAN]], &dev)?;
    let e = AttentionGraph::from_matrix(&nan, &w[..1], &w[..1], &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("matrix[0][0] = NaN"), "{e}");
    let ints = Tensor::new(&[[1u32]], &dev)?;
    let e = AttentionGraph::from_matrix(&ints, &w[..1], &w[..1], &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("float") && e.contains("U32"), "{e}");
    let bad = GraphOptions {
        threshold: f64::NAN,
        ..GraphOptions::default()
    };
    assert!(AttentionGraph::from_matrix(&a3()?, &w, &w, &bad).is_err());
    Ok(())
}

#[test]
fn attention_is_not_symmetric() -> Result<()> {
    let a = a3()?;
    assert!(!is_symmetric(&a, 1e-6)?);
    // The largest gap is |A[0][1] - A[1][0]| = |0.2 - 0.3|.
    let (i, j, d) = max_asymmetry(&a)?.unwrap_or_default();
    assert_eq!((i, j), (0, 1));
    assert!(close(d, 0.1, TOL));
    assert!(is_symmetric(&a, 0.1 + 1e-9)?);
    let sym = ((&a + a.t()?)? * 0.5)?;
    assert!(is_symmetric(&sym, 0.0)?);
    let rect = Tensor::new(&[[0.5f64, 0.5]], &Device::Cpu)?;
    assert!(!is_symmetric(&rect, 1.0)?);
    assert!(max_asymmetry(&rect)?.is_none());
    assert!(is_symmetric(&a, -1.0).is_err());
    assert!(is_symmetric(&a.unsqueeze(0)?, 0.0).is_err());
    Ok(())
}

/// Node id → label, and edges (source id, target id, weight).
type ParsedDot = (HashMap<String, String>, Vec<(String, String, f64)>);

/// A tiny DOT reader for what `to_dot` writes: node labels and edges with their label weights.
fn parse_dot(dot: &str) -> ParsedDot {
    let unescape = |s: &str| {
        let mut out = String::new();
        let mut chars = s.chars();
        while let Some(c) = chars.next() {
            if c == '\\' {
                match chars.next() {
                    Some('n') => out.push('\n'),
                    Some(c) => out.push(c),
                    None => {}
                }
            } else {
                out.push(c);
            }
        }
        out
    };
    // The quoted `label="..."` value starting after `label="`, honouring backslash escapes.
    let quoted = |s: &str| -> String {
        let start = s.find("label=\"").map(|p| p + 7).unwrap_or(0);
        let mut end = start;
        let bytes = s.as_bytes();
        while end < bytes.len() && bytes[end] != b'"' {
            end += if bytes[end] == b'\\' { 2 } else { 1 };
        }
        unescape(&s[start..end])
    };
    let (mut nodes, mut edges) = (HashMap::new(), Vec::new());
    for line in dot.lines().map(str::trim) {
        let Some((head, _)) = line.split_once(" [") else {
            continue;
        };
        let parts: Vec<&str> = head.split_whitespace().collect();
        match parts.as_slice() {
            [a, "->" | "--", b] => edges.push((
                a.to_string(),
                b.to_string(),
                quoted(line).parse().unwrap_or(f64::NAN),
            )),
            // Node statements only (`node [...]` sets defaults).
            [n] if n.starts_with('n') && n[1..].bytes().all(|b| b.is_ascii_digit()) => {
                nodes.insert(n.to_string(), quoted(line));
            }
            _ => {}
        }
    }
    (nodes, edges)
}

fn tricky_labels() -> Vec<String> {
    labels(&["say \"hi\"", "a<b&c>", "back\\slash", "it's"])
}

fn tricky_matrix() -> Result<Tensor> {
    Ok(Tensor::new(
        &[
            [0.123456789f64, 0.3, 0.276543211, 0.3],
            [0.0, 1.0, 0.0, 0.0],
            [1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0, 0.0],
            [0.01, 0.02, 0.03, 0.94],
        ],
        &Device::Cpu,
    )?)
}

#[test]
fn dot_export_parses_back() -> Result<()> {
    let names = tricky_labels();
    let g =
        AttentionGraph::from_matrix(&tricky_matrix()?, &names, &names, &GraphOptions::default())?;
    let dot = g.to_dot();
    assert!(dot.starts_with("digraph attention {"), "{dot}");
    assert!(dot.trim_end().ends_with('}'));
    let (nodes, edges) = parse_dot(&dot);
    assert_eq!(nodes.len(), 4);
    for (i, name) in names.iter().enumerate() {
        assert_eq!(nodes.get(&format!("n{i}")), Some(name), "{dot}");
    }
    assert_eq!(edges.len(), g.edges.len());
    for (parsed, e) in edges.iter().zip(&g.edges) {
        assert_eq!(parsed.0, format!("n{}", e.0));
        assert_eq!(parsed.1, format!("n{}", e.1));
        // Printed with 6 decimals.
        assert!(close(parsed.2, e.2, 5e-7), "{parsed:?} vs {e:?}");
    }
    // Pen widths: the heaviest edge is drawn at 5.
    assert!(
        dot.contains("n1 -> n1 [label=\"1.000000\", penwidth=5.000]"),
        "{dot}"
    );
    Ok(())
}

/// One XML tag or text run.
#[derive(Debug)]
enum Xml {
    Open(String, HashMap<String, String>),
    Close(String),
    Text(String),
}

fn xml_unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

/// A tiny XML tokenizer: tags with attributes (double-quoted), text, `<?…?>` skipped. Checks
/// that tags nest properly and that no raw `<`/`&`-less entity slips into text.
fn scan_xml(xml: &str) -> Vec<Xml> {
    let mut out = Vec::new();
    let mut stack: Vec<String> = Vec::new();
    let mut rest = xml;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("<?") {
            let end = after.find("?>").expect("unterminated <?");
            rest = &after[end + 2..];
        } else if let Some(after) = rest.strip_prefix("</") {
            let end = after.find('>').expect("unterminated </");
            let name = after[..end].trim().to_string();
            assert_eq!(
                stack.pop().as_deref(),
                Some(name.as_str()),
                "mismatched </{name}>"
            );
            out.push(Xml::Close(name));
            rest = &after[end + 1..];
        } else if let Some(after) = rest.strip_prefix('<') {
            // Attribute values hold no '>' (it is escaped), so the tag ends at the first '>'.
            let end = after.find('>').expect("unterminated <");
            let mut body = &after[..end];
            let empty = body.ends_with('/');
            if empty {
                body = &body[..body.len() - 1];
            }
            let (name, mut attrs_src) = body.split_once(char::is_whitespace).unwrap_or((body, ""));
            let mut attrs = HashMap::new();
            loop {
                attrs_src = attrs_src.trim_start();
                let Some((k, v)) = attrs_src.split_once("=\"") else {
                    break;
                };
                let close = v.find('"').expect("unterminated attribute");
                assert!(!v[..close].contains('<'), "raw < in attribute");
                attrs.insert(k.trim().to_string(), xml_unescape(&v[..close]));
                attrs_src = &v[close + 1..];
            }
            if !empty {
                stack.push(name.to_string());
            }
            out.push(Xml::Open(name.to_string(), attrs));
            rest = &after[end + 1..];
        } else {
            let end = rest.find('<').unwrap_or(rest.len());
            let text = &rest[..end];
            assert!(!text.contains('>'), "raw > in text {text:?}");
            if !text.trim().is_empty() {
                out.push(Xml::Text(xml_unescape(text)));
            }
            rest = &rest[end..];
        }
    }
    assert!(stack.is_empty(), "unclosed tags {stack:?}");
    out
}

/// GraphML → (node id → label, edges (source, target, weight), the edge default, whether
/// the `weight` key is declared as a double on edges).
type ParsedGraphml = (
    HashMap<String, String>,
    Vec<(String, String, f64)>,
    String,
    bool,
);

fn parse_graphml(xml: &str) -> ParsedGraphml {
    let (mut nodes, mut edges) = (HashMap::new(), Vec::new());
    let (mut edgedefault, mut weight_key) = (String::new(), false);
    let mut node: Option<String> = None;
    let mut edge: Option<(String, String)> = None;
    let mut data_key: Option<String> = None;
    for t in scan_xml(xml) {
        match t {
            Xml::Open(name, a) => match name.as_str() {
                "key" => {
                    weight_key |= a.get("id").map(String::as_str) == Some("weight")
                        && a.get("for").map(String::as_str) == Some("edge")
                        && a.get("attr.type").map(String::as_str) == Some("double");
                }
                "graph" => edgedefault = a.get("edgedefault").cloned().unwrap_or_default(),
                "node" => node = a.get("id").cloned(),
                "edge" => edge = Some((a["source"].clone(), a["target"].clone())),
                "data" => data_key = a.get("key").cloned(),
                _ => {}
            },
            Xml::Text(text) => match (data_key.as_deref(), &node, &edge) {
                (Some("label"), Some(n), _) => {
                    nodes.insert(n.clone(), text);
                }
                (Some("weight"), _, Some((s, d))) => {
                    edges.push((s.clone(), d.clone(), text.parse().unwrap_or(f64::NAN)))
                }
                _ => {}
            },
            Xml::Close(name) => match name.as_str() {
                "node" => node = None,
                "edge" => edge = None,
                "data" => data_key = None,
                _ => {}
            },
        }
    }
    (nodes, edges, edgedefault, weight_key)
}

#[test]
fn graphml_export_parses_back_exactly() -> Result<()> {
    let names = tricky_labels();
    let opts = GraphOptions {
        threshold: 0.005,
        top_k: Some(3),
        ..GraphOptions::default()
    };
    let g = AttentionGraph::from_matrix(&tricky_matrix()?, &names, &names, &opts)?;
    let xml = g.to_graphml();
    assert!(xml.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>"));
    let (nodes, edges, edgedefault, weight_key) = parse_graphml(&xml);
    assert!(weight_key, "{xml}");
    assert_eq!(edgedefault, "directed");
    for (i, name) in names.iter().enumerate() {
        assert_eq!(nodes.get(&format!("n{i}")), Some(name), "{xml}");
    }
    assert_eq!(edges.len(), g.edges.len());
    for (parsed, e) in edges.iter().zip(&g.edges) {
        assert_eq!(
            (parsed.0.clone(), parsed.1.clone()),
            (format!("n{}", e.0), format!("n{}", e.1))
        );
        // Written in shortest round-trip form: the same f64 comes back.
        assert_eq!(parsed.2, e.2, "{xml}");
    }
    Ok(())
}

#[test]
fn csv_adjacency_holds_the_kept_edges() -> Result<()> {
    let (a, w) = (a3()?, words());
    let opts = GraphOptions {
        top_k: Some(2),
        ..GraphOptions::default()
    };
    let g = AttentionGraph::from_matrix(&a, &w, &w, &opts)?;
    let csv = g.to_csv_adjacency();
    let lines: Vec<Vec<String>> = csv.lines().map(csv_split).collect();
    assert_eq!(lines[0], labels(&["", "the", "cat", "sat"]));
    let expected = [[0.7, 0.2, 0.0], [0.3, 0.5, 0.0], [0.0, 0.15, 0.8]];
    for (i, row) in expected.iter().enumerate() {
        assert_eq!(lines[i + 1][0], w[i]);
        for (j, want) in row.iter().enumerate() {
            assert_eq!(lines[i + 1][j + 1].parse::<f64>()?, *want, "{csv}");
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Rollout and flow
// ---------------------------------------------------------------------------------------------

fn m3(rows: [[f64; 3]; 3]) -> Result<Tensor> {
    Ok(Tensor::new(&rows, &Device::Cpu)?)
}

/// Causal, row-stochastic layers.
fn layer1() -> Result<Tensor> {
    m3([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
}

fn layer2() -> Result<Tensor> {
    m3([[1.0, 0.0, 0.0], [0.4, 0.6, 0.0], [0.1, 0.6, 0.3]])
}

/// A2 · A1 by hand:
/// - row 1: 0.4·[1,0,0] + 0.6·[0.5,0.5,0] = [0.7, 0.3, 0]
/// - row 2: 0.1·[1,0,0] + 0.6·[0.5,0.5,0] + 0.3·[0.2,0.3,0.5] = [0.46, 0.39, 0.15]
#[test]
fn rollout_is_the_product_of_the_layers() -> Result<()> {
    let r = attention_rollout(&[layer1()?, layer2()?], RolloutFusion::Mean, false, 0.0)?;
    assert_eq!(r.dtype(), DType::F64);
    assert_matrix(
        &r,
        &[&[1.0, 0.0, 0.0], &[0.7, 0.3, 0.0], &[0.46, 0.39, 0.15]],
        TOL,
    )?;
    // f32 layers give an f32 result.
    let r32 = attention_rollout(
        &[
            layer1()?.to_dtype(DType::F32)?,
            layer2()?.to_dtype(DType::F32)?,
        ],
        RolloutFusion::Mean,
        false,
        0.0,
    )?;
    assert_eq!(r32.dtype(), DType::F32);
    assert_matrix(
        &r32,
        &[&[1.0, 0.0, 0.0], &[0.7, 0.3, 0.0], &[0.46, 0.39, 0.15]],
        1e-6,
    )?;
    Ok(())
}

/// With the residual: A1' = 0.5 A1 + 0.5 I = [[1,0,0],[0.25,0.75,0],[0.1,0.15,0.75]],
/// A2' = [[1,0,0],[0.2,0.8,0],[0.05,0.3,0.65]], and A2' · A1':
/// - row 1: 0.2·[1,0,0] + 0.8·[0.25,0.75,0] = [0.4, 0.6, 0]
/// - row 2: 0.05·[1,0,0] + 0.3·[0.25,0.75,0] + 0.65·[0.1,0.15,0.75] = [0.19, 0.3225, 0.4875]
#[test]
fn rollout_with_residual() -> Result<()> {
    let r = attention_rollout(&[layer1()?, layer2()?], RolloutFusion::Mean, true, 0.0)?;
    assert_matrix(
        &r,
        &[&[1.0, 0.0, 0.0], &[0.4, 0.6, 0.0], &[0.19, 0.3225, 0.4875]],
        TOL,
    )?;
    Ok(())
}

#[test]
fn rollout_fuses_heads() -> Result<()> {
    // Two heads whose mean is layer 1.
    let d = m3([[0.0, 0.0, 0.0], [0.1, -0.1, 0.0], [0.1, 0.0, -0.1]])?;
    let heads = Tensor::stack(&[(layer1()? + &d)?, (layer1()? - &d)?], 0)?;
    let r = attention_rollout(&[heads, layer2()?], RolloutFusion::Mean, false, 0.0)?;
    assert_matrix(
        &r,
        &[&[1.0, 0.0, 0.0], &[0.7, 0.3, 0.0], &[0.46, 0.39, 0.15]],
        TOL,
    )?;
    // Max of [[1,0],[0,1]] and [[0,1],[1,0]] is all ones: rows renormalise to 0.5.
    let dev = Device::Cpu;
    let swap = Tensor::new(&[[[1f64, 0.], [0., 1.]], [[0., 1.], [1., 0.]]], &dev)?;
    let r = attention_rollout(std::slice::from_ref(&swap), RolloutFusion::Max, false, 0.0)?;
    assert_matrix(&r, &[&[0.5, 0.5], &[0.5, 0.5]], TOL)?;
    // Min is all zeros; zero rows stay zero (no division by zero).
    let r = attention_rollout(std::slice::from_ref(&swap), RolloutFusion::Min, false, 0.0)?;
    assert_matrix(&r, &[&[0.0, 0.0], &[0.0, 0.0]], 0.0)?;
    // With the residual, Min leaves the identity.
    let r = attention_rollout(&[swap], RolloutFusion::Min, true, 0.0)?;
    assert_matrix(&r, &[&[1.0, 0.0], &[0.0, 1.0]], TOL)?;
    Ok(())
}

/// floor(0.34 · 9) = 3 lowest entries dropped: 0.1 at [0][2], 0.1 at [1][2], 0.2 at [1][0];
/// rows renormalised: [0.6, 0.3, 0] / 0.9 and [0, 0.7, 0] / 0.7.
#[test]
fn discard_ratio_drops_the_lowest_weights_but_not_the_diagonal() -> Result<()> {
    let a = m3([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.25, 0.25, 0.5]])?;
    let r = attention_rollout(std::slice::from_ref(&a), RolloutFusion::Mean, false, 0.34)?;
    assert_matrix(
        &r,
        &[
            &[2.0 / 3.0, 1.0 / 3.0, 0.0],
            &[0.0, 1.0, 0.0],
            &[0.25, 0.25, 0.5],
        ],
        TOL,
    )?;
    // floor(0.12 · 9) = 1: the lowest entry is the diagonal [0][0], which is kept.
    let b = m3([[0.05, 0.5, 0.45], [0.2, 0.7, 0.1], [0.25, 0.25, 0.5]])?;
    let r = attention_rollout(std::slice::from_ref(&b), RolloutFusion::Mean, false, 0.12)?;
    assert_matrix(
        &r,
        &[&[0.05, 0.5, 0.45], &[0.2, 0.7, 0.1], &[0.25, 0.25, 0.5]],
        TOL,
    )?;
    Ok(())
}

#[test]
fn rollout_errors() -> Result<()> {
    let dev = Device::Cpu;
    let e = attention_rollout(&[], RolloutFusion::Mean, false, 0.0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("layers is empty"), "{e}");
    let two = Tensor::new(&[[1f64, 0.], [0.5, 0.5]], &dev)?;
    let e = attention_rollout(&[layer1()?, two.clone()], RolloutFusion::Mean, false, 0.0)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("layers[1] has L = 2") && e.contains("L = 3"),
        "{e}"
    );
    let rect = Tensor::new(&[[1f64, 0., 0.], [0.5, 0.5, 0.]], &dev)?;
    let e = attention_rollout(&[rect], RolloutFusion::Mean, false, 0.0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("layers[0]") && e.contains("[2, 3]"), "{e}");
    let e = attention_rollout(std::slice::from_ref(&two), RolloutFusion::Mean, false, 1.0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("discard_ratio = 1"), "{e}");
    let e = attention_flow(
        &[two.unsqueeze(0)?.unsqueeze(0)?],
        RolloutFusion::Mean,
        false,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("[1, 1, 2, 2]"), "{e}");
    let long = Tensor::ones((65, 65), DType::F32, &dev)?;
    let e = attention_flow(&[long], RolloutFusion::Mean, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("length 65") && e.contains("64"), "{e}");
    Ok(())
}

/// Two layers over L = 2: A1 = [[1, 0], [0.5, 0.5]], A2 = [[0.5, 0.5], [0, 1]].
/// Paths from top node i to input j pass through one middle node k with capacity
/// min(A2[i][k], A1[k][j]); they share no edge, so the max-flow is their sum:
/// - (0,0): min(.5, 1) + min(.5, .5) = 1.0      - (0,1): min(.5, 0) + min(.5, .5) = 0.5
/// - (1,0): min(0, 1) + min(1, .5) = 0.5        - (1,1): min(0, 0) + min(1, .5) = 0.5
///
/// whereas rollout A2 · A1 = [[0.75, 0.25], [0.5, 0.5]].
#[test]
fn attention_flow_on_a_hand_made_example() -> Result<()> {
    let dev = Device::Cpu;
    let a1 = Tensor::new(&[[1.0f64, 0.0], [0.5, 0.5]], &dev)?;
    let a2 = Tensor::new(&[[0.5f64, 0.5], [0.0, 1.0]], &dev)?;
    let layers = [a1, a2];
    let flow = attention_flow(&layers, RolloutFusion::Mean, false)?;
    assert_matrix(&flow, &[&[1.0, 0.5], &[0.5, 0.5]], TOL)?;
    let roll = attention_rollout(&layers, RolloutFusion::Mean, false, 0.0)?;
    assert_matrix(&roll, &[&[0.75, 0.25], &[0.5, 0.5]], TOL)?;
    // One layer: the flow is the matrix itself.
    let one = attention_flow(&layers[..1], RolloutFusion::Mean, false)?;
    assert_matrix(&one, &[&[1.0, 0.0], &[0.5, 0.5]], TOL)?;
    // With the residual, A1' = [[1, 0], [0.25, 0.75]], A2' = [[0.75, 0.25], [0, 1]]:
    // (0,0): min(.75, 1) + min(.25, .25) = 1.0; (0,1): 0 + min(.25, .75) = 0.25;
    // (1,0): 0 + min(1, .25) = 0.25; (1,1): 0 + min(1, .75) = 0.75.
    let res = attention_flow(&layers, RolloutFusion::Mean, true)?;
    assert_matrix(&res, &[&[1.0, 0.25], &[0.25, 0.75]], TOL)?;
    Ok(())
}

/// Three layers, where flow can split and merge: compare with the minimum cut found by
/// enumerating every cut of the layered graph.
#[test]
// Node positions index both the matrices and the flow: plain index loops read best here.
#[allow(clippy::needless_range_loop)]
fn attention_flow_equals_brute_force_min_cut() -> Result<()> {
    let mats = [
        [[0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.5, 0.1, 0.4]],
        [[0.1, 0.8, 0.1], [0.3, 0.3, 0.4], [0.7, 0.2, 0.1]],
        [[0.25, 0.25, 0.5], [0.9, 0.05, 0.05], [0.2, 0.6, 0.2]],
    ];
    let layers: Vec<Tensor> = mats.iter().map(|m| m3(*m)).collect::<Result<_>>()?;
    let flow = attention_flow(&layers, RolloutFusion::Mean, false)?.to_vec2::<f64>()?;
    let l = 3;
    // Node (layer, pos) has id layer·3 + pos; edge (ℓ, i) → (ℓ-1, j) has capacity
    // mats[ℓ-1][i][j]. Layer-0 nodes other than the sink have no out-edges, so they sit on
    // the source side of a minimum cut; the other top nodes have no in-edges, so they sit on
    // the sink side. Only the 6 middle nodes need enumerating.
    for i in 0..l {
        for j in 0..l {
            let mut best = f64::INFINITY;
            for subset in 0u32..64 {
                let source_side = |layer: usize, pos: usize| match layer {
                    3 => pos == i,
                    0 => pos != j,
                    _ => subset & (1 << ((layer - 1) * 3 + pos)) != 0,
                };
                let mut cut = 0.0;
                for layer in 1..=3 {
                    for a in 0..l {
                        for b in 0..l {
                            if source_side(layer, a) && !source_side(layer - 1, b) {
                                cut += mats[layer - 1][a][b];
                            }
                        }
                    }
                }
                best = best.min(cut);
            }
            assert!(
                close(flow[i][j], best, 1e-9),
                "({i},{j}): flow {} vs cut {best}",
                flow[i][j]
            );
        }
    }
    // Heads are fused before the flow: (H, L, L) with equal heads gives the same result.
    let heads: Vec<Tensor> = layers
        .iter()
        .map(|t| Tensor::stack(&[t, t], 0))
        .collect::<candle_mha::candle::Result<_>>()?;
    let fused = attention_flow(&heads, RolloutFusion::Max, false)?.to_vec2::<f64>()?;
    for (a, b) in fused.iter().flatten().zip(flow.iter().flatten()) {
        assert!(close(*a, *b, 1e-12));
    }
    Ok(())
}

/// A 64-token, 2-layer flow runs (the documented limit) and each entry is within [0, 1].
#[test]
fn attention_flow_at_the_limit() -> Result<()> {
    let dev = Device::Cpu;
    let layers: Vec<Tensor> = (0..2)
        .map(|s| {
            let x = candle_mha::rng::normal(0., 1., (2, 64, 64), DType::F32, &dev, s)?;
            candle_nn::ops::softmax_last_dim(&x)
        })
        .collect::<candle_mha::candle::Result<_>>()?;
    let t = std::time::Instant::now();
    let flow = attention_flow(&layers, RolloutFusion::Mean, true)?;
    println!("64 x 64, 2 layers: {:?}", t.elapsed());
    let v = flow.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    assert!(v.iter().all(|x| (-1e-9..=1.0 + 1e-6).contains(x)));
    // Rollout of the same layers stays row-stochastic.
    let roll = attention_rollout(&layers, RolloutFusion::Mean, true, 0.0)?;
    let rows = roll.to_dtype(DType::F64)?.sum(1)?.to_vec1::<f64>()?;
    assert!(rows.iter().all(|s| close(*s, 1.0, 1e-5)), "{rows:?}");
    Ok(())
}
