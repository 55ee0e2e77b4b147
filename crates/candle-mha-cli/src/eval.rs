//! `mha eval`: loss, perplexity, accuracy and bits per byte of a checkpoint, on its own
//! validation data or on any text, token file or prepared data, optionally beside count-model
//! baselines.

use std::cell::Cell;

use anyhow::{bail, Result};
use candle_mha::candle::DType;
use candle_mha::checkpoint::StateDict;
use candle_mha_train::data::{
    consecutive_windows, windows_dataset, Codec, Dataset, Example, TokenData,
};
use candle_mha_train::{evaluate_examples, BigramBaseline, Evaluation};

use super::checkpoint_dir::CorpusRun;
use super::choices::Baseline;
use candle_mha_train::data::{
    example_text_bytes, target_bytes, Corpus, DataSpec, RunSplit, DEFAULT_EVAL_WINDOWS,
};
use candle_mha_train::run::run_data_spec;

/// Arguments of `mha eval`. Without a data option it evaluates on the run's own validation
/// set, rebuilt from the checkpoint.
#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    #[command(flatten)]
    pub corpus: super::checkpoint_dir::CorpusArgs,
    /// Also evaluate count models fit on the data's training part (unigram and bigram), on
    /// the same tokens. Needs prepared data (--data, or a run trained on it).
    #[arg(long, value_enum)]
    pub baseline: Option<Baseline>,
    /// Windows of prepared data evaluated at most (evenly spread over its validation part).
    #[arg(long, default_value_t = DEFAULT_EVAL_WINDOWS,
          value_parser = super::bounds::count(1, super::bounds::MAX_COUNT))]
    pub max_windows: usize,
    /// Compute dtype.
    #[arg(long, default_value = "f32", value_parser = super::choices::DtypeParser)]
    pub dtype: DType,
    /// Also write `logits_check.safetensors` (the first batch's tokens, padding mask and
    /// logits) into the checkpoint, for `scripts/reference_model.py DIR` to compare in PyTorch.
    #[arg(long)]
    pub write_logits_check: bool,
}

/// The prepared data a baseline is fit on: --data, or the run's own.
fn baseline_data(args: &EvalArgs) -> Result<(TokenData, u64)> {
    if let Some(dir) = &args.corpus.data {
        let d = TokenData::open(dir)?;
        let t = d.meta().train_tokens;
        return Ok((d, t));
    }
    match run_data_spec(&args.corpus.checkpoint)? {
        DataSpec::Prepared {
            dir, train_tokens, ..
        } => Ok((TokenData::open(&dir)?, train_tokens)),
        _ => bail!(
            "--baseline needs prepared data: pass --data DIR, or evaluate a run trained on text or --data"
        ),
    }
}

/// Prints the unigram and bigram baselines on `val` beside the model's evaluation.
fn print_baselines(
    args: &EvalArgs,
    codec: &Codec,
    val: &Dataset,
    model: &Evaluation,
) -> Result<()> {
    let (data, train_tokens) = baseline_data(args)?;
    let mut counts = BigramBaseline::new(codec.vocab_size());
    const PIECE: u64 = 1 << 20;
    for start in (0..train_tokens).step_by(PIECE as usize) {
        counts.add(&data.tokens(start..(start + PIECE).min(train_tokens))?)?;
    }
    let base = counts.evaluate(&val.examples, target_bytes(codec, &val.examples)?)?;
    println!(
        "unigram baseline (add-one counts of {train_tokens} training tokens): {}",
        base.unigram
    );
    println!(
        "bigram baseline (counts interpolated with the unigram, beta {} tuned on these tokens): {}",
        base.beta, base.bigram
    );
    let diff = model.loss - base.bigram.loss;
    println!(
        "model vs bigram: {diff:+.4} nats/token ({:.1}% {} loss)",
        100.0 * diff.abs() / base.bigram.loss,
        if diff <= 0.0 { "lower" } else { "higher" }
    );
    Ok(())
}

/// Runs `mha eval`.
pub fn run(args: &EvalArgs) -> Result<()> {
    let CorpusRun {
        ckpt,
        device,
        name,
        corpus,
        len,
    } = args.corpus.open(args.dtype, RunSplit::Val)?;
    // Prepared data: at most --max-windows evenly spread windows of the part (as training
    // evaluated them), in memory so the baselines see the same tokens.
    let corpus = match corpus {
        Corpus::Prepared { data, range } => {
            let ranges = consecutive_windows(range, len as u64, args.max_windows);
            Corpus::Sequences(windows_dataset(&data, &ranges)?)
        }
        c => c,
    };
    let bytes = Cell::new(0u64);
    let sequences = Cell::new(0usize);
    let examples = corpus.examples(len)?.map(|e| {
        let e = e?;
        bytes.set(bytes.get() + example_text_bytes(&ckpt.codec, &e)?);
        sequences.set(sequences.get() + 1);
        Ok(e)
    });
    let mut eval = evaluate_examples(&ckpt.model, examples, args.corpus.batch_size, &device, None)?;
    if bytes.get() > 0 {
        eval.bits_per_byte =
            Some(eval.loss * eval.tokens as f64 / std::f64::consts::LN_2 / bytes.get() as f64);
    }
    println!("eval on {name} ({} sequences): {eval}", sequences.get());
    if let Some(skipped) = ckpt.codec.unknown_skipped() {
        eprintln!("warning: left out of {name} {}", skipped.describe());
    }
    if args.baseline.is_some() {
        let Corpus::Sequences(val) = &corpus else {
            bail!("--baseline works on the run's validation set or --data, not on --text")
        };
        print_baselines(args, &ckpt.codec, val, &eval)?;
    }
    if args.write_logits_check {
        let first: Vec<Example> = corpus
            .examples(len)?
            .take(args.corpus.batch_size.min(8))
            .collect::<candle_mha::candle::Result<_>>()?;
        let batch = Dataset { examples: first }
            .eval_batches(8, &device)?
            .remove(0);
        let logits = ckpt
            .model
            .forward(&batch.input, Some(&batch.key_padding_mask))?;
        let path = args.corpus.checkpoint.join("logits_check.safetensors");
        StateDict::from_tensors([
            ("tokens".to_string(), batch.input.to_dtype(DType::I64)?),
            (
                "key_padding_mask".to_string(),
                batch.key_padding_mask.clone(),
            ),
            ("logits".to_string(), logits.to_dtype(DType::F32)?),
        ])
        .save_safetensors(&path)?;
        eprintln!(
            "wrote {}: check it with scripts/reference_model.py {}",
            path.display(),
            args.corpus.checkpoint.display()
        );
    }
    Ok(())
}
