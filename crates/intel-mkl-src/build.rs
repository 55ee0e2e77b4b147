//! Finds `libmkl_core.a` and `libiomp5.so` under `$MKLROOT` (the tree
//! `scripts/prepare-mkl.sh` unpacks) and links MKL statically, LP64 with Intel OpenMP: what
//! candle-core's `mkl` feature (`mkl-static-lp64-iomp`) links.

use std::path::{Path, PathBuf};

/// The directory under `root` (searched depth first) holding a file called `name`.
fn dir_of(root: &Path, name: &str) -> Option<PathBuf> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push(path),
                Ok(_) if entry.file_name() == name => return Some(dir),
                _ => {}
            }
        }
    }
    None
}

fn main() {
    println!("cargo:rerun-if-env-changed=MKLROOT");
    let Some(root) = std::env::var_os("MKLROOT") else {
        panic!("the `mkl` feature needs MKLROOT: run `eval \"$(scripts/prepare-mkl.sh)\"` first")
    };
    let root = PathBuf::from(root);
    let find = |name: &str| {
        dir_of(&root, name).unwrap_or_else(|| {
            panic!(
                "{name} not found under MKLROOT={}: run `eval \"$(scripts/prepare-mkl.sh)\"`",
                root.display()
            )
        })
    };
    let (mkl, iomp) = (find("libmkl_core.a"), find("libiomp5.so"));
    println!("cargo:rustc-link-search=native={}", mkl.display());
    for lib in ["mkl_intel_lp64", "mkl_intel_thread", "mkl_core"] {
        println!("cargo:rustc-link-lib=static={lib}");
    }
    println!("cargo:rustc-link-search=native={}", iomp.display());
    println!("cargo:rustc-link-lib=dylib=iomp5");
}
