//! A checkpoint is one unit: a save stopped at any of its points (before and after each file
//! write and rename, as a `kill -9` would stop it) leaves the previous checkpoint or the new
//! one whole, so resuming gives the uninterrupted run's weights bit for bit, and `best/`
//! always holds weights that evaluate to its recorded loss.

mod common;

use std::path::Path;

use anyhow::Result;
use candle_mha::candle::{DType, Device};
use candle_mha::seeded_var_builder;
use candle_mha_train::data::{AssociativeRecall, Dataset};
use candle_mha_train::models::{NextTokenPredictor, NextTokenPredictorConfig};
use candle_mha_train::run::commit::CommitPoint;
use candle_mha_train::run_dir::{BEST_DIR, STATE_FILE};
use candle_mha_train::{TrainConfig, TrainObserver, Trainer};
use candle_nn::VarMap;

fn model_config(task: &AssociativeRecall) -> NextTokenPredictorConfig {
    let mut cfg = NextTokenPredictorConfig::new(task.vocab().len());
    cfg.max_len = task.seq_len();
    cfg.embed_dim = 16;
    cfg.num_heads = 2;
    cfg.num_layers = 1;
    cfg.ff_dim = 32;
    cfg
}

fn build(cfg: &NextTokenPredictorConfig) -> Result<(NextTokenPredictor, VarMap)> {
    let varmap = VarMap::new();
    let model = NextTokenPredictor::new(
        cfg.clone(),
        seeded_var_builder(&varmap, 0, DType::F32, &Device::Cpu),
    )?;
    Ok((model, varmap))
}

fn train_config() -> TrainConfig {
    TrainConfig {
        steps: 9,
        batch_size: 8,
        eval_every: 3,
        save_every: 3,
        ..TrainConfig::default()
    }
}

/// Every parameter's values, by name.
fn weights(varmap: &VarMap) -> Result<Vec<(String, Vec<f32>)>> {
    let mut w: Vec<(String, Vec<f32>)> = varmap
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(k, v)| Ok((k.clone(), v.as_tensor().flatten_all()?.to_vec1::<f32>()?)))
        .collect::<Result<_>>()?;
    w.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(w)
}

/// Fails the save at its `at`-th commit point of the run (counting every save's points).
struct FailAt {
    at: usize,
    seen: usize,
}

impl TrainObserver for FailAt {
    fn at_commit_point(&mut self, _dir: &Path, point: &CommitPoint) -> candle::Result<()> {
        self.seen += 1;
        match self.seen - 1 == self.at {
            true => candle::bail!("injected stop at {}", point.what),
            false => Ok(()),
        }
    }
}

/// Resumes the run in `dir` (or starts it afresh when no save finished) and trains to the end.
fn resume_to_end(
    cfg: &NextTokenPredictorConfig,
    dir: &Path,
    (train, val): (&Dataset, &Dataset),
) -> Result<Trainer> {
    let (model, varmap) = build(cfg)?;
    let mut trainer = match dir.join(STATE_FILE).exists() {
        true => Trainer::resume(model, varmap, dir, None)?,
        false => Trainer::new(model, varmap, train_config(), None)?,
    };
    trainer.run(train, val, Some(dir), &mut ())?;
    Ok(trainer)
}

/// `best/` holds weights that evaluate to the loss its state records.
fn check_best(cfg: &NextTokenPredictorConfig, dir: &Path, val: &Dataset, what: &str) -> Result<()> {
    let best = dir.join(BEST_DIR);
    if !best.join(STATE_FILE).exists() {
        return Ok(());
    }
    let (model, varmap) = build(cfg)?;
    let mut trainer = Trainer::resume(model, varmap, &best, None)?;
    let recorded = trainer
        .state()
        .best
        .as_ref()
        .expect("best/ records its evaluation")
        .eval
        .loss;
    // The trainer's own evaluation (its batches): the loss it recorded, to the bit.
    let loss = trainer.evaluate(val)?.loss;
    // To the last bits of an f64 read back from JSON.
    assert!(
        (loss - recorded).abs() <= 1e-12 * recorded.abs(),
        "{what}: best/ evaluates to {loss}, records {recorded}"
    );
    Ok(())
}

