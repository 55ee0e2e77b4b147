//! The memory part of the bench: a child process runs one `need_weights=false` forward and
//! reports its peak RSS against the bytes it must hold.

use std::process::{Command, Stdio};
use std::time::Instant;

use candle::Result;
use candle_mha::{AttentionKernel, AttentionOptions};

use super::support::print_table;
use super::{setup, Shape4};

/// `VmRSS` and `VmHWM` of this process in bytes.
fn rss() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The child process of the memory measurement: one forward, then a JSON line.
pub fn memory_child(l: usize, kernel: &str) -> Result<()> {
    let (n, e, h) = (1, 512, 8);
    let (base, _) = rss();
    let (mha, x, _) = setup(Shape4::new(n, l, e, h, false), false)?;
    let kernel = match kernel {
        "reference" => AttentionKernel::Reference,
        _ => AttentionKernel::Fused,
    };
    let opts = AttentionOptions::new()
        .with_need_weights(false)
        .with_kernel(kernel);
    let t = Instant::now();
    let out = mha.forward(&x, &x, &x, &opts)?.output;
    let secs = t.elapsed().as_secs_f64();
    let (_, peak) = rss();
    drop(out);
    let f = 4u64;
    let tokens = (n * l) as u64;
    let e = e as u64;
    let params = mha.num_parameters() as u64 * f;
    // input + output + parameters + saved: packed qkv, attention context, row lse.
    let accounted =
        tokens * e * f * 2 + params + tokens * 3 * e * f + tokens * e * f + (n * h * l) as u64 * f;
    println!(
        "{}",
        serde_json::json!({"l": l, "base": base, "peak": peak, "accounted": accounted, "secs": secs})
    );
    Ok(())
}

fn memory_rows() -> Vec<Vec<String>> {
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(_) => return Vec::new(),
    };
    let mut rows = Vec::new();
    for (l, kernel) in [(8192, "fused"), (4096, "fused"), (4096, "reference")] {
        let out = Command::new(&exe)
            .env("MHA_BENCH_MEMORY_CHILD", format!("{l},{kernel}"))
            .stderr(Stdio::inherit())
            .output();
        let rec: Option<serde_json::Value> = out.ok().and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .find_map(|l| serde_json::from_str(l).ok())
        });
        let Some(rec) = rec else {
            rows.push(vec![
                format!("{kernel} L={l}"),
                "failed".into(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            ]);
            continue;
        };
        let mb = |k: &str| rec[k].as_f64().unwrap_or(0.0) / 1048576.0;
        let (base, peak, acc) = (mb("base"), mb("peak"), mb("accounted"));
        rows.push(vec![
            format!("{kernel}, N=1 L={l} E=512 H=8"),
            format!("{:.0}", rec["secs"].as_f64().unwrap_or(0.0) * 1e3),
            format!("{peak:.1}"),
            format!("{base:.1}"),
            format!("{acc:.1}"),
            format!("{:.2} ({:.2})", peak / acc, (peak - base) / acc),
        ]);
    }
    rows
}

pub fn print_memory() {
    println!("\nmemory of one need_weights=false forward (child process, glibc defaults, MiB):");
    let header: Vec<String> = [
        "run",
        "ms",
        "peak RSS",
        "RSS before",
        "accounted",
        "peak/accounted (growth/accounted)",
    ]
    .map(String::from)
    .to_vec();
    print_table(&header, &memory_rows());
    println!("accounted = input + output + parameters + packed qkv + context + row lse (f32).");
}
