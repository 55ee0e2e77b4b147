//! `mha generate`: greedy or sampled (--top-k, --top-p, --temperature), argument errors, and
//! the output of text and symbol models, on tiny checkpoints trained by the tests.

use std::path::Path;

mod common;

use anyhow::Result;
use common::mha;

/// Trains a tiny model on `data` (`--tokens` or `--text`) into `out`.
fn train(kind: &str, data: &Path, out: &Path, extra: &[&str]) -> Result<()> {
    let mut args = vec![
        "train",
        kind,
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--embed-dim",
        "32",
        "--num-heads",
        "2",
        "--num-layers",
        "1",
        "--batch-size",
        "16",
        "--quiet",
    ];
    args.extend(extra);
    let (ok, stdout, stderr) = mha(&args)?;
    assert!(ok, "{stdout}{stderr}");
    Ok(())
}

/// `mha generate` on `ckpt` with `prompt` and more arguments: (success, stdout, stderr).
fn gen(ckpt: &Path, prompt: &str, extra: &[&str]) -> Result<(bool, String, String)> {
    let mut args = vec![
        "generate",
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--prompt",
        prompt,
    ];
    args.extend(extra);
    mha(&args)
}

#[test]
fn sampling_options_on_a_symbol_model() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("events.txt");
    let lines: Vec<&str> = ["T1 T2 T3 T4 T3 T5", "T1 T3 T5 T2", "T1 T4 T3 T5 T5"]
        .into_iter()
        .cycle()
        .take(60)
        .collect();
    std::fs::write(&data, lines.join("\n") + "\n")?;
    let ckpt = dir.path().join("run");
    // Barely trained: greedy continues "T1 T3" with a few symbols, and the next-token
    // distribution is still broad, so samples vary.
    train("--tokens", &data, &ckpt, &["--steps", "30"])?;

    // Out-of-range values are refused by name before anything is loaded.
    for (flag, value) in [
        ("--top-p", "0"),
        ("--top-p", "1.5"),
        ("--top-p", "-0.1"),
        ("--top-p", "nan"),
        ("--temperature", "0"),
        ("--temperature", "-1"),
        ("--temperature", "inf"),
    ] {
        let (ok, _, stderr) = gen(&ckpt, "T1", &[&format!("{flag}={value}")])?;
        assert!(
            !ok && stderr.contains(&format!("{flag} {value}: expected")),
            "{flag} {value}: {stderr}"
        );
    }

    // Symbol models keep the two-line form.
    let n = ["--max-new-tokens", "8"];
    let (ok, greedy, stderr) = gen(&ckpt, "T1 T3", &n)?;
    assert!(ok && greedy.starts_with("T1 T3\n=> T"), "{greedy}{stderr}");
    // Greedy does not depend on the seed.
    let (_, greedy_seed_5, _) = gen(&ckpt, "T1 T3", &[n[0], n[1], "--seed", "5"])?;
    assert_eq!(greedy, greedy_seed_5);

    // --temperature alone samples (from the whole distribution): a seed gives the same
    // output each time, the seeds differ among themselves and from greedy.
    let mut sampled = Vec::new();
    for seed in ["0", "1", "2", "3"] {
        let (ok, out, stderr) = gen(
            &ckpt,
            "T1 T3",
            &[n[0], n[1], "--temperature", "1.5", "--seed", seed],
        )?;
        assert!(ok && out.starts_with("T1 T3\n=> "), "{out}{stderr}");
        sampled.push(out);
    }
    let (_, again, _) = gen(
        &ckpt,
        "T1 T3",
        &[n[0], n[1], "--temperature", "1.5", "--seed", "2"],
    )?;
    assert_eq!(again, sampled[2]);
    assert!(sampled.iter().any(|s| *s != greedy), "{sampled:?} {greedy}");
    assert!(sampled.iter().any(|s| *s != sampled[0]), "{sampled:?}");

    // --top-p alone samples too; a tiny nucleus keeps only the most likely token: greedy.
    let (ok, tiny, stderr) = gen(
        &ckpt,
        "T1 T3",
        &[n[0], n[1], "--top-p", "1e-9", "--temperature", "1.5"],
    )?;
    assert!(ok, "{stderr}");
    assert_eq!(tiny, greedy);
    let (ok, out, stderr) = gen(&ckpt, "T1 T3", &["--top-p", "0.9", "--top-k", "3"])?;
    assert!(ok && out.starts_with("T1 T3\n=> "), "{out}{stderr}");
    Ok(())
}

