//! The trainer's floors (listed in `src/lib.rs`): no module imports from a floor above its
//! own (the checker: `candle_mha_test_support::layering`).

use std::path::Path;

use candle_mha_test_support::layering::crate_violations;

/// Each top-level module's floor, from the bottom. A new module must be placed here.
const FLOORS: [(&str, u8); 9] = [
    ("error", 0),
    ("limits", 0),
    ("checksum", 0),
    ("run_dir", 0),
    ("models", 1),
    ("data", 2),
    ("distributed", 3),
    ("run", 4),
    ("formats", 5),
];

#[test]
fn no_module_imports_from_a_higher_floor() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (found, files) = crate_violations(&src, &FLOORS);
    assert!(files > 60, "only {files} files found under src/");
    assert!(
        found.is_empty(),
        "imports against the floors:\n{}",
        found.join("\n")
    );
}
