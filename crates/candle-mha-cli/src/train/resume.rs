//! What `mha train --resume` keeps from the run and what it lets change: options that
//! contradict the run (its data, tokenizer, model, batch, optimizer, seed) are refused with
//! every difference listed; the cadence options (--eval-every, --save-every, --early-stop)
//! are applied and printed.

use std::path::Path;

use anyhow::Result;
use candle_mha_train::data::{
    expand_sources, same_sources, split_point, Codec, TextTokenizer, TokenData,
};
use candle_mha_train::models::NextTokenPredictorConfig;
use candle_mha_train::Trainer;

use super::args::TrainArgs;
use candle_mha_train::data::DataSpec;

fn same_path(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Each option given in `args` that contradicts the resumed run (`spec`, `model`, the
/// trainer's configuration, its tokenization `codec`), as `--option: …`.
pub fn conflicts(
    args: &TrainArgs,
    spec: &DataSpec,
    model: &NextTokenPredictorConfig,
    trainer: &Trainer,
    codec: &Codec,
) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut differ = |option: &str, given: String, run: String| {
        if given != run {
            out.push(format!("{option} {given}: the run has {run}"));
        }
    };
    // The data.
    let kind = match spec {
        DataSpec::Synthetic { .. } => "the synthetic task".to_string(),
        DataSpec::Tokens { path, .. } | DataSpec::Text { path, .. } => path.display().to_string(),
        DataSpec::Prepared { dir, .. } => format!("the data in {}", dir.display()),
    };
    if let Some(p) = &args.tokens {
        match spec {
            DataSpec::Tokens { path, .. } if same_path(p, path) => {}
            _ => differ("--tokens", p.display().to_string(), kind.clone()),
        }
    }
    if let Some(d) = &args.data {
        match spec {
            DataSpec::Prepared { dir, .. } if same_path(d, dir) => {}
            _ => differ("--data", d.display().to_string(), kind.clone()),
        }
    }
    // The run's prepared data, opened (a scan of its ids) once, when an option needs it.
    let shapes_data = !args.text.is_empty()
        || args.val_fraction.is_some()
        || args.bpe_vocab.is_some()
        || args.bpe_sample_mb.is_some();
    let prepared = match spec {
        DataSpec::Prepared { dir, .. } if shapes_data => Some(TokenData::open(dir)?),
        _ => None,
    };
    // The BPE the text was prepared with.
    let bpe = prepared.as_ref().and_then(|d| d.meta().bpe);
    if let Some(v) = args.bpe_vocab {
        match (&prepared, bpe) {
            (_, Some(b)) => differ("--bpe-vocab", v.to_string(), b.vocab_size.to_string()),
            (Some(d), None) if d.meta().text => differ(
                "--bpe-vocab",
                v.to_string(),
                format!("a tokenizer of {} ids", d.meta().vocab_size),
            ),
            _ => differ(
                "--bpe-vocab",
                v.to_string(),
                format!("{kind}, with no BPE of its own"),
            ),
        }
    }
    if let Some(mb) = args.bpe_sample_mb {
        match bpe {
            Some(b) => differ("--bpe-sample-mb", mb.to_string(), b.sample_mb.to_string()),
            None => differ(
                "--bpe-sample-mb",
                mb.to_string(),
                format!("{kind}, with no BPE trained for it"),
            ),
        }
    }
    if !args.text.is_empty() {
        let given = args
            .text
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" ");
        let same = match &prepared {
            Some(data) => same_sources(&data.meta().sources, &expand_sources(&args.text)?),
            None => false,
        };
        if !same {
            differ(
                "--text",
                given,
                format!("{kind}, prepared from other files"),
            );
        }
    }
    if let Some(t) = &args.tokenizer {
        let given = Codec::Text(Box::new(TextTokenizer::load(t)?));
        if given.fingerprint()? != codec.fingerprint()? {
            differ(
                "--tokenizer",
                t.display().to_string(),
                "another tokenizer".into(),
            );
        }
    }
    match spec {
        DataSpec::Tokens { val_fraction, .. } | DataSpec::Text { val_fraction, .. } => {
            if let Some(f) = args.val_fraction {
                differ("--val-fraction", f.to_string(), val_fraction.to_string());
            }
        }
        DataSpec::Prepared {
            train_tokens,
            eval_windows,
            ..
        } => {
            if let (Some(f), Some(data)) = (args.val_fraction, &prepared) {
                let n = data.len();
                let split = split_point(n, f)?;
                if split != *train_tokens {
                    differ(
                        "--val-fraction",
                        format!("{f} (training on {split} tokens)"),
                        format!("{train_tokens} training tokens"),
                    );
                }
            }
            if let Some(w) = args.eval_windows {
                differ("--eval-windows", w.to_string(), eval_windows.to_string());
            }
        }
        DataSpec::Synthetic {
            num_keys,
            num_values,
            pairs,
            train_examples,
            ..
        } => {
            let given = [
                ("--keys", args.keys, *num_keys),
                ("--values", args.values, *num_values),
                ("--pairs", args.pairs, *pairs),
                ("--train-examples", args.train_examples, *train_examples),
            ];
            for (option, g, run) in given {
                if let Some(g) = g {
                    differ(option, g.to_string(), run.to_string());
                }
            }
        }
    }
    // The parameters' dtype.
    if let Some(d) = args.dtype {
        let run = trainer.state().dtype()?;
        if d != run {
            differ("--dtype", d.as_str().to_string(), run.as_str().to_string());
        }
    }
    // The model.
    let run_arch = if model.llama.is_some() {
        "llama"
    } else {
        "gpt"
    };
    if let Some(a) = &args.arch {
        differ("--arch", a.clone(), run_arch.to_string());
    }
    if let Some(kv) = args.num_kv_heads {
        let run_kv = model
            .llama_config()
            .ok()
            .flatten()
            .map_or("no key/value heads of its own".to_string(), |l| {
                l.num_kv_heads.to_string()
            });
        differ("--num-kv-heads", kv.to_string(), run_kv);
    }
    let sizes = [
        ("--embed-dim", args.embed_dim, model.embed_dim),
        ("--num-heads", args.num_heads, model.num_heads),
        ("--num-layers", args.num_layers, model.num_layers),
        ("--ff-dim", args.ff_dim, model.ff_dim),
        ("--max-len", args.max_len, model.max_len),
    ];
    for (option, given, run) in sizes {
        if let Some(g) = given {
            differ(option, g.to_string(), run.to_string());
        }
    }
    let rates = [
        ("--dropout", args.dropout, model.dropout),
        ("--resid-dropout", args.resid_dropout, model.resid_dropout),
    ];
    // The batches and the optimizer.
    let run = &trainer.state().config;
    let optimizer = [
        ("--lr", args.lr, run.lr),
        ("--weight-decay", args.weight_decay, run.weight_decay),
        ("--clip", args.clip, run.clip_norm),
    ];
    for (option, given, run) in rates.into_iter().chain(optimizer) {
        if let Some(g) = given {
            differ(option, g.to_string(), run.to_string());
        }
    }
    let counts = [
        (
            "--batch-size",
            args.batch_size.map(|x| x as u64),
            run.batch_size as u64,
        ),
        (
            "--grad-accum",
            args.grad_accum.map(|x| x as u64),
            run.grad_accum as u64,
        ),
        ("--warmup", args.warmup, run.warmup_steps),
        ("--seed", args.seed, run.seed),
    ];
    for (option, given, run) in counts {
        if let Some(g) = given {
            differ(option, g.to_string(), run.to_string());
        }
    }
    Ok(out)
}

/// Applies the cadence options given in `args` to a resumed run, returning one line per
/// change (`--eval-every 50 (was 100)`).
pub fn apply_cadence(args: &TrainArgs, trainer: &mut Trainer) -> Vec<String> {
    let run = trainer.state().config.clone();
    let given = [
        ("--eval-every", args.eval_every, run.eval_every),
        ("--save-every", args.save_every, run.save_every),
        ("--early-stop", args.early_stop, run.early_stop),
    ];
    let mut changes: Vec<String> = given
        .iter()
        .filter_map(|(option, g, was)| match g {
            Some(g) if g != was => Some(format!("{option} {g} (was {was})")),
            _ => None,
        })
        .collect();
    trainer.set_cadence(args.eval_every, args.save_every, args.early_stop);
    if let Some(bf16) = args.autocast.filter(|&b| b != run.autocast_bf16) {
        let name = |b: bool| if b { "bf16" } else { "off" };
        changes.push(format!(
            "--autocast {} (was {})",
            name(bf16),
            name(run.autocast_bf16)
        ));
        trainer.set_autocast_bf16(bf16);
    }
    changes
}
