//! The main example: build an `nn.MultiheadAttention`-equivalent module, run it with masks,
//! print the attention weights, and take one gradient step.
//!
//! ```text
//! cargo run --release --example quickstart                # built-in defaults
//! cargo run --release --example quickstart -- 32 8 6     # embed_dim num_heads seq_len
//! ```

use anyhow::{Context, Result};
use candle_mha::attention::mask::causal_mask;
use candle_mha::candle::{DType, Tensor, D};
use candle_mha::{
    seeded_var_builder, AttentionOptions, MultiheadAttention, MultiheadAttentionConfig,
};
use candle_nn::{Optimizer, VarMap, SGD};

fn main() -> Result<()> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| {
            a.parse()
                .context("arguments are: embed_dim num_heads seq_len")
        })
        .collect::<Result<_>>()?;
    let (embed_dim, num_heads, seq_len) = match args.as_slice() {
        [] => (16, 4, 5),
        [e, h, l] => (*e, *h, *l),
        _ => anyhow::bail!("arguments are: embed_dim num_heads seq_len"),
    };
    // The device from `MHA_DEVICE` (default `auto`), freed GPU memory kept for reuse.
    let spec = std::env::var("MHA_DEVICE").unwrap_or_else(|_| "auto".into());
    let (device, notice) = candle_mha::device::select_device(&spec)?;
    candle_mha::runtime::keep_freed_gpu_memory(&device)?;
    eprintln!("{notice}");
    let batch = 2;

    // torch.nn.MultiheadAttention(embed_dim, num_heads, batch_first=True), seeded.
    let varmap = VarMap::new();
    let vb = seeded_var_builder(&varmap, 0, DType::F32, &device);
    let cfg = MultiheadAttentionConfig::new(embed_dim, num_heads).with_batch_first(true);
    let mha = MultiheadAttention::new(cfg, vb)?;
    println!("MultiheadAttention(embed_dim={embed_dim}, num_heads={num_heads}, batch_first=True)");
    for (name, t) in mha.named_parameters() {
        println!("  {name:<16} {:?}", t.dims());
    }
    println!(
        "  parameters: {} (independent of num_heads)",
        mha.num_parameters()
    );

    // Causal self-attention; the second sequence's last key is padding (u8: 1 = masked).
    let x = candle_mha::rng::normal(0., 1., (batch, seq_len, embed_dim), DType::F32, &device, 1)?;
    let mut pad = vec![0u8; batch * seq_len];
    pad[2 * seq_len - 1] = 1;
    let kpm = Tensor::from_vec(pad, (batch, seq_len), &device)?;
    let opts = AttentionOptions::new()
        .with_attn_mask(causal_mask(seq_len, seq_len, &device)?)
        .with_key_padding_mask(kpm);
    let out = mha.forward(&x, &x, &x, &opts)?;
    let weights = out.weights.context("need_weights is on")?;
    println!(
        "\noutput {:?}, weights {:?} (N, L, S), averaged over heads",
        out.output.dims(),
        weights.dims()
    );
    println!("weights of sequence 1 (row = query, column = key):");
    for row in weights.get(1)?.to_vec2::<f32>()? {
        println!(
            "  {}",
            row.iter()
                .map(|w| format!("{w:6.3}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    println!(
        "row sums: {:?}",
        weights.get(1)?.sum(D::Minus1)?.to_vec1::<f32>()?
    );

    // One SGD step on a toy loss: every parameter gets a gradient.
    let mut sgd = SGD::new(varmap.all_vars(), 0.1)?;
    let loss = out.output.sqr()?.mean_all()?;
    sgd.backward_step(&loss)?;
    let after = mha.forward(&x, &x, &x, &opts)?.output.sqr()?.mean_all()?;
    println!(
        "\nloss {:.5} -> {:.5} after one SGD step",
        loss.to_scalar::<f32>()?,
        after.to_scalar::<f32>()?
    );
    Ok(())
}
