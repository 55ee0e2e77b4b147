//! An attention matrix as a weighted, directed graph: DOT and GraphML exports, a check that
//! the matrix is not symmetric, and attention rollout and flow through two layers.
//!
//! ```text
//! cargo run --release --example attention_graph              # writes target/attention_graph
//! cargo run --release --example attention_graph -- out_dir
//! dot -Tsvg target/attention_graph/attention.dot -o attention.svg
//! ```

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
use candle_mha::candle::{DType, Device, IndexOp, Tensor};
use candle_mha::io::write_atomic;
use candle_mha::rng::normal;
use candle_mha::{
    seeded_var_builder, AttentionOptions, MultiheadAttention, MultiheadAttentionConfig,
};
use candle_mha_viz::{
    attention_flow, attention_rollout, format_table, is_symmetric, max_asymmetry, AttentionGraph,
    GraphOptions, HeadFusion, TableOptions,
};
use candle_nn::VarMap;

const EMBED_DIM: usize = 16;
const NUM_HEADS: usize = 2;

/// A seeded, batch-first `nn.MultiheadAttention(16, 2)`.
fn mha(seed: u64, device: &Device) -> Result<MultiheadAttention> {
    let varmap = VarMap::new();
    let cfg = MultiheadAttentionConfig::new(EMBED_DIM, NUM_HEADS).with_batch_first(true);
    Ok(MultiheadAttention::new(
        cfg,
        seeded_var_builder(&varmap, seed, DType::F32, device),
    )?)
}

fn main() -> Result<()> {
    let out_dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "target/attention_graph".into()),
    );
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    // The device from `MHA_DEVICE` (default `auto`), freed GPU memory kept for reuse.
    let spec = std::env::var("MHA_DEVICE").unwrap_or_else(|_| "auto".into());
    let (device, notice) = candle_mha::device::select_device(&spec)?;
    candle_mha::runtime::keep_freed_gpu_memory(&device)?;
    eprintln!("{notice}");

    // "the" appears twice: the same word gets the same embedding (a seeded table).
    let words: Vec<String> = "the cat sat on the mat"
        .split(' ')
        .map(str::to_string)
        .collect();
    let mut ids: HashMap<&str, u32> = HashMap::new();
    for w in &words {
        let next = ids.len() as u32;
        ids.entry(w.as_str()).or_insert(next);
    }
    let table = normal(0., 1., (ids.len(), EMBED_DIM), DType::F32, &device, 11)?;
    let idx: Vec<u32> = words.iter().map(|w| ids[w.as_str()]).collect();
    let x = table
        .index_select(&Tensor::new(idx.as_slice(), &device)?, 0)?
        .unsqueeze(0)?; // (1, L, E)

    // One layer, heads averaged: (1, L, L) → (L, L).
    let layer1 = mha(1, &device)?;
    let out1 = layer1.forward(&x, &x, &x, &AttentionOptions::new())?;
    let a = out1
        .weights
        .context("need_weights is on by default")?
        .i(0)?;
    print!(
        "{}",
        format_table(
            &a,
            &words,
            &words,
            &TableOptions {
                title: Some("attention (row = query, column = key), heads averaged".into()),
                ..TableOptions::default()
            }
        )?
    );

    // Is it a symmetric (undirected) adjacency matrix? No.
    let sym = is_symmetric(&a, 1e-6)?;
    println!("\nsymmetric within 1e-6: {sym}: attention is a directed graph");
    if let Some((i, j, d)) = max_asymmetry(&a)? {
        let v = a.to_dtype(DType::F64)?.to_vec2::<f64>()?;
        println!(
            "largest asymmetry: A[{i}][{j}] ({} → {}) = {:.4} vs A[{j}][{i}] ({} → {}) = {:.4} \
             (|difference| {d:.4})",
            words[i], words[j], v[i][j], words[j], words[i], v[j][i]
        );
    }

    let opts = GraphOptions {
        threshold: 0.1,
        top_k: Some(3),
        ..GraphOptions::default()
    };
    let graph = AttentionGraph::from_matrix(&a, &words, &words, &opts)?;
    println!(
        "\ngraph (weight > {}, top {} per query): {} nodes, {} edges",
        opts.threshold,
        opts.top_k.unwrap_or(0),
        graph.nodes.len(),
        graph.edges.len()
    );
    let dot = graph.to_dot();
    print!("{dot}");
    let (dot_path, graphml_path, csv_path) = (
        out_dir.join("attention.dot"),
        out_dir.join("attention.graphml"),
        out_dir.join("attention_adjacency.csv"),
    );
    write_atomic(&dot_path, dot.as_bytes())?;
    write_atomic(&graphml_path, graph.to_graphml().as_bytes())?;
    write_atomic(&csv_path, graph.to_csv_adjacency().as_bytes())?;
    println!(
        "wrote {}, {} and {}",
        dot_path.display(),
        graphml_path.display(),
        csv_path.display()
    );

    // A tiny 2-layer model: x1 = x + mha1(x), then mha2(x1), per-head weights (H, L, L).
    let per_head = AttentionOptions::new().with_average_attn_weights(false);
    let o1 = layer1.forward(&x, &x, &x, &per_head)?;
    let x1 = (&x + &o1.output)?;
    let layer2 = mha(2, &device)?;
    let o2 = layer2.forward(&x1, &x1, &x1, &per_head)?;
    let layers = [
        o1.weights.context("weights")?.i(0)?,
        o2.weights.context("weights")?.i(0)?,
    ];
    let show = |title: &str, m: &Tensor| -> Result<()> {
        let opts = TableOptions {
            title: Some(title.into()),
            ..TableOptions::default()
        };
        print!("\n{}", format_table(m, &words, &words, &opts)?);
        Ok(())
    };
    show("layer 2 alone (heads averaged)", &layers[1].mean(0)?)?;
    let rollout = attention_rollout(&layers, HeadFusion::Mean, true, 0.0)?;
    show(
        "rollout through 2 layers (mean over heads, residual 0.5 A + 0.5 I)",
        &rollout,
    )?;
    let flow = attention_flow(&layers, HeadFusion::Mean, true)?;
    show(
        "attention flow through 2 layers (max-flow, same capacities)",
        &flow,
    )?;
    Ok(())
}
