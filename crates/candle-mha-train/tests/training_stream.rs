//! Training on a token stream: random windows, gradient accumulation, the best checkpoint,
//! early stop, exact resume and `metrics.jsonl`.

use std::path::Path;

use anyhow::Result;
use candle_mha::candle::{DType, Device};
use candle_mha::checkpoint::StateDict;
use candle_mha::seeded_var_builder;
use candle_mha_train::data::{
    prepare_token_files, Dataset, EvalSet, Example, PrepareOptions, TokenData, TokenWindows,
    TrainSource, WindowSource,
};
use candle_mha_train::models::{NextTokenPredictor, NextTokenPredictorConfig};
use candle_mha_train::run_dir::{BEST_DIR, METRICS_FILE, MODEL_FILE};
use candle_mha_train::{evaluate, read_metrics, TrainConfig, Trainer};
use candle_nn::VarMap;

fn model(vocab: usize, dtype: DType) -> Result<(NextTokenPredictor, VarMap)> {
    let cfg = NextTokenPredictorConfig {
        vocab_size: vocab,
        max_len: 8,
        embed_dim: 16,
        num_heads: 2,
        num_layers: 1,
        ff_dim: 32,
        dropout: 0.1,
        resid_dropout: 0.0,
        ..NextTokenPredictorConfig::new(0)
    };
    let varmap = VarMap::new();
    let m = NextTokenPredictor::new(cfg, seeded_var_builder(&varmap, 3, dtype, &Device::Cpu))?;
    Ok((m, varmap))
}

/// A prepared stream whose training part repeats "a b" pairs and whose validation part
/// holds "a c": the better the model learns the training part, the worse validation gets.
fn diverging_stream(dir: &Path) -> Result<(TokenData, WindowSource)> {
    let src = dir.join("tokens.txt");
    let mut text = String::new();
    for _ in 0..60 {
        text.push_str("a b a b a b a b a b a b\n");
    }
    for _ in 0..6 {
        text.push_str("a c a c a c a c a c a c\n");
    }
    std::fs::write(&src, text)?;
    let meta = prepare_token_files(
        &[src],
        &dir.join("data"),
        &PrepareOptions {
            val_fraction: 6.0 / 66.0,
            ..Default::default()
        },
    )?;
    let open = || TokenData::open(&dir.join("data"));
    let windows = TokenWindows::new(9, meta.train_range(), meta.val_range())?;
    Ok((
        open()?,
        WindowSource {
            data: open()?,
            windows,
        },
    ))
}

fn vars(varmap: &VarMap) -> Vec<(String, Vec<f64>)> {
    let mut v: Vec<(String, Vec<f64>)> = varmap
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(k, t)| {
            let x = t
                .as_tensor()
                .flatten_all()
                .and_then(|t| t.to_dtype(DType::F64))
                .and_then(|t| t.to_vec1::<f64>())
                .unwrap();
            (k.clone(), x)
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[test]
fn best_checkpoint_early_stop_and_metrics() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (data, source) = diverging_stream(dir.path())?;
    let val = source.windows.val_dataset(&data, 100)?;
    let (m, varmap) = model(data.meta().vocab_size, DType::F32)?;
    let tc = TrainConfig {
        steps: 300,
        batch_size: 8,
        lr: 1e-2,
        warmup_steps: 5,
        eval_every: 10,
        save_every: 0,
        early_stop: 4,
        ..TrainConfig::default()
    };
    let mut trainer = Trainer::new(m, varmap, tc, None)?;
    let run = dir.path().join("run");
    let set = EvalSet {
        data: &val,
        text_bytes: None,
    };
    trainer.run_source(&source, &set, Some(&run), &mut ())?;
    let state = trainer.state().clone();
    let losses: Vec<f64> = state.evals.iter().map(|e| e.eval.loss).collect();
    let (argmin, min) = losses
        .iter()
        .enumerate()
        .min_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, l)| (i, *l))
        .unwrap();
    println!("validation losses: {losses:?}");
    // The scenario holds: validation rose after its best.
    assert!(losses.last().unwrap() > &(min + 0.05), "{losses:?}");
    let best = state.best.clone().expect("a best evaluation");
    assert_eq!(best.step, state.evals[argmin].step);
    assert_eq!(best.eval.loss, min);
    // Early stop: 4 evaluations after the best, then the final one; well before 300 steps.
    assert!(state.stopped_early);
    assert!(state.step < 300);
    let after_best = state.evals.iter().filter(|e| e.step > best.step).count();
    assert_eq!(after_best, 5, "4 periodic evaluations + the final one");
    // best/ holds the weights of the best step: evaluated again, they give its loss.
    let (m2, varmap2) = model(data.meta().vocab_size, DType::F32)?;
    let weights = StateDict::load(run.join(BEST_DIR).join(MODEL_FILE))?;
    candle_mha::checkpoint::load_into_varmap(
        &varmap2,
        &weights,
        &candle_mha::checkpoint::LoadOptions::new(),
    )?;
    let again = evaluate(&m2, &val, 8, &Device::Cpu)?;
    assert!((again.loss - min).abs() < 1e-6, "{} vs {min}", again.loss);
    assert!(run.join(BEST_DIR).join("trainer_state.json").exists());

    // metrics.jsonl: one training line per step, losses as the state recorded them, and
    // the validation fields at each evaluation.
    let records = read_metrics(&run.join(METRICS_FILE))?.records;
    let train: Vec<_> = records.iter().filter(|r| r.train_loss.is_some()).collect();
    assert_eq!(train.len() as u64, state.step);
    for (r, l) in train.iter().zip(&state.losses) {
        assert!((r.train_loss.unwrap() - f64::from(*l)).abs() < 1e-9);
        assert!(r.lr.is_some() && r.grad_norm.is_some() && r.tokens == Some(64));
    }
    let evals: Vec<(u64, f64)> = records
        .iter()
        .filter_map(|r| r.val_loss.map(|l| (r.step, l)))
        .collect();
    let want: Vec<(u64, f64)> = state.evals.iter().map(|e| (e.step, e.eval.loss)).collect();
    assert_eq!(evals, want);
    Ok(())
}

