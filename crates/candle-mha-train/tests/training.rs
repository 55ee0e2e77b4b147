//! Training: the synthetic task is solved, and a resumed run equals an uninterrupted one.

use anyhow::Result;
use candle_mha::candle::{DType, Device};
use candle_mha::seeded_var_builder;
use candle_mha_train::data::{AssociativeRecall, Dataset};
use candle_mha_train::models::{NextTokenPredictor, NextTokenPredictorConfig};
use candle_mha_train::{Evaluation, RunError, StepStats, TrainConfig, TrainObserver, Trainer};
use candle_nn::VarMap;

fn build(cfg: &NextTokenPredictorConfig) -> Result<(NextTokenPredictor, VarMap)> {
    let varmap = VarMap::new();
    let model = NextTokenPredictor::new(
        cfg.clone(),
        seeded_var_builder(&varmap, 0, DType::F32, &Device::Cpu),
    )?;
    Ok((model, varmap))
}

fn task_data(train: usize) -> (AssociativeRecall, Dataset, Dataset) {
    let task = AssociativeRecall::default();
    let (t, v) = (task.generate(train, 1), task.generate(500, 2));
    (task, t, v)
}

/// Stops the run once validation accuracy reaches the target.
struct StopAt(f64, Option<Evaluation>);
impl TrainObserver for StopAt {
    fn on_eval(&mut self, _step: u64, eval: &Evaluation) {
        self.1 = Some(*eval);
    }
    fn should_stop(&self) -> bool {
        self.1.is_some_and(|e| e.accuracy >= self.0)
    }
}

/// Associative recall needs attention (the answer depends on a key seen earlier): the
/// default-sized model must reach ≥ 95% validation accuracy within 1500 steps.
#[test]
fn synthetic_task_is_solved() -> Result<()> {
    let (task, train, val) = task_data(20_000);
    let mut cfg = NextTokenPredictorConfig::new(task.vocab().len());
    cfg.max_len = task.seq_len();
    let (model, varmap) = build(&cfg)?;
    let tc = TrainConfig {
        steps: 1500,
        eval_every: 100,
        ..TrainConfig::default()
    };
    let mut trainer = Trainer::new(model, varmap, tc, None)?;
    let mut stop = StopAt(0.95, None);
    let eval = trainer.run(&train, &val, None, &mut stop)?;
    println!("after {} steps: {eval}", trainer.state().step);
    assert!(
        eval.accuracy >= 0.95,
        "validation accuracy {:.3} after {} steps",
        eval.accuracy,
        trainer.state().step
    );
    Ok(())
}

/// 2000 steps straight equal 1000 steps, a checkpoint, a fresh process-like resume and 1000
/// more: the same losses and bit-identical weights (dropout on, to cover its seeding).
#[test]
fn resume_is_exact() -> Result<()> {
    let (task, train, val) = task_data(300);
    let cfg = NextTokenPredictorConfig {
        vocab_size: task.vocab().len(),
        max_len: task.seq_len(),
        embed_dim: 16,
        num_heads: 2,
        num_layers: 1,
        ff_dim: 32,
        dropout: 0.1,
        resid_dropout: 0.0,
        ..NextTokenPredictorConfig::new(0)
    };
    let tc = TrainConfig {
        steps: 2000,
        batch_size: 8,
        eval_every: 0,
        save_every: 0,
        seed: 7,
        ..TrainConfig::default()
    };
    let (model, varmap) = build(&cfg)?;
    let mut straight = Trainer::new(model, varmap, tc.clone(), None)?;
    straight.run(&train, &val, None, &mut ())?;

    let dir = tempfile::tempdir()?;
    // Stopped after 1000 of the 2000 steps (as by Ctrl-C): the run saves a checkpoint.
    let (model, varmap) = build(&cfg)?;
    let mut first = Trainer::new(model, varmap, tc.clone(), None)?;
    struct StopAfter(u64, u64);
    impl TrainObserver for StopAfter {
        fn on_step(&mut self, step: u64, _: &candle_mha_train::StepStats) {
            self.1 = step;
        }
        fn should_stop(&self) -> bool {
            self.1 >= self.0
        }
    }
    first.run(&train, &val, Some(dir.path()), &mut StopAfter(1000, 0))?;
    assert_eq!(first.state().step, 1000);
    let (model, varmap) = build(&cfg)?;
    let mut resumed = Trainer::resume(model, varmap, dir.path(), None)?;
    assert_eq!(resumed.state().step, 1000);
    resumed.run(&train, &val, None, &mut ())?;

    assert_eq!(resumed.state().losses.len(), 2000);
    assert_eq!(
        resumed.state().losses,
        straight.state().losses,
        "losses differ after resume"
    );
    let weights = |t: &Trainer| -> Result<Vec<(String, Vec<f32>)>> {
        let data = t.varmap().data().lock().unwrap();
        let mut w: Vec<(String, Vec<f32>)> = data
            .iter()
            .map(|(n, v)| Ok((n.clone(), v.as_tensor().flatten_all()?.to_vec1::<f32>()?)))
            .collect::<Result<_>>()?;
        w.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(w)
    };
    assert_eq!(weights(&resumed)?, weights(&straight)?);
    Ok(())
}

