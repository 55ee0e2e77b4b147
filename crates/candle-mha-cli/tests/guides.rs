//! Every command the README and the guides show with its output (a `text` block whose first
//! line is `$ mha …` or `$ cargo run --release -- …`) is run, in order, in one scratch
//! directory, and its output (stdout and stderr as written) compared with the block.
//!
//! In a block, a line `…` stands for any number of lines, and `…` inside a line for any text
//! (timings and speeds, which vary). Everything else must match exactly: a changed output
//! fails here until the guide is updated. A block right after the line [`VARIES_BY_CPU`] shows
//! a trained model's numbers, whose digits depend on the CPU (its vector width orders the sums
//! of every product and reduction, and training amplifies the last bits): there every decimal
//! fraction stands for any other, and the rest of each line must still match.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// The Markdown comment that marks the next block's decimal numbers as the CPU's.
const VARIES_BY_CPU: &str = "<!-- guides: the digits vary with the CPU -->";

/// One shown command: where it is, its arguments after `mha`, the lines shown, and whether
/// its decimal numbers are the CPU's ([`VARIES_BY_CPU`]).
struct Shown {
    place: String,
    args: Vec<String>,
    expected: Vec<String>,
    varies: bool,
}

/// The shown commands of one Markdown file.
fn shown_commands(name: &str, text: &str) -> Result<Vec<Shown>> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate();
    let mut previous = "";
    while let Some((i, line)) = lines.next() {
        let varies = previous == VARIES_BY_CPU;
        previous = line;
        if line != "```text" {
            continue;
        }
        let block: Vec<&str> = lines
            .by_ref()
            .map(|(_, l)| l)
            .take_while(|l| !l.starts_with("```"))
            .collect();
        let Some(command) = block.first().and_then(|l| l.strip_prefix("$ ")) else {
            continue;
        };
        let words = common::shell_words(command)?;
        let args = match words.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["mha", ..] => words[1..].to_vec(),
            ["cargo", "run", "--release", "--", ..] => words[4..].to_vec(),
            _ => bail!("{name}:{}: {command:?} is not an mha command", i + 2),
        };
        out.push(Shown {
            place: format!("{name}:{}", i + 2),
            args,
            expected: block[1..].iter().map(|l| l.to_string()).collect(),
            varies,
        });
    }
    Ok(out)
}

