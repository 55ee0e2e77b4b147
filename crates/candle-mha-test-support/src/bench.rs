//! Helpers shared by the CPU benches: finding torch, describing the machine, Markdown tables.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Both sides of a bench under the same allocator settings: in the mode that keeps freed
/// memory (`runtime::retain_freed_memory`, as the `mha` CLI runs), PyTorch's process gets the
/// equivalent `GLIBC_TUNABLES` through [`Allocator::apply`].
pub struct Allocator {
    /// The setting took effect here (so it is given to the child too).
    pub retain: bool,
}

impl Allocator {
    /// The setting given: `retain` applies [`candle_mha::runtime::retain_freed_memory`] here
    /// (and hands the equivalent to children); `false` leaves glibc's defaults.
    pub fn new(retain: bool) -> Self {
        Self {
            retain: retain && candle_mha::runtime::retain_freed_memory(),
        }
    }

    /// The header line: `allocator (both sides): …`.
    pub fn describe(&self) -> String {
        let setting = match self.retain {
            true => format!(
                "retain freed memory (GLIBC_TUNABLES={})",
                candle_mha::runtime::GLIBC_TUNABLES
            ),
            false => "glibc defaults".to_string(),
        };
        // The variables `recommended_env` names, as this process has them.
        let env: Vec<String> = candle_mha::runtime::recommended_env()
            .into_iter()
            .map(|(name, _)| match std::env::var(name) {
                Ok(v) => format!("{name}={v}"),
                Err(_) => format!("{name} unset"),
            })
            .collect();
        format!(
            "allocator (both sides): {setting} | ours: {}",
            env.join(" ")
        )
    }

    /// Gives a child process (PyTorch's side) the same setting.
    pub fn apply(&self, cmd: &mut Command) {
        if self.retain {
            cmd.env("GLIBC_TUNABLES", candle_mha::runtime::GLIBC_TUNABLES);
        }
    }
}

pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len().is_multiple_of(2) {
        (v[m - 1] + v[m]) / 2.0
    } else {
        v[m]
    }
}

/// The median and the fastest of `reps` timed calls of `f`, in seconds, after a warm-up of at
/// least `warmup` calls that goes on until `warmup_ms` milliseconds have passed.
pub fn time_calls<E>(
    reps: usize,
    warmup: usize,
    warmup_ms: f64,
    mut f: impl FnMut() -> Result<(), E>,
) -> Result<(f64, f64), E> {
    let start = Instant::now();
    let mut calls = 0;
    while calls < warmup || start.elapsed().as_secs_f64() * 1e3 < warmup_ms {
        f()?;
        calls += 1;
    }
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64());
    }
    let fastest = times.iter().copied().fold(f64::INFINITY, f64::min);
    Ok((median(&times), fastest))
}

/// A Python that imports torch, and torch's version: `MHA_BENCH_PYTHON` when set (e.g. a
/// virtual environment's `bin/python`), else `python3`, then `python` (from `PATH`).
pub fn find_torch() -> Option<(String, String)> {
    let candidates: Vec<String> = match std::env::var("MHA_BENCH_PYTHON") {
        Ok(py) if !py.trim().is_empty() => vec![py],
        _ => vec!["python3".into(), "python".into()],
    };
    candidates.into_iter().find_map(|py| {
        let out = Command::new(&py)
            .args(["-c", "import torch; print(torch.__version__)"])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && !version.is_empty()).then_some((py, version))
    })
}
pub fn cpu_model() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{model} ({})", vector_unit())
}

/// The vector instructions our CPU kernels take here (the `force-avx2` feature keeps them on
/// AVX2); the `gemm` crate's projections choose theirs the same way.
pub fn vector_unit() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            return "AVX-512";
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            return "AVX2";
        }
    }
    "no AVX2"
}
/// UTC now as `YYYY-MM-DD HH:MM UTC` (civil-from-days, no date crate needed).
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rem / 3_600,
        (rem % 3_600) / 60
    )
}
/// A Markdown table: the first column left-aligned, the others right-aligned.
pub fn print_table(header: &[String], rows: &[Vec<String>]) {
    let width = |i: usize| {
        rows.iter()
            .map(|r| r[i].chars().count())
            .chain([header[i].chars().count()])
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..header.len()).map(width).collect();
    let line = |cells: &[String]| {
        let cells: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let pad = " ".repeat(widths[i] - c.chars().count());
                if i == 0 {
                    format!("{c}{pad}")
                } else {
                    format!("{pad}{c}")
                }
            })
            .collect();
        format!("| {} |", cells.join(" | "))
    };
    println!("{}", line(header));
    let rule: Vec<String> = widths
        .iter()
        .enumerate()
        .map(|(i, &w)| {
            if i == 0 {
                "-".repeat(w + 2)
            } else {
                format!("{}:", "-".repeat(w + 1))
            }
        })
        .collect();
    println!("|{}|", rule.join("|"));
    for r in rows {
        println!("{}", line(r));
    }
}

/// A non-negative integer from the environment; `None` (with a warning) when unparsable.
pub fn env_usize(name: &str) -> Option<usize> {
    let raw = std::env::var(name).ok()?;
    match raw.trim().parse::<usize>() {
        Ok(v) => Some(v),
        Err(_) => {
            eprintln!("warning: ignoring {name}={raw:?} (not a non-negative integer)");
            None
        }
    }
}