/// Text: a BPE trained on a small corpus, then a model whose validation loss ends below the
/// corpus's unigram entropy (it uses context, not just token frequencies).
#[test]
fn text_model_beats_unigram_entropy() -> Result<()> {
    use candle_mha::rng::rng_from_seed;
    use candle_mha_train::data::{text_dataset, TextTokenizer};
    use rand::Rng;

    let dir = tempfile::tempdir()?;
    let corpus = dir.path().join("corpus.txt");
    let (subjects, verbs, objects) = (
        [
            "the cat",
            "a dog",
            "my neighbour",
            "the old sailor",
            "every child",
        ],
        ["watches", "follows", "draws", "remembers"],
        [
            "the moon",
            "a red kite",
            "the quiet harbour",
            "small boats",
            "the garden gate",
        ],
    );
    let mut rng = rng_from_seed(1);
    let mut text = String::new();
    for _ in 0..600 {
        let s = subjects[rng.random_range(0..subjects.len())];
        let v = verbs[rng.random_range(0..verbs.len())];
        let o = objects[rng.random_range(0..objects.len())];
        text.push_str(&format!("{s} {v} {o}. "));
    }
    std::fs::write(&corpus, &text)?;
    let tok = TextTokenizer::train_bpe(&corpus, 300)?;
    let (train, val) = text_dataset(&corpus, &tok, 33)?.split(0.1, 0);

    // Unigram entropy (nats) of the predicted tokens of the training set.
    let mut counts = std::collections::HashMap::<u32, f64>::new();
    for ex in &train.examples {
        for t in &ex.tokens[1..] {
            *counts.entry(*t).or_default() += 1.0;
        }
    }
    let total: f64 = counts.values().sum();
    let entropy: f64 = counts
        .values()
        .map(|c| -(c / total) * (c / total).ln())
        .sum();

    let cfg = NextTokenPredictorConfig {
        vocab_size: tok.vocab_size(),
        max_len: 32,
        embed_dim: 32,
        num_heads: 2,
        num_layers: 1,
        ff_dim: 64,
        dropout: 0.0,
        resid_dropout: 0.0,
        ..NextTokenPredictorConfig::new(0)
    };
    let (model, varmap) = build(&cfg)?;
    let tc = TrainConfig {
        steps: 300,
        batch_size: 16,
        eval_every: 0,
        warmup_steps: 30,
        ..TrainConfig::default()
    };
    let mut trainer = Trainer::new(model, varmap, tc, None)?;
    let eval = trainer.run(&train, &val, None, &mut ())?;
    println!("unigram entropy {entropy:.3} nats; validation {eval}");
    assert!(
        eval.loss < entropy,
        "validation loss {:.3} is not below the unigram entropy {entropy:.3}",
        eval.loss
    );
    Ok(())
}

