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

/// The Markdown a user reads: the README, the guides in `docs/` and the crates' READMEs.
#[cfg(test)]
fn guide_files(root: &std::path::Path) -> Vec<std::path::PathBuf> {
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
    docs
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
        let docs = super::guide_files(&root);
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

/// The README's and guides' Rust names exist: a code span `candle_mha…::path` names an item,
/// module, re-export or member in the crates' rustdoc output, and a span `Type::member` whose
/// `Type` is one of the crates' items names a method, variant, field or constant of it. Reads
/// the HTML of `cargo doc --no-deps --workspace` (CI builds it first); without it the test is
/// skipped, unless `MHA_REQUIRE_DOCS` is set.
#[cfg(test)]
mod items {
    use std::collections::{HashMap, HashSet};
    use std::path::{Path, PathBuf};

    const CRATES: [&str; 3] = ["candle_mha", "candle_mha_train", "candle_mha_viz"];
    const ITEM_KINDS: [&str; 9] = [
        "struct", "enum", "trait", "fn", "macro", "type", "constant", "static", "union",
    ];
    /// Items built only with a feature the docs build leaves out (`mpi`, `nccl`).
    const FEATURE_GATED: [&str; 2] = [
        "candle_mha_train::distributed::MpiCommunicator",
        "candle_mha_train::distributed::NcclCommunicator",
    ];
    const MEMBER_KINDS: [&str; 6] = [
        "method",
        "tymethod",
        "variant",
        "structfield",
        "associatedconstant",
        "associatedtype",
    ];

    /// Every documented item and module of the crates: full path → its HTML page.
    fn index(doc: &Path) -> HashMap<String, PathBuf> {
        let mut out = HashMap::new();
        let mut stack: Vec<(PathBuf, String)> = CRATES
            .iter()
            .map(|c| (doc.join(c), c.to_string()))
            .collect();
        while let Some((dir, module)) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            out.insert(module.clone(), dir.join("index.html"));
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if entry.path().is_dir() {
                    stack.push((entry.path(), format!("{module}::{name}")));
                } else if let Some((kind, rest)) = name.split_once('.') {
                    if let (true, Some(item)) =
                        (ITEM_KINDS.contains(&kind), rest.strip_suffix(".html"))
                    {
                        out.insert(format!("{module}::{item}"), entry.path());
                    }
                }
            }
        }
        out
    }

    /// The Rust paths `text` names in code spans: `a::b::c` (a call's `(…)` and generics cut),
    /// `T::{a, b}` as `T::a` and `T::b`.
    fn rust_paths(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        for span in text.split('`').skip(1).step_by(2) {
            let head: String = span
                .chars()
                .take_while(|c| {
                    c.is_alphanumeric() || matches!(c, '_' | ':' | '{' | '}' | ',' | ' ')
                })
                .collect();
            let head = head.split(' ').next().unwrap_or("").to_string();
            let head = match (head.find("::{"), span.find('}')) {
                (Some(i), Some(j)) if j > i => span[..=j].to_string(),
                _ => head,
            };
            if !head.contains("::") {
                continue;
            }
            match head.split_once("::{") {
                Some((base, group)) => {
                    for m in group.trim_end_matches('}').split(',') {
                        out.push(format!("{base}::{}", m.trim()));
                    }
                }
                None => out.push(head.trim_end_matches(':').to_string()),
            }
        }
        out.retain(|p| {
            p.split("::")
                .all(|s| !s.is_empty() && !s.contains(['{', '}', ',']))
        });
        out
    }

    /// Whether `page` documents a member called `name`.
    fn has_member(page: &Path, name: &str) -> bool {
        let html = std::fs::read_to_string(page).unwrap_or_default();
        MEMBER_KINDS
            .iter()
            .any(|k| html.contains(&format!("id=\"{k}.{name}\"")))
    }

    /// Whether `path` (crate-qualified, or `Type::member` of one of the crates' types) exists;
    /// `None` when it is not ours to check (another crate's type).
    fn exists(
        path: &str,
        index: &HashMap<String, PathBuf>,
        short: &HashMap<String, Vec<&PathBuf>>,
    ) -> Option<bool> {
        let segments: Vec<&str> = path.split("::").collect();
        if CRATES.contains(&segments[0]) {
            if index.contains_key(path) {
                return Some(true);
            }
            let (parent, last) = path.rsplit_once("::")?;
            // A re-export (`pub use`) in the parent module, or a member of the parent item.
            let found = index.get(parent).is_some_and(|page| {
                std::fs::read_to_string(page)
                    .unwrap_or_default()
                    .contains(&format!("id=\"reexport.{last}\""))
                    || has_member(page, last)
            });
            return Some(found);
        }
        match segments.as_slice() {
            [ty, member] if ty.starts_with(char::is_uppercase) => {
                let pages = short.get(*ty)?;
                Some(pages.iter().any(|p| has_member(p, member)))
            }
            _ => None,
        }
    }

    #[test]
    fn every_named_rust_item_exists() {
        let root = PathBuf::from(env!("MHA_WORKSPACE_DIR"));
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"));
        let doc = target.join("doc");
        if !doc.join("candle_mha_train/index.html").exists() {
            assert!(
                std::env::var_os("MHA_REQUIRE_DOCS").is_none(),
                "no rustdoc output in {}: run `cargo doc --no-deps --workspace` first",
                doc.display()
            );
            eprintln!("skipped: no rustdoc output in {}", doc.display());
            return;
        }
        let index = index(&doc);
        let mut short: HashMap<String, Vec<&PathBuf>> = HashMap::new();
        for (path, page) in &index {
            let name = path.rsplit("::").next().unwrap_or(path);
            if name.starts_with(char::is_uppercase) {
                short.entry(name.to_string()).or_default().push(page);
            }
        }
        let docs = super::guide_files(&root);
        let (mut checked, mut missing) = (HashSet::new(), Vec::new());
        for file in &docs {
            let text = std::fs::read_to_string(file).unwrap();
            for path in rust_paths(&text) {
                if FEATURE_GATED.contains(&path.as_str()) {
                    continue;
                }
                match exists(&path, &index, &short) {
                    Some(true) => {
                        checked.insert(path);
                    }
                    Some(false) => missing.push(format!("{}: `{path}`", file.display())),
                    None => {}
                }
            }
        }
        eprintln!("{} Rust names checked", checked.len());
        assert!(
            checked.len() >= 20,
            "only {} names checked: {checked:?}",
            checked.len()
        );
        assert!(
            missing.is_empty(),
            "named but not in the crates' docs (or the docs in target/doc are older than the code: `cargo doc --no-deps --workspace`):\n{}",
            missing.join("\n")
        );
    }

    #[test]
    fn the_scanner_finds_rust_paths() {
        let text = "call `candle_mha::runtime::retain_freed_memory()`, `Trainer::train_step` \
                    and `TrainSource::{describe, into_sequences}`, not `cargo test` or `x`";
        assert_eq!(
            rust_paths(text),
            [
                "candle_mha::runtime::retain_freed_memory",
                "Trainer::train_step",
                "TrainSource::describe",
                "TrainSource::into_sequences"
            ]
        );
    }
}
