//! The README's Rust examples as doctests, built against exactly the crates its
//! `[dependencies]` block lists. The guides' examples live with the crate whose API they
//! show: `docs/checkpoints.md` and `docs/masks-and-differences.md` with `candle-mha`,
//! `docs/reading-attention.md` with `candle-mha-viz`.

#[cfg(doctest)]
#[doc = include_str!(concat!(env!("MHA_WORKSPACE_DIR"), "/README.md"))]
pub struct Readme;

#[cfg(test)]
mod tests {
    /// The crate names of a `[dependencies]` table's lines (`name = …`, `name.workspace = …`).
    fn dependency_names(toml: &str) -> Vec<String> {
        let table = toml
            .split("[dependencies]\n")
            .nth(1)
            .unwrap_or("")
            .split("\n[")
            .next()
            .unwrap_or("");
        let mut names: Vec<String> = table
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .filter_map(|l| l.split_once('=').map(|(k, _)| k.trim()))
            .map(|k| k.trim_end_matches(".workspace").to_string())
            .filter(|k| !k.is_empty())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn the_readme_lists_the_dependencies_its_examples_compile_with() {
        let readme = include_str!(concat!(env!("MHA_WORKSPACE_DIR"), "/README.md"));
        let block = readme
            .split("```toml\n")
            .nth(1)
            .and_then(|b| b.split("```").next())
            .expect("the README has a toml block");
        let ours = dependency_names(include_str!("../Cargo.toml"));
        assert_eq!(dependency_names(block), ours);
        assert_eq!(ours, ["candle-mha", "candle-mha-train"]);
    }
}

/// The README's and guides' references to files of the repository exist: code spans naming a
/// path under `src/`, `crates/`, `tests/`, `scripts/`, `benches/`, `examples/` or `docs/`, and
/// relative Markdown links.
#[cfg(test)]
mod paths {
    use std::path::{Path, PathBuf};

    const ROOTS: [&str; 7] = [
        "src/",
        "crates/",
        "tests/",
        "scripts/",
        "benches/",
        "examples/",
        "docs/",
    ];

    /// The repository paths `text` names in code spans, `:LINE` suffixes removed.
    fn code_span_paths(text: &str) -> Vec<String> {
        text.split('`')
            .skip(1)
            .step_by(2)
            .filter(|span| ROOTS.iter().any(|r| span.starts_with(r)))
            .filter(|span| !span.contains([' ', '*', '{', '<', '…', '$']))
            .map(|span| span.split(':').next().unwrap_or(span).to_string())
            .collect()
    }

    /// The relative targets of Markdown links `[…](target)`, anchors removed.
    fn link_targets(text: &str) -> Vec<String> {
        text.split("](")
            .skip(1)
            .filter_map(|rest| rest.split(')').next())
            .filter(|t| !t.contains("://") && !t.starts_with('#') && !t.starts_with("mailto:"))
            .map(|t| t.split('#').next().unwrap_or(t).to_string())
            .filter(|t| !t.is_empty())
            .collect()
    }

    #[test]
    fn every_named_file_exists() {
        let root = PathBuf::from(env!("MHA_WORKSPACE_DIR"));
        let mut docs = vec![root.join("README.md")];
        for dir in [
            "docs",
            "crates/candle-mha-cli",
            "crates/candle-mha-train",
            "crates/candle-mha-viz",
        ] {
            for entry in std::fs::read_dir(root.join(dir)).unwrap().flatten() {
                if entry.path().extension().is_some_and(|e| e == "md") {
                    docs.push(entry.path());
                }
            }
        }
        let mut missing = Vec::new();
        for doc in &docs {
            let text = std::fs::read_to_string(doc).unwrap();
            let here = doc.parent().unwrap_or(Path::new("."));
            for p in code_span_paths(&text) {
                if !root.join(&p).exists() {
                    missing.push(format!("{}: `{p}`", doc.display()));
                }
            }
            for t in link_targets(&text) {
                if !here.join(&t).exists() {
                    missing.push(format!("{}: link ({t})", doc.display()));
                }
            }
        }
        assert!(docs.len() >= 8, "{docs:?}");
        assert!(
            missing.is_empty(),
            "named but missing:\n{}",
            missing.join("\n")
        );
    }

    #[test]
    fn the_scanners_find_paths_and_links() {
        let text = "see `src/lib.rs:12`, `cargo test`, `crates/*/src` and [guide](docs/x.md#a), [web](https://x)";
        assert_eq!(code_span_paths(text), ["src/lib.rs"]);
        assert_eq!(link_targets(text), ["docs/x.md"]);
    }
}