/// A checkpoint is never replaced by weights that hold NaN (however they got there).
#[test]
fn non_finite_weights_are_not_saved() -> Result<()> {
    let (task, _, _) = task_data(10);
    let mut cfg = NextTokenPredictorConfig::new(task.vocab().len());
    cfg.max_len = task.seq_len();
    let (model, varmap) = build(&cfg)?;
    let name = "blocks.0.mlp.fc1.bias";
    let var = varmap.data().lock().unwrap()[name].clone();
    let trainer = Trainer::new(model, varmap, TrainConfig::default(), None)?;
    let dir = tempfile::tempdir()?;
    trainer.save(dir.path())?;
    let saved = std::fs::read(dir.path().join("model.safetensors"))?;
    var.set(&var.ones_like()?.affine(0.0, f64::NAN)?)?;
    let e = trainer.save(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains(&format!("parameter {name} holds NaN or infinite values")),
        "{e}"
    );
    assert_eq!(std::fs::read(dir.path().join("model.safetensors"))?, saved);
    Ok(())
}

/// A diverging run stops with errors a program can match: NaN weights give a non-finite
/// training loss (`LossNotFinite`, the weights not updated); a learning rate that blows the
/// weights up gives a non-finite evaluation before the save (`Diverged`, nothing saved).
#[test]
fn divergence_is_a_typed_error() -> Result<()> {
    let (task, train, val) = task_data(64);
    let mut cfg = NextTokenPredictorConfig::new(task.vocab().len());
    cfg.max_len = task.seq_len();

    let (model, varmap) = build(&cfg)?;
    let var = varmap.data().lock().unwrap()["blocks.0.mlp.fc1.bias"].clone();
    var.set(&var.ones_like()?.affine(0.0, f64::NAN)?)?;
    let mut trainer = Trainer::new(model, varmap, TrainConfig::default(), None)?;
    match trainer.run(&train, &val, None, &mut ()) {
        Err(RunError::LossNotFinite { step: 0, loss, .. }) => assert!(loss.is_nan()),
        other => panic!("expected LossNotFinite at step 0, got {other:?}"),
    }
    assert_eq!(trainer.state().step, 0);

    let (model, varmap) = build(&cfg)?;
    let tc = TrainConfig {
        steps: 1,
        lr: 1e30,
        ..TrainConfig::default()
    };
    let mut trainer = Trainer::new(model, varmap, tc, None)?;
    let dir = tempfile::tempdir()?;
    match trainer.run(&train, &val, Some(dir.path()), &mut ()) {
        Err(RunError::Diverged {
            step: 1,
            loss,
            dir: d,
        }) => {
            assert!(
                !loss.is_finite() && d == dir.path(),
                "{loss} {}",
                d.display()
            )
        }
        other => panic!("expected Diverged at step 1, got {other:?}"),
    }
    assert!(!dir.path().join("model.safetensors").exists());
    Ok(())
}