#[test]
fn a_text_model_prints_the_prompt_and_its_continuation_as_one_text() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ckpt = text_checkpoint(dir.path())?;
    // The corpus is learned: greedy continues the sentence, printed after the prompt as
    // typed, with the space between them, on one line.
    let (ok, out, stderr) = gen(&ckpt, "The license is", &["--max-new-tokens", "4"])?;
    assert!(ok, "{stderr}");
    assert!(out.starts_with("The license is granted to"), "{out:?}");
    assert!(!out.contains("=>"), "{out:?}");
    // Sampled continuations are appended the same way.
    let (ok, out, stderr) = gen(
        &ckpt,
        "The software",
        &[
            "--max-new-tokens",
            "4",
            "--top-p",
            "0.9",
            "--temperature",
            "0.8",
        ],
    )?;
    assert!(
        ok && out.starts_with("The software") && !out.contains("=>"),
        "{out:?}{stderr}"
    );
    Ok(())
}

/// A tiny text model (context 16) trained on three sentences, in `dir/run`.
fn text_checkpoint(dir: &Path) -> Result<std::path::PathBuf> {
    let corpus = dir.join("corpus.txt");
    let lines = [
        "The license is granted to any person obtaining a copy.",
        "Permission is hereby granted, free of charge, to any person.",
        "The software is provided as is, without warranty of any kind.",
    ];
    let text: Vec<&str> = lines.into_iter().cycle().take(300).collect();
    std::fs::write(&corpus, text.join("\n") + "\n")?;
    let ckpt = dir.join("run");
    let args = [
        "--steps",
        "200",
        "--lr",
        "1e-2",
        "--warmup",
        "20",
        "--max-len",
        "16",
        "--bpe-vocab",
        "300",
    ];
    train("--text", &corpus, &ckpt, &args)?;
    Ok(ckpt)
}

#[test]
fn the_cache_several_prompts_and_no_kv_cache_print_the_same_texts() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ckpt = text_checkpoint(dir.path())?;
    // 24 new tokens outgrow the context of 16: the cache path slides it as the old path does.
    let n = ["--max-new-tokens", "24"];
    for prompt in [
        "The license is",
        "Permission",
        "The software is provided as is, without",
    ] {
        let (ok, cached, stderr) = gen(&ckpt, prompt, &n)?;
        assert!(ok && cached.starts_with(prompt), "{cached:?}{stderr}");
        let (ok, plain, stderr) = gen(&ckpt, prompt, &[n[0], n[1], "--no-kv-cache"])?;
        assert!(ok, "{stderr}");
        assert_eq!(cached, plain, "{prompt:?}");
    }
    // Several --prompt: one batch, each printed as alone, in order (greedy and sampled).
    for extra in [&[][..], &["--top-k", "3", "--seed", "4"]] {
        let prompts = [
            "The license is",
            "Permission",
            "The software is provided as is, without",
        ];
        let mut alone = String::new();
        for p in prompts {
            let mut args = vec![n[0], n[1]];
            args.extend(extra);
            let (ok, out, stderr) = gen(&ckpt, p, &args)?;
            assert!(ok, "{stderr}");
            alone.push_str(&out);
        }
        let mut args = vec![n[0], n[1], "--prompt", prompts[1], "--prompt", prompts[2]];
        args.extend(extra);
        let (ok, batch, stderr) = gen(&ckpt, prompts[0], &args)?;
        assert!(ok, "{stderr}");
        assert_eq!(batch, alone, "{extra:?}");
    }
    Ok(())
}
