//! The crate's floors (listed in `src/lib.rs`): no module imports from a floor above its own.
//! Every `crate::` path outside comments is resolved to its top-level module (through the
//! crate root's re-exports where it names an item) and compared.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Each top-level module's floor, from the bottom. A new module must be placed here.
const FLOORS: [(&str, u8); 16] = [
    ("setters", 0),
    ("rng", 0),
    ("init", 0),
    ("autograd", 0),
    ("device", 0),
    ("io", 0),
    ("runtime", 0),
    ("autocast", 0),
    ("numerics", 0),
    ("cpu", 0),
    ("nn", 1),
    ("attention", 2),
    ("bench_internals", 2),
    ("checkpoint", 3),
    ("optim", 3),
    ("transformer", 4),
];

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
fn root_reexports(lib: &str) -> HashMap<String, String> {
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

/// The imports of `text` (a file of module `module`) that reach above its floor, as
/// `module -> target` lines; an error line for a module or name no floor covers.
fn violations(module: &str, text: &str, reexports: &HashMap<String, String>) -> Vec<String> {
    let floors: HashMap<&str, u8> = FLOORS.into_iter().collect();
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

#[test]
fn no_module_imports_from_a_higher_floor() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let reexports = root_reexports(&lib);
    assert!(reexports
        .get("MultiheadAttention")
        .is_some_and(|m| m == "attention"));
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut found = Vec::new();
    for path in &files {
        let rel = path.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs");
        if module == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(path).unwrap();
        for v in violations(module, &text, &reexports) {
            found.push(format!("{}: {v}", rel.display()));
        }
    }
    assert!(
        files.len() > 50,
        "only {} files found under src/",
        files.len()
    );
    assert!(
        found.is_empty(),
        "imports against the floors:\n{}",
        found.join("\n")
    );
}

/// The checker itself: an upward import, through a path, a group or a re-export, is caught;
/// comments and equal floors are not.
#[test]
fn the_checker_catches_an_upward_import() {
    let reexports = HashMap::from([("MultiheadAttention".to_string(), "attention".to_string())]);
    assert_eq!(
        violations("nn", "use crate::attention::softmax::x;", &reexports).len(),
        1
    );
    assert_eq!(
        violations("nn", "use crate::{cpu::a, transformer::b};", &reexports).len(),
        1
    );
    assert_eq!(
        violations("cpu", "use crate::MultiheadAttention;", &reexports).len(),
        1
    );
    assert!(violations(
        "nn",
        "// see crate::transformer\nuse crate::cpu::a;",
        &reexports
    )
    .is_empty());
    assert!(violations("checkpoint", "use crate::optim::AdamW;", &reexports).is_empty());
    assert_eq!(violations("nn", "use crate::Nothing;", &reexports).len(), 1);
}
