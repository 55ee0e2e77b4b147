//! Attention graphs (`candle_mha_viz::graph`): edges kept by threshold and top-k,
//! symmetrising, cross-attention, errors, and the DOT, GraphML and CSV exports read back.

use candle_mha_test_support as common;

use std::collections::HashMap;

use anyhow::Result;
use candle_mha::candle::{Device, Tensor};
use candle_mha_viz::{is_symmetric, max_asymmetry, AttentionGraph, GraphOptions};
use common::xml::{read_xml, Xml};
use common::{close, csv, labels};

const TOL: f64 = 1e-12;

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
    for t in read_xml(xml) {
        match t {
            Xml::Open(e) => match e.name.as_str() {
                "key" => {
                    weight_key |= e.attr("id") == Some("weight")
                        && e.attr("for") == Some("edge")
                        && e.attr("attr.type") == Some("double");
                }
                "graph" => edgedefault = e.attr("edgedefault").unwrap_or_default().to_string(),
                "node" => node = e.attr("id").map(String::from),
                "edge" => edge = Some((e.attrs["source"].clone(), e.attrs["target"].clone())),
                "data" => data_key = e.attr("key").map(String::from),
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
    let lines: Vec<Vec<String>> = csv.lines().map(csv::split_line).collect();
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
