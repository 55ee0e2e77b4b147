//! Which token attends to which, over a whole corpus: train a small next-token model on
//! made-up event streams, then accumulate each layer's attention into a vocabulary ×
//! vocabulary matrix.
//!
//! ```text
//! cargo run --release --example vocab_importance              # writes target/vocab_importance
//! cargo run --release --example vocab_importance -- out_dir
//! ```
//!
//! The event streams follow a few rules, so some tokens *should* attend to others:
//!
//! - a session starts `login admin` or `login guest`, then 4–9 events from
//!   `view search cart`;
//! - `error` may occur between events and is always followed by `retry`;
//! - after `cart`, `pay` may follow; after `pay`, always `receipt`;
//! - the session ends with `end`, then `audit` for an admin or `bye` for a guest: predicting
//!   the last token needs a look back at the role, far away.

use std::path::PathBuf;

use anyhow::{Context, Result};
use candle_mha::candle::{DType, Device, IndexOp, Tensor};
use candle_mha::io::write_atomic;
use candle_mha::rng::rng_from_seed;
use candle_mha::seeded_var_builder;
use candle_mha_train::data::{batches, encode_sequences, Vocab};
use candle_mha_train::models::{NextTokenPredictor, NextTokenPredictorConfig};
use candle_mha_train::{TrainConfig, Trainer};
use candle_mha_viz::{corpus_vocab_matrix, format_table, TableOptions};
use candle_nn::VarMap;
use rand::Rng;

/// One event stream, following the rules in the module docs.
fn session(rng: &mut impl Rng) -> Vec<String> {
    let admin = rng.random_bool(0.5);
    let mut s = vec!["login", if admin { "admin" } else { "guest" }];
    for _ in 0..rng.random_range(4..10) {
        if rng.random_bool(0.15) {
            s.extend(["error", "retry"]);
        }
        let event = ["view", "search", "cart"][rng.random_range(0..3)];
        s.push(event);
        if event == "cart" && rng.random_bool(0.5) {
            s.extend(["pay", "receipt"]);
        }
    }
    s.extend(["end", if admin { "audit" } else { "bye" }]);
    s.into_iter().map(str::to_string).collect()
}

fn main() -> Result<()> {
    // candle's element-wise threads as the `mha` CLI sets them (see `candle_mha::runtime`).
    for (name, value) in candle_mha::runtime::recommended_env() {
        if std::env::var_os(name).is_none() {
            std::env::set_var(name, value);
        }
    }
    let out_dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "target/vocab_importance".into()),
    );
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    // The device from `MHA_DEVICE` (default `auto`), freed GPU memory kept for reuse.
    let spec = std::env::var("MHA_DEVICE").unwrap_or_else(|_| "auto".into());
    let (device, notice) = candle_mha::device::select_device(&spec)?;
    candle_mha::runtime::keep_freed_gpu_memory(&device)?;
    eprintln!("{notice}");

    let mut rng = rng_from_seed(7);
    let sessions: Vec<Vec<String>> = (0..2000).map(|_| session(&mut rng)).collect();
    let vocab = Vocab::build(sessions.iter().map(Vec::as_slice));
    let data = encode_sequences(&sessions, &vocab);
    let (train, val) = data.split(0.1, 0);
    println!("example: {}", sessions[0].join(" "));
    println!(
        "{} sessions, vocabulary of {} symbols (4 specials)",
        sessions.len(),
        vocab.len()
    );

    let cfg = NextTokenPredictorConfig {
        vocab_size: vocab.len(),
        max_len: train.max_len().max(val.max_len()),
        embed_dim: 32,
        num_heads: 2,
        num_layers: 2,
        ff_dim: 64,
        dropout: 0.0,
        resid_dropout: 0.0,
        ..NextTokenPredictorConfig::new(0)
    };
    let varmap = VarMap::new();
    let model = NextTokenPredictor::new(
        cfg.clone(),
        seeded_var_builder(&varmap, 0, DType::F32, &device),
    )?;
    let tc = TrainConfig {
        steps: 300,
        batch_size: 32,
        warmup_steps: 30,
        eval_every: 0,
        ..TrainConfig::default()
    };
    let t = std::time::Instant::now();
    let mut trainer = Trainer::new(model, varmap, tc, None)?;
    let eval = trainer.run(&train, &val, None, &mut ())?;
    println!(
        "trained 300 steps in {:.1?}: validation {eval}",
        t.elapsed()
    );
    let model = trainer.model();

    // Does the model know the rule "end → audit | bye"? Look at its prediction after `end`.
    let probe: Vec<&str> = vec!["<bos>", "login", "admin", "view", "cart", "search", "end"];
    let ids = Tensor::new(vocab.encode(&probe), &device)?.unsqueeze(0)?;
    let logits = model.forward(&ids, None)?.i((0, probe.len() - 1))?;
    let next = logits.argmax(0)?.to_scalar::<u32>()?;
    println!(
        "after `{}` the model predicts `{}`",
        probe.join(" "),
        vocab.symbol(next).unwrap_or("?")
    );

    let names: Vec<String> = (0..vocab.len() as u32)
        .map(|i| vocab.symbol(i).unwrap_or("?").to_string())
        .collect();
    for layer in 0..cfg.num_layers {
        let examples = val.examples.iter().cloned().map(Ok);
        let batches =
            batches(examples, 64, &device)?.map(|b| b.map(|b| (b.input, b.key_padding_mask)));
        let m = corpus_vocab_matrix(
            model.config().vocab_size,
            batches,
            layer,
            None,
            |ids, kpm| Ok(model.forward_with_attention(ids, Some(kpm))?.1),
        )?;
        println!(
            "\n=== layer {layer} (mean over heads): {} query positions, total mass {:.3} ===",
            m.num_queries(),
            m.total_mass()
        );
        println!("top-3 keys per query token (share of that token's attention):");
        for (q, top) in m.top_k(3) {
            let row: Vec<String> = top
                .iter()
                .map(|(k, share)| format!("{:>8} {:5.1}%", names[*k as usize], 100.0 * share))
                .collect();
            println!("  {:>8} → {}", names[q as usize], row.join("   "));
        }
        // The table over the tokens that occur (the padding and unknown symbols never do).
        let used: Vec<u32> = (0..vocab.len() as u32)
            .filter(|&t| (0..vocab.len() as u32).any(|o| m.cell(t, o).1 > 0 || m.cell(o, t).1 > 0))
            .collect();
        let idx = Tensor::new(used.as_slice(), &Device::Cpu)?;
        let table = m
            .row_normalized()?
            .index_select(&idx, 0)?
            .index_select(&idx, 1)?;
        let labels: Vec<String> = used.iter().map(|&t| names[t as usize].clone()).collect();
        let opts = TableOptions {
            decimals: 2,
            title: Some("row-normalised: row = query token, column = key token".into()),
            ..TableOptions::default()
        };
        print!("{}", format_table(&table, &labels, &labels, &opts)?);

        let csv = out_dir.join(format!("vocab_matrix_layer{layer}.csv"));
        write_atomic(&csv, m.to_csv(&names).as_bytes())?;
        let st = out_dir.join(format!("vocab_matrix_layer{layer}.safetensors"));
        m.save_safetensors(&st)?;
        println!("wrote {} and {}", csv.display(), st.display());
    }
    Ok(())
}
