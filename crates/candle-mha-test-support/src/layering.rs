//! A crate's floors: no module imports from a floor above its own. Every `crate::` path
//! outside comments is resolved to its top-level module (through the crate root's re-exports
//! where it names an item) and compared. The core's and the trainer's `tests/layering.rs` use
//! it with their own floors.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The code of `text` without its comment lines (doc links may point anywhere).
fn code(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first identifiers after `crate::` in `code`, `crate::{a::x, b}` giving `a` and `b`.
fn crate_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        // `$crate::` in a macro and longer names ending in `crate` are not this crate's root.
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = &group[..group.find('}').unwrap_or(group.len())];
            for part in inner.split(',') {
                let name = part.trim().split("::").next().unwrap_or("").trim();
                if !name.is_empty() {
                    out.push(name.to_string());
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.push(name);
        }
    }
    out
}

/// The crate root's re-exports: item name → the module it comes from.
pub fn root_reexports(lib: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for stmt in code(lib).split(';') {
        let Some(rest) = stmt.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, items)) = rest.split_once("::") else {
            continue;
        };
        let items = items.trim().trim_start_matches('{').trim_end_matches('}');
        for item in items.split(',') {
            let name = item.rsplit("::").next().unwrap_or("").trim();
            if !name.is_empty() {
                out.insert(name.to_string(), module.trim().to_string());
            }
        }
    }
    out
}

/// Every `.rs` file below `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src is readable").flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The imports of `text` (a file of top-level module `module`) that reach above its floor in
/// `floors` (module, floor from the bottom), as lines; an error line for a module or name no
/// floor covers. `reexports`: [`root_reexports`] of the crate's `lib.rs`.
pub fn violations(
    module: &str,
    text: &str,
    floors: &[(&str, u8)],
    reexports: &HashMap<String, String>,
) -> Vec<String> {
    let floors: HashMap<&str, u8> = floors.iter().copied().collect();
    let Some(&own) = floors.get(module) else {
        return vec![format!("module {module} has no floor in FLOORS")];
    };
    let mut out = Vec::new();
    for name in crate_paths(&code(text)) {
        let target = match floors.get(name.as_str()) {
            Some(_) => name.clone(),
            None => match reexports.get(&name) {
                Some(m) => m.clone(),
                None => {
                    out.push(format!(
                        "{module}: crate::{name} is neither a module nor a re-export"
                    ));
                    continue;
                }
            },
        };
        let floor = floors.get(target.as_str()).copied().unwrap_or(u8::MAX);
        if floor > own {
            out.push(format!(
                "{module} (floor {own}) imports crate::{name} ({target}, floor {floor})"
            ));
        }
    }
    out
}

/// Every import against `floors` in the crate whose `src` folder is `src` (its `lib.rs` read
/// for re-exports), as `file: line` messages, and the number of files read.
pub fn crate_violations(src: &Path, floors: &[(&str, u8)]) -> (Vec<String>, usize) {
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("src/lib.rs is readable");
    let reexports = root_reexports(&lib);
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut found = Vec::new();
    for path in &files {
        let rel = path.strip_prefix(src).expect("below src");
        let first = rel
            .components()
            .next()
            .expect("a file below src")
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs");
        if module == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(path).expect("a source file is readable");
        for v in violations(module, &text, floors, &reexports) {
            found.push(format!("{}: {v}", rel.display()));
        }
    }
    (found, files.len())
}