#[test]
fn a_save_stopped_at_any_point_resumes_exactly() -> Result<()> {
    let task = AssociativeRecall::default();
    let (train, val) = (task.generate(256, 1), task.generate(64, 2));
    let cfg = model_config(&task);

    let reference_dir = tempfile::tempdir()?;
    let reference = resume_to_end(&cfg, reference_dir.path(), (&train, &val))?;
    let expected = weights(reference.varmap())?;

    // Every commit point of the whole run, one run stopped at each.
    let mut count = FailAt {
        at: usize::MAX,
        seen: 0,
    };
    let (model, varmap) = build(&cfg)?;
    Trainer::new(model, varmap, train_config(), None)?.run(
        &train,
        &val,
        Some(tempfile::tempdir()?.path()),
        &mut count,
    )?;
    let points = count.seen;
    assert!(points >= 40, "only {points} commit points in the run");
    for at in 0..points {
        let dir = tempfile::tempdir()?;
        let (model, varmap) = build(&cfg)?;
        let mut trainer = Trainer::new(model, varmap, train_config(), None)?;
        let mut fail = FailAt { at, seen: 0 };
        let stopped = trainer.run(&train, &val, Some(dir.path()), &mut fail);
        let msg = format!("{:?}", stopped.err());
        assert!(msg.contains("injected stop"), "point {at}: {msg}");
        check_best(&cfg, dir.path(), &val, &format!("stopped at point {at}"))?;
        let resumed = resume_to_end(&cfg, dir.path(), (&train, &val))?;
        assert!(
            weights(resumed.varmap())? == expected,
            "stopped at point {at} ({msg}): the resumed run's weights differ"
        );
        check_best(&cfg, dir.path(), &val, &format!("resumed after point {at}"))?;
    }
    Ok(())
}

/// `mha train --text` killed (SIGKILL) 20 times at random moments and resumed each time ends
/// with the uninterrupted run's weights, bit for bit.
#[test]
fn a_text_run_killed_twenty_times_ends_as_the_uninterrupted_one() -> Result<()> {
    use rand::Rng;
    use std::process::{Command, Stdio};
    use std::time::Duration;
    let corpus = common::gpl_text();
    let tmp = tempfile::tempdir()?;
    let args = |out: &Path| -> Vec<String> {
        let out = out.to_str().unwrap();
        let run = [
            "train",
            "--text",
            &corpus,
            "--out",
            out,
            "--steps",
            "1000",
            "--batch-size",
            "8",
            "--max-len",
            "32",
            "--eval-every",
            "10",
            "--save-every",
            "3",
            "--quiet",
        ];
        run.iter()
            .chain(&common::words(common::TINY_TEXT_MODEL))
            .map(|a| a.to_string())
            .collect()
    };
    let mha = |args: &[String]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_mha"));
        c.args(args).stdout(Stdio::null()).stderr(Stdio::piped());
        c
    };
    let reference = tmp.path().join("reference");
    let done = mha(&args(&reference)).output()?;
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let expected = std::fs::read(reference.join("model.safetensors"))?;

    let killed = tmp.path().join("killed");
    let with_resume = |out: &Path| {
        let mut a = args(out);
        // A checkpoint (whole or mid-save) exists once the first save began its commit.
        if out.join(STATE_FILE).exists()
            || out.join(candle_mha_train::run_dir::MANIFEST_FILE).exists()
        {
            a.push("--resume".into());
        }
        a
    };
    let mut rng = candle_mha::rng::rng_from_seed(5);
    let mut kills = 0;
    while kills < 20 {
        let mut child = mha(&with_resume(&killed)).spawn()?;
        std::thread::sleep(Duration::from_millis(rng.random_range(30..250)));
        if child.try_wait()?.is_some() {
            // Finished before the kill: nothing left to interrupt.
            let out = child.wait_with_output()?;
            assert!(
                out.status.success(),
                "after {kills} kills: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            break;
        }
        child.kill()?;
        child.wait()?;
        kills += 1;
    }
    let done = mha(&with_resume(&killed)).output()?;
    assert!(
        done.status.success(),
        "after {kills} kills: {}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(
        kills >= 10,
        "only {kills} kills landed before the run finished"
    );
    let got = std::fs::read(killed.join("model.safetensors"))?;
    assert!(
        got == expected,
        "after {kills} kills the final weights differ from the uninterrupted run's"
    );
    Ok(())
}