/// `AdamW` is a `candle_nn::Optimizer`: a generic candle-nn loop driving it through
/// `backward_step`, with the learning rate set through the trait, gives exactly the weights
/// (bit for bit) and the state of its own API.
#[test]
fn adamw_drives_a_candle_nn_training_loop() -> Result<()> {
    use candle_mha::candle::{Tensor, Var};
    use candle_mha::optim::{AdamW, AdamWConfig};
    use candle_nn::Optimizer;

    let dev = Device::Cpu;
    let x = Tensor::new(&[[1f32, 2.0], [3.0, -1.0], [0.5, 0.25]], &dev)?;
    let y = Tensor::new(&[[1f32], [-2.0], [0.5]], &dev)?;
    let init = || -> Result<(Var, Var)> {
        Ok((
            Var::from_tensor(&Tensor::new(&[[0.1f32], [-0.2]], &dev)?)?,
            Var::from_tensor(&Tensor::new(&[0.05f32], &dev)?)?,
        ))
    };
    let loss = |w: &Var, b: &Var| -> candle_mha::candle::Result<Tensor> {
        x.matmul(w.as_tensor())?
            .broadcast_add(b.as_tensor())?
            .sub(&y)?
            .sqr()?
            .mean_all()
    };
    let config = AdamWConfig {
        lr: 0.1,
        weight_decay: 0.05,
        ..AdamWConfig::default()
    };
    let lrs = [0.1, 0.05, 0.02, 0.01];

    // Any candle-nn optimizer: the loop of a candle-nn user.
    fn candle_nn_loop<O: Optimizer>(
        opt: &mut O,
        lrs: &[f64],
        loss: impl Fn() -> candle_mha::candle::Result<Tensor>,
    ) -> candle_mha::candle::Result<()> {
        for &lr in lrs {
            opt.set_learning_rate(lr);
            assert_eq!(opt.learning_rate(), lr);
            opt.backward_step(&loss()?)?;
        }
        Ok(())
    }
    let (w1, b1) = init()?;
    let mut via_trait = <AdamW as Optimizer>::new(vec![w1.clone(), b1.clone()], config.clone())?;
    candle_nn_loop(&mut via_trait, &lrs, || loss(&w1, &b1))?;

    let (w2, b2) = init()?;
    let mut own = AdamW::new(
        vec![("0".to_string(), w2.clone()), ("1".to_string(), b2.clone())],
        config,
    )?;
    for &lr in &lrs {
        own.set_lr(lr);
        own.step(&loss(&w2, &b2)?.backward()?)?;
    }

    assert_eq!(w1.to_vec2::<f32>()?, w2.to_vec2::<f32>()?);
    assert_eq!(b1.to_vec1::<f32>()?, b2.to_vec1::<f32>()?);
    assert_ne!(
        w1.to_vec2::<f32>()?,
        vec![vec![0.1f32], vec![-0.2]],
        "no update"
    );
    let (s1, s2) = (via_trait.state_dict()?, own.state_dict()?);
    assert_eq!(s1.len(), s2.len());
    for (name, t) in s1.tensors() {
        let other = s2.get(name).expect("same names");
        assert_eq!(
            t.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?,
            other
                .flatten_all()?
                .to_dtype(DType::F64)?
                .to_vec1::<f64>()?,
            "{name}"
        );
    }
    Ok(())
}

/// Records each step's loss.
struct Losses(Vec<f32>);
impl TrainObserver for Losses {
    fn on_step(&mut self, _step: u64, stats: &StepStats) {
        self.0.push(stats.loss);
    }
}

/// `autocast_bf16` (bf16 products, f32 weights and optimizer) follows the f32 run's loss
/// curve on the same batches, seed and initialisation: every step's loss within 2% of f32's
/// and the final validation loss within 2%, and yet not the same numbers (the products did
/// round). The gaps are printed (`--nocapture`).
#[test]
fn bf16_products_follow_the_f32_loss_curve() -> Result<()> {
    let (task, train, val) = task_data(4_000);
    let mut cfg = NextTokenPredictorConfig::new(task.vocab().len());
    cfg.max_len = task.seq_len();
    let run = |autocast_bf16: bool| -> Result<(Vec<f32>, Evaluation)> {
        let (model, varmap) = build(&cfg)?;
        let tc = TrainConfig {
            steps: 120,
            eval_every: 0,
            autocast_bf16,
            ..TrainConfig::default()
        };
        let mut trainer = Trainer::new(model, varmap, tc, None)?;
        let mut losses = Losses(Vec::new());
        let eval = trainer.run(&train, &val, None, &mut losses)?;
        Ok((losses.0, eval))
    };
    let (f32_losses, f32_eval) = run(false)?;
    let (bf16_losses, bf16_eval) = run(true)?;
    assert_eq!(f32_losses.len(), 120);
    assert_eq!(bf16_losses.len(), 120);
    let worst = f32_losses
        .iter()
        .zip(&bf16_losses)
        .map(|(a, b)| ((a - b) / a).abs())
        .fold(0f32, f32::max);
    let last = (bf16_eval.loss - f32_eval.loss) / f32_eval.loss;
    println!(
        "after 120 steps: validation loss f32 {:.4}, bf16 {:.4} ({:+.2}%); worst step gap {:.2}%",
        f32_eval.loss,
        bf16_eval.loss,
        100.0 * last,
        100.0 * worst
    );
    assert!(
        worst < 0.02,
        "a step's loss differs by {:.2}%",
        100.0 * worst
    );
    assert!(
        last.abs() < 0.02,
        "validation loss differs by {:.2}%",
        100.0 * last
    );
    assert_ne!(f32_losses, bf16_losses, "bf16 products gave f32's numbers");
    Ok(())
}
