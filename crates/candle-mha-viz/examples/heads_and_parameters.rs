//! What the number of heads changes and what it does not: parameter counts, the all-ones
//! module, the per-head split of the features, and per-head statistics and ablation of a
//! seeded random module.
//!
//! ```text
//! cargo run --release --example heads_and_parameters
//! ```

use anyhow::{Context, Result};
use candle_mha::candle::{DType, Device, Tensor};
use candle_mha::{
    seeded_var_builder, AttentionOptions, MultiheadAttention, MultiheadAttentionConfig,
};
use candle_mha_viz::{format_table, head_ablation, head_stats, TableOptions};
use candle_nn::VarMap;

fn main() -> Result<()> {
    parameter_counts()?;
    all_ones()?;
    identity_split()?;
    random_module()?;
    Ok(())
}

fn labels<T: ToString>(v: impl IntoIterator<Item = T>) -> Vec<String> {
    v.into_iter().map(|s| s.to_string()).collect()
}

/// A change to the default configuration.
type Variant = fn(MultiheadAttentionConfig) -> MultiheadAttentionConfig;

/// E = 16 and H from 1 to 16: every count is the same down a column.
fn parameter_counts() -> Result<()> {
    let heads = [1, 2, 4, 8, 16];
    let variants: [(&str, Variant); 4] = [
        ("default", |c| c),
        ("bias=False", |c| c.with_bias(false)),
        ("add_bias_kv", |c| c.with_add_bias_kv(true)),
        ("kdim=8,vdim=4", |c| c.with_kdim(8).with_vdim(4)),
    ];
    let mut counts = Vec::new();
    for h in heads {
        for (_, variant) in &variants {
            let mha = MultiheadAttention::new(
                variant(MultiheadAttentionConfig::new(16, h)),
                seeded_var_builder(&VarMap::new(), 0, DType::F32, &Device::Cpu),
            )?;
            counts.push(mha.num_parameters() as f64);
        }
    }
    let table = Tensor::from_vec(counts, (heads.len(), variants.len()), &Device::Cpu)?;
    let opts = TableOptions {
        decimals: 0,
        title: Some("== 1. Parameters of MultiheadAttention(embed_dim=16, num_heads=H) ==".into()),
        ..TableOptions::default()
    };
    print!(
        "{}",
        format_table(
            &table,
            &labels(heads.iter().map(|h| format!("H={h}"))),
            &labels(variants.iter().map(|(name, _)| name)),
            &opts
        )?
    );
    println!(
        "H only splits E=16 into H slices of 16/H features: in_proj 3·16·16 + 3·16 bias, \
         out_proj 16·16 + 16 = 1088 for every H.\n"
    );
    Ok(())
}

/// Every weight and bias one: the output does not depend on H, but only for tokens with equal
/// feature sums.
fn all_ones() -> Result<()> {
    println!("== 2. Every weight and bias = 1 (E = 8) ==");
    let e = 8;
    let equal_sums = Tensor::new(
        &[
            [0.5f32, -1., 2., 0., 1., 1., -0.5, -1.],
            [1., 0., 0., 1., 2., -2., 0.5, -0.5],
            [0., 0., 1., 1., 0., 1., 0., -1.],
        ],
        &Device::Cpu,
    )?;
    let unequal_sums = Tensor::new(
        &[
            [0.5f32, 0., 0., 0., 0., 0., 0., 0.],
            [0., 0.25, 0., 0., 0., 0., 0., 0.],
            [0., 0., -0.5, 0., 0., 0., 0., 0.],
        ],
        &Device::Cpu,
    )?;
    for (name, x) in [("equal", &equal_sums), ("unequal", &unequal_sums)] {
        let sums = x.sum(1)?.to_vec1::<f32>()?;
        println!("tokens with {name} feature sums {sums:?}: output[0] for each H");
        for h in [1, 2, 4, 8] {
            let ones = |shape: &[usize]| Tensor::ones(shape, DType::F32, &Device::Cpu);
            let mha = MultiheadAttention::from_tensors(
                MultiheadAttentionConfig::new(e, h),
                vec![
                    ("in_proj_weight", ones(&[3 * e, e])?),
                    ("in_proj_bias", ones(&[3 * e])?),
                    ("out_proj.weight", ones(&[e, e])?),
                    ("out_proj.bias", ones(&[e])?),
                ],
            )?;
            let out = mha.forward(x, x, x, &AttentionOptions::new())?;
            let w = out.weights.context("need_weights is on")?;
            println!(
                "  H={h}: output[0][0] = {:9.5}   weights row 0 = {:?}",
                out.output.get(0)?.get(0)?.to_scalar::<f32>()?,
                round(&w.get(0)?.to_vec1::<f32>()?)
            );
        }
    }
    println!(
        "Why: with all-ones weights every projected feature of a token is sum(x) + 1, so the \
         score of query i and key j is hd·(s_i+1)(s_j+1)/√hd = √hd·(s_i+1)(s_j+1), which \
         depends on hd = E/H. With equal sums all scores of a row are equal, the weights are \
         uniform whatever their scale, and the output is E·(s+1)+1 = 25 for every H. With \
         unequal sums the softmax gets sharper as H falls: the claim does not hold in general.\n"
    );
    Ok(())
}

