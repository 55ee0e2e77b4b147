//! Every `sh` block of the guides (`docs/*.md` but the benchmarks' page, whose commands are
//! the benchmarks) runs here, in order, in one scratch directory per guide: `mha` commands and
//! the examples (`cargo run --release --example NAME`: the binary `cargo test` built beside
//! `mha`). A block that cannot run here (a GPU, Python, MPI, CI itself) follows a line
//! `<!-- guides: not run: REASON -->`, and its guide says why in its text.
//!
//! What the blocks name as the user's own is put in place first, under the names the guides
//! use: their text (`corpus.txt`, `my_notes/`, `docs/`, `notes/*.txt`, `held_out.txt`, the
//! licenses directory: the GPL's text), token sequences (`events.txt`), and small models of
//! the formats a user downloads (`tests/fixtures/guides`: a GPT-2 directory with its tokenizer,
//! a PEFT adapter on it, a SmolLM2-shaped Llama; nanoGPT's own `ckpt.pt` and data).
//! Training is cut short: a new run trains 2 steps, a resumed run 2 more than it holds. Every
//! command must succeed.

mod common;

use std::path::Path;

use anyhow::{bail, Context, Result};

/// The pages of `docs/` that are not guides: their commands are the benchmarks.
const NOT_GUIDES: [&str; 1] = ["benchmarks.md"];

/// The marker of a block that cannot run here.
const NOT_RUN: &str = "<!-- guides: not run:";

/// The `sh` blocks of `text`: their lines, and whether they are marked [`NOT_RUN`].
fn sh_blocks(text: &str) -> Vec<(Vec<String>, bool)> {
    let mut out = Vec::new();
    let mut previous = "";
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let marked = previous.starts_with(NOT_RUN);
        previous = line;
        if line != "```sh" {
            continue;
        }
        let block: Vec<String> = lines
            .by_ref()
            .take_while(|l| !l.starts_with("```"))
            .map(str::to_string)
            .collect();
        out.push((block, marked));
    }
    out
}

/// `line` without its `# comment` (a `#` after a blank, outside quotes).
fn without_comment(line: &str) -> &str {
    let mut quote = None;
    let mut previous = ' ';
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '#') if previous.is_whitespace() => return line[..i].trim_end(),
            _ => {}
        }
        previous = c;
    }
    line.trim_end()
}

/// The commands of a block: continued lines joined, `&&` split, comments and blank lines
/// dropped.
fn commands(block: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in block {
        let line = without_comment(line);
        match line.strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(line);
                // `a && b` runs both (the test stops at the first failure anyway).
                for part in current.split(" && ") {
                    if !part.trim().is_empty() {
                        out.push(part.trim().to_string());
                    }
                }
                current.clear();
            }
        }
    }
    out
}

/// What a guide's command runs: `mha` (`mha …`, `cargo run --release -- …`,
/// `target/release/mha …`) or an example (`cargo run --release --example NAME [-- …]`), and
/// its arguments.
#[derive(Debug, PartialEq)]
enum Program {
    Mha,
    Example(String),
}

fn program(command: &str) -> Result<(Program, Vec<String>)> {
    let words = common::shell_words(command)?;
    let w: Vec<&str> = words.iter().map(String::as_str).collect();
    let (program, at) = match w[..] {
        ["mha", ..] | ["target/release/mha", ..] => (Program::Mha, 1),
        ["cargo", "run", "--release", "--", ..] => (Program::Mha, 4),
        ["cargo", "run", "--release", "--example", name, "--", ..] => {
            (Program::Example(name.to_string()), 6)
        }
        ["cargo", "run", "--release", "--example", name] => (Program::Example(name.to_string()), 5),
        _ => bail!(
            "{command:?} is not an mha command or an example (mark its block {NOT_RUN} … -->)"
        ),
    };
    Ok((program, words[at..].to_vec()))
}

/// [`program`]'s arguments of an `mha` command.
#[cfg(test)]
fn mha_args(command: &str) -> Result<Vec<String>> {
    match program(command)? {
        (Program::Mha, args) => Ok(args),
        (other, _) => bail!("{command:?} runs {other:?}"),
    }
}

/// The binary of `program`: `mha`, or an example's beside it (`cargo test` at the root builds
/// every example).
fn binary(program: &Program) -> Result<std::path::PathBuf> {
    let mha = Path::new(common::mha_exe()?);
    match program {
        Program::Mha => Ok(mha.to_path_buf()),
        Program::Example(name) => {
            let exe = mha.with_file_name("examples").join(name);
            anyhow::ensure!(
                exe.exists(),
                "{}: not built; `cargo test --release` at the workspace's root builds every example",
                exe.display()
            );
            Ok(exe)
        }
    }
}

/// `args` with its training cut short: 2 steps for a new run, 2 more than the run holds for a
/// resumed one (its `trainer_state.json` in `dir`).
fn short(mut args: Vec<String>, dir: &Path) -> Result<Vec<String>> {
    if args.first().map(String::as_str) != Some("train") {
        return Ok(args);
    }
    let value = |name: &str| {
        let at = args.iter().position(|a| a == name)?;
        args.get(at + 1).cloned()
    };
    let steps = match args.iter().any(|a| a == "--resume") {
        false => 2,
        true => {
            let out = value("--out").unwrap_or_else(|| "runs/mha".into());
            let state = std::fs::read_to_string(dir.join(out).join("trainer_state.json"))?;
            let state: serde_json::Value = serde_json::from_str(&state)?;
            state["step"]
                .as_u64()
                .context("a step in trainer_state.json")?
                + 2
        }
    };
    match args.iter().position(|a| a == "--steps") {
        Some(at) => args[at + 1] = steps.to_string(),
        None => args.extend(["--steps".to_string(), steps.to_string()]),
    }
    Ok(args)
}

