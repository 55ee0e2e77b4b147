//! The README's "Training on your own text" commands, run as written: every `mha` line of the
//! `sh` block that starts with `mha prepare --text`, in a directory holding the file it names.

mod common;

use anyhow::{bail, Context, Result};

/// The lines of the README's first `sh` block whose first line starts with `first`.
fn sh_block(readme: &str, first: &str) -> Result<Vec<String>> {
    let mut blocks = readme.split("```sh\n").skip(1);
    let block = blocks
        .find(|b| b.starts_with(first))
        .with_context(|| format!("no sh block starting with {first:?} in README.md"))?;
    let end = block.find("```").context("an unterminated sh block")?;
    Ok(block[..end].lines().map(str::to_string).collect())
}

#[test]
fn the_text_training_commands_run_as_written() -> Result<()> {
    let readme = std::fs::read_to_string(common::repo_root().join("README.md"))?;
    let lines = sh_block(&readme, "mha prepare --text")?;
    assert!(lines.len() >= 3, "{lines:?}");
    let dir = tempfile::tempdir()?;
    let text = dir.path().join("tests/fixtures/text");
    std::fs::create_dir_all(&text)?;
    std::fs::copy(common::gpl_text(), text.join("gpl-3.0.txt"))?;
    for line in &lines {
        let args = common::shell_words(line)?;
        if args.first().map(String::as_str) != Some("mha") {
            bail!("README line {line:?} is not an mha command")
        }
        let out = std::process::Command::new(common::mha_exe()?)
            .args(&args[1..])
            .current_dir(dir.path())
            .output()?;
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{line}\n{stdout}\n{stderr}");
        if args[1] == "generate" {
            assert!(stdout.starts_with("The licensee"), "{line}: {stdout}");
            assert!(stdout.len() > "The licensee".len() + 20, "{line}: {stdout}");
        }
        if args[1] == "eval" {
            assert!(stdout.contains("bigram"), "{line}: {stdout}");
        }
    }
    assert!(dir.path().join("runs/gpl/best/model.safetensors").exists());
    Ok(())
}