/// Whether `line` matches `pattern`, whose `…` stand for any text.
fn line_matches(pattern: &str, line: &str) -> bool {
    let parts: Vec<&str> = pattern.split('…').collect();
    if parts.len() == 1 {
        return pattern == line;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !line.starts_with(first) || line.len() < first.len() + last.len() || !line.ends_with(last) {
        return false;
    }
    let mut rest = &line[first.len()..line.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// Whether the `actual` lines match the `expected` ones, a whole-line `…` standing for any
/// number of lines.
fn lines_match(expected: &[String], actual: &[&str]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((e, rest)) if e == "…" => {
            (0..=actual.len()).any(|k| lines_match(rest, &actual[k..]))
        }
        Some((e, rest)) => {
            actual.first().is_some_and(|a| line_matches(e, a)) && lines_match(rest, &actual[1..])
        }
    }
}

/// `line` with each decimal fraction (`0.986`, `-1.25`) replaced by `#`: what a
/// [`VARIES_BY_CPU`] block compares. Integers (layer and head numbers, counts) stay.
fn without_fractions(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let (mut out, mut i) = (String::new(), 0);
    let digits = |from: usize| {
        chars[from..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count()
    };
    while i < chars.len() {
        let whole = digits(i);
        let fraction = match chars.get(i + whole) {
            Some('.') if whole > 0 => digits(i + whole + 1),
            _ => 0,
        };
        if fraction > 0 {
            out.push('#');
            i += whole + 1 + fraction;
        } else {
            out.extend(&chars[i..i + whole.max(1)]);
            i += whole.max(1);
        }
    }
    out
}

/// Runs `mha args` in `dir`, stdout and stderr into one file, as a terminal shows them.
fn run(dir: &Path, args: &[String]) -> Result<String> {
    let log = dir.join(".output");
    let file = std::fs::File::create(&log)?;
    let status = Command::new(common::mha_exe()?)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .status()?;
    let text = std::fs::read_to_string(&log)?;
    if !status.success() {
        bail!("mha {} failed:\n{text}", args.join(" "))
    }
    Ok(text)
}

#[test]
fn the_guides_show_what_the_commands_print() -> Result<()> {
    let root = common::repo_root();
    let mut files: Vec<PathBuf> = vec![root.join("README.md")];
    let mut guides: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    guides.sort();
    files.extend(
        guides
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "md")),
    );
    let mut shown = Vec::new();
    for path in &files {
        let name = path.strip_prefix(&root)?.display().to_string();
        shown.extend(shown_commands(&name, &std::fs::read_to_string(path)?)?);
    }
    assert!(
        shown.len() >= 5,
        "only {} shown commands found",
        shown.len()
    );

    // The commands' relative paths: the fixtures under tests/, runs and outputs here.
    let tmp = tempfile::tempdir()?;
    std::os::unix::fs::symlink(root.join("tests"), tmp.path().join("tests"))?;
    let mut failures = Vec::new();
    for s in &shown {
        if s.args.first().is_some_and(|a| a == "train") && !s.args.iter().any(|a| a == "--out") {
            // Each shown `mha train` starts the default run afresh.
            let _ = std::fs::remove_dir_all(tmp.path().join("runs/mha"));
        }
        let output = run(tmp.path(), &s.args).with_context(|| s.place.clone())?;
        // Both sides as compared: whole, or without fractions where the digits are the CPU's.
        let compared = |l: &str| match s.varies {
            true => without_fractions(l),
            false => l.to_string(),
        };
        let expected: Vec<String> = s.expected.iter().map(|l| compared(l)).collect();
        // The build's note (`mha train` in a build without MKL) depends on the CPU's maker.
        let actual: Vec<String> = output
            .lines()
            .filter(|l| !l.starts_with("note: on this Intel CPU"))
            .map(compared)
            .collect();
        let actual: Vec<&str> = actual.iter().map(String::as_str).collect();
        if !lines_match(&expected, &actual) {
            failures.push(format!(
                "{}: `mha {}` printed:\n{output}\nwhere the guide shows:\n{}",
                s.place,
                s.args.join(" "),
                s.expected.join("\n")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    Ok(())
}

/// The matcher itself: `…` lines and inline `…` stand for what varies, nothing else does.
#[test]
fn the_matcher_allows_only_what_is_marked() {
    let e = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(lines_match(&e(&["a", "…", "z"]), &["a", "b", "c", "z"]));
    assert!(lines_match(&e(&["a", "…", "z"]), &["a", "z"]));
    assert!(!lines_match(&e(&["a", "z"]), &["a", "b", "z"]));
    assert!(lines_match(
        &e(&["step 1: … tok/s"]),
        &["step 1: 123 tok/s"]
    ));
    assert!(!lines_match(
        &e(&["step 1: … tok/s"]),
        &["step 2: 123 tok/s"]
    ));
    assert!(!lines_match(&e(&["loss 1.0000"]), &["loss 1.0001"]));
    // Where the digits are the CPU's, any fraction matches any other; integers and text do not.
    let masked = |l: &str| without_fractions(l);
    assert_eq!(masked("k5  0.000 -1.25 0.986 x"), "k5  # -# # x");
    assert_eq!(masked("layer 1, 4 heads: 12.5%"), "layer 1, 4 heads: #%");
    assert_eq!(masked("v1. 3.x"), "v1. 3.x");
    assert_ne!(masked("layer 1: 0.5"), masked("layer 2: 0.5"));
}