/// Copies the directory `from` to `to`.
fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        match entry.file_type()?.is_dir() {
            true => copy_dir(&entry.path(), &target)?,
            false => {
                std::fs::copy(entry.path(), target)?;
            }
        }
    }
    Ok(())
}

/// The user's own files the guides name, in `dir`.
fn user_files(dir: &Path) -> Result<()> {
    let fixtures = common::fixtures_dir();
    let text = std::fs::read_to_string(common::gpl_text())?;
    for d in ["my_notes", "docs", "notes", "licenses"] {
        std::fs::create_dir_all(dir.join(d))?;
    }
    for f in [
        "corpus.txt",
        "held_out.txt",
        "other.txt",
        "my_notes/notes.txt",
        "docs/gpl.txt",
        "notes/a.txt",
        "licenses/GPL-3",
    ] {
        std::fs::write(dir.join(f), &text)?;
    }
    let events: Vec<String> = (0..200)
        .map(|i| format!("T{} T{} T{} T{}", i % 5, (i + 1) % 7, (i * 3) % 5, i % 3))
        .collect();
    std::fs::write(dir.join("events.txt"), events.join("\n"))?;
    let guides = fixtures.join("guides");
    copy_dir(&guides.join("gpt2-dir"), &dir.join("gpt2-dir"))?;
    copy_dir(
        &guides.join("gpt2-adapter"),
        &dir.join("someone-elses-adapter"),
    )?;
    copy_dir(&guides.join("SmolLM2-135M"), &dir.join("SmolLM2-135M"))?;
    copy_dir(
        &guides.join("shakespeare_char"),
        &dir.join("data/shakespeare_char"),
    )?;
    // checkpoints.md reads a fixture by its path in the repository.
    let ckpt = "tests/fixtures/checkpoints/encoder_bf.pt";
    std::fs::create_dir_all(dir.join("tests/fixtures/checkpoints"))?;
    std::fs::copy(common::repo_root().join(ckpt), dir.join(ckpt))?;
    std::fs::create_dir_all(dir.join("out-shakespeare-char"))?;
    std::fs::copy(
        fixtures.join("gpt2/nanogpt-own/ckpt.pt"),
        dir.join("out-shakespeare-char/ckpt.pt"),
    )?;
    Ok(())
}

#[test]
fn every_guide_block_runs_or_says_why_not() -> Result<()> {
    let docs = common::repo_root().join("docs");
    let mut guides: Vec<String> = std::fs::read_dir(&docs)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md") && !NOT_GUIDES.contains(&n.as_str()))
        .collect();
    guides.sort();
    assert!(guides.len() >= 8, "{guides:?}");
    let mut ran = 0;
    for guide in &guides {
        let text = std::fs::read_to_string(docs.join(guide))?;
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path();
        user_files(dir)?;
        for (block, marked) in sh_blocks(&text) {
            if marked {
                continue;
            }
            for command in commands(&block) {
                // The guides name the Debian machine's licenses; here they are the GPL's text.
                let command = command.replace("/usr/share/common-licenses", "licenses");
                let (program, args) = program(&command).context(guide.clone())?;
                let args = match program {
                    Program::Mha => short(args, dir)?,
                    Program::Example(_) => args,
                };
                eprintln!("{guide}: {program:?} {}", args.join(" "));
                let out = std::process::Command::new(binary(&program)?)
                    .args(&args)
                    .current_dir(dir)
                    .output()?;
                assert!(
                    out.status.success(),
                    "{guide}: {command}\n(run as {program:?} {args:?})\n{}\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                ran += 1;
            }
        }
    }
    assert!(ran >= 40, "only {ran} commands ran");
    Ok(())
}

/// The parser itself: comments, continuations, quotes and the commands it refuses.
#[test]
fn blocks_are_read_as_a_shell_would() -> Result<()> {
    let block: Vec<String> = [
        "mha train --text \"my # notes\" \\",
        "  --steps 5   # a comment",
        "",
        "cargo run --release -- eval --checkpoint runs/x && mha info runs/x",
    ]
    .map(str::to_string)
    .to_vec();
    let c = commands(&block);
    assert_eq!(c.len(), 3);
    assert_eq!(c[2], "mha info runs/x");
    assert_eq!(
        mha_args(&c[0])?,
        ["train", "--text", "my # notes", "--steps", "5"]
    );
    assert_eq!(mha_args(&c[1])?, ["eval", "--checkpoint", "runs/x"]);
    assert!(program("python -c 'import torch'").is_err());
    assert_eq!(
        program("cargo run --release --example quickstart -- a b")?,
        (
            Program::Example("quickstart".into()),
            vec!["a".into(), "b".into()]
        )
    );
    let tmp = tempfile::tempdir()?;
    assert_eq!(
        short(mha_args(&c[0])?, tmp.path())?,
        ["train", "--text", "my # notes", "--steps", "2"]
    );
    let text = "x\n<!-- guides: not run: a GPU -->\n```sh\nmha a\n```\n```sh\nmha b\n```\n";
    let blocks = sh_blocks(text);
    assert_eq!(blocks.len(), 2);
    assert!(blocks[0].1 && !blocks[1].1);
    Ok(())
}
