//! The classic self-attention walkthrough on real word vectors, step by step:
//! cosine similarity → cosine "attention" → softmax(QKᵀ/√d)·V with Q = K = V = X → the same
//! numbers from `MultiheadAttention` with identity projections → heatmaps of the weights.
//!
//! ```text
//! cargo run --release --example glove_walkthrough [VECTORS.txt] [OUT_DIR]
//! ```
//! `VECTORS.txt` defaults to the small file shipped in `weights/` (see weights/README.md); the
//! real `glove.6B.50d.txt` works too. `OUT_DIR` defaults to `target/glove_walkthrough`.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use candle_mha::candle::{DType, Tensor};
use candle_mha::{AttentionOptions, MultiheadAttention, MultiheadAttentionConfig};
use candle_mha_viz::heatmap::{heatmap_png, heatmap_svg, save, HeatmapOptions};
use candle_mha_viz::table::{format_table, TableOptions};
use candle_mha_viz::word_vectors::{cosine_attention, load_glove, self_attention};
use candle_nn::VarBuilder;

const SENTENCE: &str = "the cat sat on the mat";
/// Output vectors are D-dimensional; print only their first few features.
const SHOW_DIMS: usize = 8;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let vectors_path = match args.first() {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(concat!(
            env!("MHA_WORKSPACE_DIR"),
            "/weights/wordllama_l2_1500w_64d.txt"
        )),
    };
    let out_dir = PathBuf::from(args.get(1).map_or("target/glove_walkthrough", |s| s));

    println!("1. Load word vectors from {}", vectors_path.display());
    let wv = load_glove(&vectors_path)?;
    println!("   {} words, dimension d = {}", wv.len(), wv.dim());

    // Keep the words this file has (real GloVe has them all; so does the shipped file).
    let words: Vec<&str> = SENTENCE
        .split(' ')
        .filter(|w| wv.index(w).is_some())
        .collect();
    if words.len() < 2 {
        bail!(
            "fewer than two words of {SENTENCE:?} are in {}",
            vectors_path.display()
        );
    }
    let labels: Vec<String> = words.iter().map(|w| w.to_string()).collect();
    // The device from `MHA_DEVICE` (default `auto`), freed GPU memory kept for reuse.
    let spec = std::env::var("MHA_DEVICE").unwrap_or_else(|_| "auto".into());
    let (device, notice) = candle_mha::device::select_device(&spec)?;
    candle_mha::runtime::keep_freed_gpu_memory(&device)?;
    eprintln!("{notice}");
    let x = wv.stack(&words)?.to_device(&device)?; // (L, d)
    let (l, d) = x.dims2()?;
    println!("\n2. The sentence {:?} as X: ({l}, {d})", words.join(" "));

    let dims: Vec<String> = (0..SHOW_DIMS.min(d)).map(|k| format!("x{k}")).collect();
    let show = |title: &str, m: &Tensor, cols: &[String]| -> Result<()> {
        let m = m.narrow(1, 0, cols.len())?;
        let opts = TableOptions {
            title: Some(title.to_string()),
            ..TableOptions::default()
        };
        print!("{}", format_table(&m, &labels, cols, &opts)?);
        Ok(())
    };

    println!("\n3. Cosine similarity: how alike each pair of words is (1 on the diagonal)");
    let (cos_out, cos) = cosine_attention(&x)?;
    show("   cos(x_i, x_j)", &cos, &labels)?;

    println!("\n4. Cosine attention: output_i = sum_j cos(x_i, x_j) x_j (no softmax)");
    show(
        &format!("   output, first {} of {d} features", dims.len()),
        &cos_out,
        &dims,
    )?;

    println!("\n5. Scaled dot-product self-attention, Q = K = V = X:");
    println!("   weights = softmax(X X^T / sqrt({d})), output = weights X");
    let (out, weights) = self_attention(&x)?;
    show("   weights (each row sums to 1)", &weights, &labels)?;
    show(
        &format!("   output, first {} of {d} features", dims.len()),
        &out,
        &dims,
    )?;

    println!("\n6. The same through MultiheadAttention: 1 head, bias=False,");
    println!("   in_proj_weight = [I; I; I], out_proj.weight = I");
    let eye = Tensor::eye(d, DType::F32, &device)?;
    let params: HashMap<String, Tensor> = HashMap::from([
        (
            "in_proj_weight".to_string(),
            Tensor::cat(&[&eye, &eye, &eye], 0)?,
        ),
        ("out_proj.weight".to_string(), eye),
    ]);
    let mha = MultiheadAttention::new(
        MultiheadAttentionConfig::new(d, 1).with_bias(false),
        VarBuilder::from_tensors(params, DType::F32, &device),
    )?;
    let mha_out = mha.forward(&x, &x, &x, &AttentionOptions::new())?;
    let mha_w = mha_out.weights.context("need_weights is on by default")?;
    let diff = |a: &Tensor, b: &Tensor| -> Result<f32> {
        Ok((a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?)
    };
    println!(
        "   max |output difference|  = {:.2e}",
        diff(&mha_out.output, &out)?
    );
    println!(
        "   max |weights difference| = {:.2e}",
        diff(&mha_w, &weights)?
    );

    println!("\n7. Heatmaps");
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let opts = HeatmapOptions {
        title: Some(format!("softmax(XX^T/sqrt({d}))")),
        ..HeatmapOptions::default()
    };
    let cos_opts = HeatmapOptions {
        title: Some("cosine similarity".into()),
        ..HeatmapOptions::default()
    };
    let files = [
        (
            "attention_weights.png",
            heatmap_png(&weights, &labels, &labels, &opts)?,
        ),
        (
            "attention_weights.svg",
            heatmap_svg(&weights, &labels, &labels, &opts)?.into_bytes(),
        ),
        (
            "cosine_similarity.png",
            heatmap_png(&cos, &labels, &labels, &cos_opts)?,
        ),
    ];
    for (name, bytes) in files {
        let path = out_dir.join(name);
        save(&path, &bytes)?;
        println!("   wrote {} ({} bytes)", path.display(), bytes.len());
    }
    Ok(())
}