/// Runs `steps` steps (from a fresh start, or resuming `dir`) and returns the weights.
fn run_to(
    dir: &Path,
    source: &WindowSource,
    val: &Dataset,
    steps: u64,
    resume: bool,
    accum: usize,
) -> Result<Vec<(String, Vec<f64>)>> {
    let (m, varmap) = model(source.data.meta().vocab_size, DType::F32)?;
    let mut trainer = if resume {
        Trainer::resume(m, varmap, dir, Some(steps))?
    } else {
        let tc = TrainConfig {
            steps,
            batch_size: 4,
            grad_accum: accum,
            eval_every: 5,
            save_every: 0,
            ..TrainConfig::default()
        };
        Trainer::new(m, varmap, tc, None)?
    };
    let set = EvalSet {
        data: val,
        text_bytes: None,
    };
    trainer.run_source(source, &set, Some(dir), &mut ())?;
    Ok(vars(trainer.varmap()))
}

#[test]
fn resume_with_random_windows_and_accumulation_is_exact() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (data, source) = diverging_stream(dir.path())?;
    let val = source.windows.val_dataset(&data, 100)?;
    let straight = run_to(&dir.path().join("a"), &source, &val, 24, false, 2)?;
    run_to(&dir.path().join("b"), &source, &val, 12, false, 2)?;
    let resumed = run_to(&dir.path().join("b"), &source, &val, 24, true, 2)?;
    assert_eq!(straight, resumed, "bit-identical weights");
    let (a, b) = (
        read_metrics(&dir.path().join("a").join(METRICS_FILE))?.records,
        read_metrics(&dir.path().join("b").join(METRICS_FILE))?.records,
    );
    let losses = |r: &[candle_mha_train::MetricsRecord]| -> Vec<Option<f64>> {
        r.iter()
            .filter(|r| r.train_loss.is_some())
            .map(|r| r.train_loss)
            .collect()
    };
    assert_eq!(losses(&a), losses(&b));
    Ok(())
}

#[test]
fn accumulated_micro_batches_make_the_update_of_one_big_batch() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (_, source) = diverging_stream(dir.path())?;
    // Uneven micro-batches too: 3 + 3 + 2 counted tokens differ per micro-batch when the
    // examples differ in length.
    let mut examples = source.examples(0, 0, 8)?;
    examples[7] = Example::full(examples[7].tokens[..5].to_vec());
    let step = |batch_size: usize| -> Result<Vec<(String, Vec<f64>)>> {
        let (mut m, varmap) = model(source.data.meta().vocab_size, DType::F64)?;
        m = NextTokenPredictor::new(
            NextTokenPredictorConfig {
                dropout: 0.0,
                resid_dropout: 0.0,
                ..m.config().clone()
            },
            seeded_var_builder(&varmap, 3, DType::F64, &Device::Cpu),
        )?;
        let tc = TrainConfig {
            batch_size,
            ..TrainConfig::default()
        };
        let mut trainer = Trainer::new(m, varmap, tc, None)?;
        let batches: Vec<_> = examples
            .chunks(batch_size)
            .map(|c| {
                let refs: Vec<&Example> = c.iter().collect();
                candle_mha_train::data::Batch::from_examples(&refs, &Device::Cpu)
            })
            .collect::<candle_mha::candle::Result<_>>()?;
        trainer.train_step_accumulated(&batches)?;
        Ok(vars(trainer.varmap()))
    };
    let one = step(8)?;
    let accumulated = step(3)?;
    let mut worst = 0f64;
    for ((name, a), (_, b)) in one.iter().zip(&accumulated) {
        for (x, y) in a.iter().zip(b) {
            worst = worst.max((x - y).abs());
        }
        assert_eq!(a.len(), b.len(), "{name}");
    }
    println!("largest difference {worst:e}");
    assert!(worst < 1e-12, "accumulated update differs by {worst}");
    // And the accumulation is not a no-op: one micro-batch alone gives another update.
    let (m, varmap) = model(source.data.meta().vocab_size, DType::F64)?;
    let mut t = Trainer::new(m, varmap, TrainConfig::default(), None)?;
    let refs: Vec<&Example> = examples[..3].iter().collect();
    t.train_step(&candle_mha_train::data::Batch::from_examples(
        &refs,
        &Device::Cpu,
    )?)?;
    let partial = vars(t.varmap());
    assert!(partial.iter().zip(&one).any(|(a, b)| a.1 != b.1));
    Ok(())
}