/// PyTorch's side of a bench as a long-lived child: `python SCRIPT --serve --threads T`, one
/// JSON request per stdin line, one JSON line back, so that a bench can alternate between
/// the two sides in rounds (this shared machine's load drifts within minutes).
pub struct TorchServer {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl TorchServer {
    /// Starts `scripts/<script>` and waits for its `ready` line; `None` when it does not come.
    pub fn start(
        python: &str,
        script: &str,
        threads: usize,
        allocator: &Allocator,
    ) -> Option<Self> {
        let path = crate::repo_root().join("scripts").join(script);
        let mut cmd = Command::new(python);
        cmd.arg(path)
            .args(["--serve", "--threads", &threads.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        allocator.apply(&mut cmd);
        let mut child = cmd.spawn().ok()?;
        let input = child.stdin.take()?;
        let mut output = BufReader::new(child.stdout.take()?);
        let mut line = String::new();
        output.read_line(&mut line).ok()?;
        line.contains("ready").then_some(Self {
            child,
            input,
            output,
        })
    }

    /// One request, its reply; `None` when the child does not answer with JSON.
    pub fn request(&mut self, req: &serde_json::Value) -> Option<serde_json::Value> {
        writeln!(self.input, "{req}").ok()?;
        self.input.flush().ok()?;
        let mut line = String::new();
        self.output.read_line(&mut line).ok()?;
        serde_json::from_str(&line).ok()
    }
}

impl Drop for TorchServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `RAYON_NUM_THREADS` a bench should pin when it is unset (candle's count, as the `mha`
/// binary pins it: otherwise candle parses `/proc/cpuinfo` on every matmul), and a line
/// saying where the count comes from. The bench sets it itself, first, before any thread
/// starts: this crate changes no environment.
pub fn thread_setting() -> (Option<usize>, String) {
    match std::env::var("RAYON_NUM_THREADS") {
        Ok(v) => (None, format!("RAYON_NUM_THREADS={v}")),
        Err(_) => {
            let n = candle_mha::candle::utils::get_num_threads();
            (
                Some(n),
                format!("RAYON_NUM_THREADS unset, pinned to {n} as mha does"),
            )
        }
    }
}

/// The table's first line: CPU model, cores, threads (and where the count came from), SIMD,
/// MKL, time.
pub fn print_machine(threads_from: &str) {
    use candle_mha::candle::utils;
    let threads = utils::get_num_threads();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "machine: {} | {cores} cores | {threads} threads ({threads_from}) | avx2 {} | mkl {} | {}",
        cpu_model(),
        utils::with_avx(),
        utils::has_mkl(),
        utc_now()
    );
}

/// The environment variable that tells a child process which mode it runs.
pub const CHILD_MODE: &str = "MHA_BENCH_CHILD_MODE";

/// The mode that keeps freed memory and runs with the CLI's environment.
pub const CLI_MODE: &str = "retained";

/// Runs a bench once per mode, each in a child process of its own (the same executable and
/// arguments), since allocator settings (`mallopt`) are process-wide and cannot be undone.
///
/// In a child: returns `Some(mode)`, the mode it should run. In the parent: runs the modes
/// named in `selector` (comma-separated; unset or empty: all of `modes`, in order) one after
/// the other with inherited output, then returns `None`. `extra` modes run only when named.
/// A mode that fails or is unknown is reported on stderr; the others still run.
///
/// The mode [`CLI_MODE`] runs as the `mha` CLI does: its child also gets
/// [`candle_mha::runtime::recommended_env`] (each pair the environment does not set).
pub fn mode_children(selector: &str, modes: &[&str], extra: &[&str]) -> Option<String> {
    if let Ok(mode) = std::env::var(CHILD_MODE) {
        return Some(mode);
    }
    let wanted: Vec<String> = match std::env::var(selector) {
        Ok(s) if !s.trim().is_empty() => s
            .split(',')
            .map(|m| m.trim().to_lowercase())
            .filter(|m| !m.is_empty())
            .collect(),
        _ => modes.iter().map(|m| m.to_string()).collect(),
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("cannot find this bench's executable: {e}");
            return None;
        }
    };
    for mode in wanted {
        if !modes.contains(&mode.as_str()) && !extra.contains(&mode.as_str()) {
            eprintln!("warning: unknown mode {mode:?} in {selector} (known: {modes:?}, {extra:?})");
            continue;
        }
        println!("\n## mode: {mode}\n");
        let mut cmd = Command::new(&exe);
        cmd.args(std::env::args_os().skip(1)).env(CHILD_MODE, &mode);
        if mode == CLI_MODE {
            for (name, value) in candle_mha::runtime::recommended_env() {
                if std::env::var_os(name).is_none() {
                    cmd.env(name, value);
                }
            }
        }
        let status = cmd.status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => eprintln!("mode {mode}: the child process failed ({s})"),
            Err(e) => eprintln!("mode {mode}: cannot start the child process: {e}"),
        }
    }
    None
}

/// Minor page faults of this process so far (`/proc/self/stat`, field 10); 0 where unreadable.
pub fn minor_faults() -> u64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // The command name (field 2) may hold spaces: count from after its ')'.
            let rest = &s[s.rfind(')')? + 1..];
            rest.split_whitespace().nth(7)?.parse().ok()
        })
        .unwrap_or(0)
}
