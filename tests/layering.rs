//! The crate's floors (listed in `src/lib.rs`): no module imports from a floor above its own
//! (the checker: `candle_mha_test_support::layering`).

use std::collections::HashMap;
use std::path::Path;

use candle_mha_test_support::layering::{crate_violations, root_reexports, violations};

/// Each top-level module's floor, from the bottom. A new module must be placed here.
const FLOORS: [(&str, u8); 17] = [
    ("error", 0),
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

#[test]
fn no_module_imports_from_a_higher_floor() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    assert!(root_reexports(&lib)
        .get("MultiheadAttention")
        .is_some_and(|m| m == "attention"));
    let (found, files) = crate_violations(&src, &FLOORS);
    assert!(files > 50, "only {files} files found under src/");
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
    let v = |module, text| violations(module, text, &FLOORS, &reexports);
    assert_eq!(v("nn", "use crate::attention::softmax::x;").len(), 1);
    assert_eq!(v("nn", "use crate::{cpu::a, transformer::b};").len(), 1);
    assert_eq!(v("cpu", "use crate::MultiheadAttention;").len(), 1);
    assert!(v("nn", "// see crate::transformer\nuse crate::cpu::a;").is_empty());
    assert!(v("checkpoint", "use crate::optim::AdamW;").is_empty());
    assert_eq!(v("nn", "use crate::Nothing;").len(), 1);
}
