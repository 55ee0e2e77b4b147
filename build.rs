//! With the `cuda` feature: compiles the fused attention kernels
//! (`src/attention/fused/cuda/flash.cu`) into a fat binary the crate embeds, with the same
//! toolkit candle's kernels are built with (`nvcc` from `NVCC`, `CUDA_ROOT`, `CUDA_PATH` or
//! `PATH`). The binary holds machine code for `CUDA_COMPUTE_CAP` (90, the H100/H200, when
//! unset) and compute_80 PTX, which the driver compiles for any other GPU of compute
//! capability 8.0 or more.

use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "src/attention/fused/cuda/flash.cu";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={SOURCE}");
    for var in ["NVCC", "CUDA_ROOT", "CUDA_PATH", "CUDA_COMPUTE_CAP"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("flash_attention.fatbin");
    let nvcc = std::env::var("NVCC").ok().unwrap_or_else(|| {
        ["CUDA_ROOT", "CUDA_PATH"]
            .iter()
            .filter_map(|v| std::env::var(v).ok())
            .map(|root| format!("{root}/bin/nvcc"))
            .find(|p| std::path::Path::new(p).exists())
            .unwrap_or_else(|| "nvcc".into())
    });
    let cap: u32 = match std::env::var("CUDA_COMPUTE_CAP") {
        Ok(v) => v.trim().replace('.', "").parse().unwrap_or_else(|_| {
            panic!("CUDA_COMPUTE_CAP={v:?} is not a compute capability such as 90")
        }),
        Err(_) => 90,
    };
    let mut cmd = Command::new(&nvcc);
    cmd.args(["-fatbin", "-O3", "-std=c++17", "-lineinfo"])
        .args(["-gencode", "arch=compute_80,code=compute_80"]);
    if cap >= 80 {
        cmd.args(["-gencode", &format!("arch=compute_{cap},code=sm_{cap}")]);
    }
    cmd.arg("-o").arg(&out).arg(SOURCE);
    let status = cmd.status().unwrap_or_else(|e| {
        panic!("cannot run {nvcc} ({e}): the cuda feature needs the CUDA toolkit's nvcc (NVCC, CUDA_ROOT, CUDA_PATH or PATH; scripts/prepare-cuda-toolkit.sh makes one without a system toolkit)")
    });
    assert!(status.success(), "{nvcc} failed on {SOURCE} ({status})");
}