fn round(v: &[f32]) -> Vec<f32> {
    v.iter().map(|x| (x * 1e4).round() / 1e4).collect()
}

/// Identity projections, H = 2: head h works on features 2h..2h+2 and nothing else.
fn identity_split() -> Result<()> {
    println!("== 3. Identity projections, E = 4, H = 2: each head sees its own 2 features ==");
    let dev = Device::Cpu;
    let eye = Tensor::eye(4, DType::F64, &dev)?;
    let mha = MultiheadAttention::from_tensors(
        MultiheadAttentionConfig::new(4, 2).with_bias(false),
        vec![
            ("in_proj_weight", Tensor::cat(&[&eye, &eye, &eye], 0)?),
            ("out_proj.weight", eye),
        ],
    )?;
    let x = Tensor::new(
        &[[1f64, 0., 2., -1.], [0., 1.5, 1., 1.], [0.5, 1., -1., 1.]],
        &dev,
    )?;
    let tokens = labels(["t0", "t1", "t2"]);
    let opts = AttentionOptions::new().with_average_attn_weights(false);
    let out = mha.forward(&x, &x, &x, &opts)?;
    let w = out.weights.context("need_weights is on")?; // (H, L, S)
    for h in 0..2 {
        let xh = x.narrow(1, 2 * h, 2)?;
        let table = format_table(
            &w.get(h)?,
            &tokens,
            &tokens,
            &TableOptions {
                title: Some(format!(
                    "head {h}: weights (rows: queries, columns: keys), X_{h} = X[:, {}..{}]",
                    2 * h,
                    2 * h + 2
                )),
                ..TableOptions::default()
            },
        )?;
        print!("{table}");
        let by_hand = candle_nn::ops::softmax(&(xh.matmul(&xh.t()?)? / 2f64.sqrt())?, 1)?;
        let expected = by_hand.matmul(&xh)?;
        let got = out.output.narrow(1, 2 * h, 2)?;
        println!(
            "  max |weights − softmax(X_{h} X_{h}ᵀ/√2)| = {:.1e},  max |output[:, {}..{}] − softmax(…)·X_{h}| = {:.1e}",
            max_abs(&(w.get(h)? - &by_hand)?)?,
            2 * h,
            2 * h + 2,
            max_abs(&(got - expected)?)?
        );
    }
    println!();
    Ok(())
}

fn max_abs(t: &Tensor) -> Result<f64> {
    Ok(t.abs()?.flatten_all()?.max(0)?.to_scalar::<f64>()?)
}

/// A seeded random module: how peaked each head is, and how much the output needs it.
fn random_module() -> Result<()> {
    let (e, h, l) = (16, 4, 6);
    println!(
        "== 4. Seeded random MultiheadAttention(E={e}, H={h}, batch_first=True), 2 × {l} tokens =="
    );
    let dev = Device::Cpu;
    let mha = MultiheadAttention::new(
        MultiheadAttentionConfig::new(e, h).with_batch_first(true),
        seeded_var_builder(&VarMap::new(), 7, DType::F32, &dev),
    )?;
    let x = candle_mha::rng::normal(0., 1., (2, l, e), DType::F32, &dev, 8)?;
    let opts = AttentionOptions::new().with_average_attn_weights(false);
    let w = mha
        .forward(&x, &x, &x, &opts)?
        .weights
        .context("need_weights is on")?; // (N, H, L, S)
    let stats = head_stats(&w)?;
    let ablation = head_ablation(&mha, &x, &x, &x, &AttentionOptions::new())?;
    let rows: Vec<f64> = stats
        .iter()
        .zip(&ablation)
        .flat_map(|(s, a)| [s.mean_entropy, s.mean_max_weight, a.output_change])
        .collect();
    let table = Tensor::from_vec(rows, (h, 3), &dev)?;
    print!(
        "{}",
        format_table(
            &table,
            &labels((0..h).map(|i| format!("head {i}"))),
            &labels(["mean entropy", "mean max weight", "output change"]),
            &TableOptions {
                title: Some(format!(
                    "entropy in nats (uniform over {l} keys = ln {l} = {:.3}); output change = ‖out − out without the head‖ / ‖out‖",
                    (l as f64).ln()
                )),
                ..TableOptions::default()
            },
        )?
    );
    println!(
        "A fresh module's heads are all close to uniform; ablation measures what the output \
         needs, which the weights alone do not tell."
    );
    Ok(())
}
