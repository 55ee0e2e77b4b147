//! What the workspace's tests and benches share (not published): PyTorch fixtures, tolerant
//! comparisons, label lists, running a built `mha`, readers for what the crates write
//! (`csv`, `image`: PNG pixels, `xml`: SVG and GraphML), the benches' helpers (`bench`) and,
//! with the `browser` feature (the visualisation crate's tests), a headless Chromium.

pub mod bench;
#[cfg(feature = "browser")]
pub mod browser;
pub mod csv;
pub mod image;
pub mod layering;
pub mod xml;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_mha::candle::{DType, Device, Tensor, Var};
use candle_mha::candle_nn::VarBuilder;
use candle_mha::{AttentionKernel, AttentionOptions, MultiheadAttention, MultiheadAttentionConfig};

/// One PyTorch fixture file: its tensors and its string metadata.
pub struct Fixture {
    pub name: String,
    pub tensors: HashMap<String, Tensor>,
    pub meta: HashMap<String, String>,
}

impl Fixture {
    pub fn load(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let (_, header) = safetensors::SafeTensors::read_metadata(&bytes)?;
        let meta = header.metadata().clone().unwrap_or_default();
        let tensors = candle_mha::candle::safetensors::load_buffer(&bytes, &Device::Cpu)?;
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        Ok(Self {
            name,
            tensors,
            meta,
        })
    }

    pub fn flag(&self, key: &str) -> Result<bool> {
        match self.meta.get(key).map(String::as_str) {
            Some("true") => Ok(true),
            Some("false") => Ok(false),
            other => bail!("{}: metadata {key} is {other:?}", self.name),
        }
    }

    pub fn usize(&self, key: &str) -> Result<usize> {
        let v = self
            .meta
            .get(key)
            .with_context(|| format!("{}: no {key}", self.name))?;
        Ok(v.parse()?)
    }

    pub fn str(&self, key: &str) -> &str {
        self.meta.get(key).map(String::as_str).unwrap_or("")
    }

    pub fn tensor(&self, key: &str) -> Result<&Tensor> {
        self.tensors
            .get(key)
            .with_context(|| format!("{}: no tensor {key}", self.name))
    }

    pub fn dtype(&self) -> Result<DType> {
        match self.str("dtype") {
            "f32" => Ok(DType::F32),
            "f64" => Ok(DType::F64),
            other => bail!("{}: unknown dtype {other}", self.name),
        }
    }

    /// The state_dict entries, `param.` stripped.
    pub fn params(&self) -> HashMap<String, Tensor> {
        self.tensors
            .iter()
            .filter_map(|(k, t)| k.strip_prefix("param.").map(|k| (k.to_string(), t.clone())))
            .collect()
    }
}

/// A seeded standard-normal f32 tensor on the CPU (`candle_mha::rng::normal`).
pub fn randn(shape: &[usize], seed: u64) -> Result<Tensor> {
    Ok(candle_mha::rng::normal(
        0.0,
        1.0,
        shape,
        DType::F32,
        &Device::Cpu,
        seed,
    )?)
}

/// The workspace's root (`MHA_WORKSPACE_DIR`, set for every crate by `.cargo/config.toml`).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("MHA_WORKSPACE_DIR"))
}

/// `tests/fixtures` at the workspace's root, or `$MHA_FIXTURES_DIR` when set (test binaries
/// carried to another machine, e.g. by `scripts/build-cuda.sh`, find the fixtures there).
pub fn fixtures_dir() -> PathBuf {
    match std::env::var_os("MHA_FIXTURES_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => repo_root().join("tests/fixtures"),
    }
}

/// Every `*.safetensors` in the fixtures directory, sorted by name.
pub fn fixture_paths() -> Vec<PathBuf> {
    let dir = fixtures_dir();
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/fixtures exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    paths.sort();
    paths
}

/// max|a - b| / max(max|b|, 1e-30), in f64.
pub fn rel_err(actual: &Tensor, expected: &Tensor) -> Result<f64> {
    if actual.dims() != expected.dims() {
        bail!("shape {:?}, expected {:?}", actual.dims(), expected.dims())
    }
    let a = actual
        .to_dtype(DType::F64)?
        .flatten_all()?
        .to_vec1::<f64>()?;
    let b = expected
        .to_dtype(DType::F64)?
        .flatten_all()?
        .to_vec1::<f64>()?;
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    let mut worst = 0f64;
    for (x, y) in a.iter().zip(&b) {
        if !x.is_finite() {
            return Ok(f64::INFINITY);
        }
        worst = worst.max((x - y).abs());
    }
    Ok(worst / scale)
}

/// max|a - b| over every element, in f64 (`a` and `b` of the same shape).
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    Ok((a.to_dtype(DType::F64)? - b.to_dtype(DType::F64)?)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f64>()?)
}

/// `|a - b| <= tol`.
pub fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

/// Fails unless the 2-D tensor `t` has the rows of `expected`, each entry within `tol`.
pub fn assert_matrix(t: &Tensor, expected: &[&[f64]], tol: f64) -> Result<()> {
    let got = t.to_dtype(DType::F64)?.to_vec2::<f64>()?;
    assert_eq!(got.len(), expected.len(), "rows of {got:?}");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert_eq!(g.len(), e.len(), "row {i} of {got:?}");
        for (j, (x, y)) in g.iter().zip(e.iter()).enumerate() {
            assert!(
                close(*x, *y, tol),
                "[{i}][{j}]: got {x}, expected {y}; {got:?}"
            );
        }
    }
    Ok(())
}

/// Owned labels (token, position or column names) from string literals.
pub fn labels(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Fails with the tensor's name and the error when `rel_err > tol`; returns the error.
pub fn assert_close(what: &str, actual: &Tensor, expected: &Tensor, tol: f64) -> Result<f64> {
    let err = rel_err(actual, expected).with_context(|| what.to_string())?;
    if err > tol {
        bail!("{what}: relative error {err:.3e} > {tol:.1e}")
    }
    Ok(err)
}

/// English text no one here wrote: the GPL v3 (verbatim copying is permitted).
pub fn gpl_text() -> String {
    fixtures_dir()
        .join("text/gpl-3.0.txt")
        .to_string_lossy()
        .into_owned()
}

/// `mha train` options of a tiny text model (a 300-id BPE, one block of width 16), for
/// [`words`].
pub const TINY_TEXT_MODEL: &str = "--vocab-size 300 --embed-dim 16 --num-heads 2 --num-layers 1";

/// The words of a list of flags and plain values (no quoting: see [`shell_words`]).
pub fn words(line: &'static str) -> Vec<&'static str> {
    line.split_whitespace().collect()
}

/// Runs the program `exe` (the CLI crate's tests pass `env!("CARGO_BIN_EXE_mha")`);
/// returns (success, stdout, stderr).
pub fn run_program<S: AsRef<std::ffi::OsStr>>(
    exe: &str,
    args: &[S],
) -> Result<(bool, String, String)> {
    let out = std::process::Command::new(exe).args(args).output()?;
    Ok((
        out.status.success(),
        String::from_utf8(out.stdout)?,
        String::from_utf8(out.stderr)?,
    ))
}

/// The words of a command line as a shell splits it: whitespace separates them, `"…"` and
/// `'…'` group them (the quotes are dropped; no escapes, variables or globs).
///
/// ```
/// let w = candle_mha_test_support::shell_words(r#"inspect --input "k3 v1" --title 'a b'"#);
/// assert_eq!(w.unwrap(), ["inspect", "--input", "k3 v1", "--title", "a b"]);
/// assert!(candle_mha_test_support::shell_words("eval 'open").is_err());
/// ```
pub fn shell_words(line: &str) -> Result<Vec<String>> {
    let (mut words, mut word, mut quote, mut any) = (Vec::new(), String::new(), None, false);
    for c in line.chars() {
        match (quote, c) {
            (None, '"' | '\'') => (quote, any) = (Some(c), true),
            (Some(q), c) if c == q => quote = None,
            (None, c) if c.is_whitespace() => {
                if any {
                    words.push(std::mem::take(&mut word));
                }
                any = false;
            }
            (_, c) => (word, any) = (word + &c.to_string(), true),
        }
    }
    if quote.is_some() {
        bail!("unbalanced quotes in {line:?}")
    }
    if any {
        words.push(word);
    }
    Ok(words)
}

/// Arguments written as a command line: `template`'s [`shell_words`], each `{}` word replaced
/// by the next of `args`, whole (a path with spaces stays one argument).
///
/// ```
/// let a = candle_mha_test_support::argv("eval --checkpoint {} --input 'T1 T2'", &["/a b/run"]);
/// assert_eq!(a, ["eval", "--checkpoint", "/a b/run", "--input", "T1 T2"]);
/// ```
pub fn argv(template: &str, args: &[&str]) -> Vec<String> {
    let mut args = args.iter();
    let out: Vec<String> = shell_words(template)
        .expect("argv: a template with balanced quotes")
        .into_iter()
        .map(|w| match w.as_str() {
            "{}" => args
                .next()
                .expect("argv: more {} than arguments")
                .to_string(),
            _ => w,
        })
        .collect();
    assert!(args.next().is_none(), "argv: more arguments than {{}}");
    out
}

/// Trains the small analysis model of the CLI tests (2 layers × 2 heads, E = 8, 20 steps on
/// the symbols `T1`…`T5`) with `mha train` (the program `mha`) into `dir/run` and returns
/// that checkpoint folder.
pub fn train_tiny_run(mha: &str, dir: &Path) -> Result<PathBuf> {
    let data = dir.join("ev.txt");
    std::fs::write(
        &data,
        "T1 T2 T3 T4\nT1 T3 T5 T2\nT2 T2 T3 T4 T5\n".repeat(10),
    )?;
    let run = dir.join("run");
    let (ok, _, stderr) = run_program(
        mha,
        &[
            "train",
            "--tokens",
            data.to_str().context("temp path")?,
            "--out",
            run.to_str().context("temp path")?,
            "--steps",
            "20",
            "--embed-dim",
            "8",
            "--num-heads",
            "2",
            "--num-layers",
            "2",
            "--quiet",
        ],
    )?;
    if !ok {
        bail!("mha train failed: {stderr}")
    }
    Ok(run)
}

/// The first CUDA device with cuBLAS in full f32 precision (no TF32), or `None` after
/// printing why there is none (a build without `cuda`, or no GPU).
pub fn gpu() -> Option<Device> {
    // Whether candle was built with CUDA, by whichever crate under test asked for it.
    if !candle_mha::candle::utils::cuda_is_available() {
        println!("skipped: built without the `cuda` feature (scripts/build-cuda.sh builds it)");
        return None;
    }
    match Device::new_cuda(0) {
        Ok(d) => {
            // Full f32 precision in cuBLAS (no TF32) for these comparisons.
            candle_mha::candle::cuda::set_gemm_reduced_precision_f32(false);
            Some(d)
        }
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            None
        }
    }
}

/// Output, weights and every gradient of one fixture on `dev` in `dtype`, as f64 CPU tensors
/// by name (`output`, `weights`, `grad.<parameter>`, `grad.query`). With `kernel`, the call
/// asks for no weights and runs that kernel (the output and gradients do not depend on the
/// weights being asked for).
pub fn run_fixture(
    f: &Fixture,
    dtype: DType,
    dev: &Device,
    kernel: Option<AttentionKernel>,
) -> Result<HashMap<String, Tensor>> {
    let cfg = MultiheadAttentionConfig::new(f.usize("embed_dim")?, f.usize("num_heads")?)
        .with_kdim(f.usize("kdim")?)
        .with_vdim(f.usize("vdim")?)
        .with_bias(f.flag("bias")?)
        .with_add_bias_kv(f.flag("add_bias_kv")?)
        .with_add_zero_attn(f.flag("add_zero_attn")?)
        .with_batch_first(f.flag("batch_first")?);
    let vars: HashMap<String, Var> = f
        .params()
        .into_iter()
        .map(|(k, t)| Ok((k, Var::from_tensor(&t.to_dtype(dtype)?.to_device(dev)?)?)))
        .collect::<Result<_>>()?;
    let tensors = vars
        .iter()
        .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
        .collect();
    let vb = VarBuilder::from_tensors(tensors, dtype, dev);
    let prefix = f.str("prefix");
    let mha = MultiheadAttention::new(cfg, if prefix.is_empty() { vb } else { vb.pp(prefix) })?;
    let load = |name: &str| -> Result<Var> {
        Ok(Var::from_tensor(
            &f.tensor(name)?.to_dtype(dtype)?.to_device(dev)?,
        )?)
    };
    let q = load("query")?;
    let (k, v) = match (f.flag("self_attn")?, f.flag("key_is_value")?) {
        (true, _) => (q.clone(), q.clone()),
        (false, true) => {
            let k = load("key")?;
            (k.clone(), k)
        }
        _ => (load("key")?, load("value")?),
    };
    let mut opts = AttentionOptions::new()
        .with_need_weights(f.flag("need_weights")?)
        .with_average_attn_weights(f.flag("average_attn_weights")?)
        .with_is_causal(f.flag("is_causal")?);
    if let Some(k) = kernel {
        opts = opts.with_need_weights(false).with_kernel(k);
    }
    let mask = |name: &str| -> Result<Option<Tensor>> {
        f.tensors
            .get(name)
            .map(|m| {
                Ok(if m.dtype() == DType::U8 {
                    m.to_device(dev)?
                } else {
                    m.to_dtype(dtype)?.to_device(dev)?
                })
            })
            .transpose()
    };
    if let Some(m) = mask("key_padding_mask")? {
        opts = opts.with_key_padding_mask(m);
    }
    if let Some(m) = mask("attn_mask")? {
        opts = opts.with_attn_mask(m);
    }
    let out = mha.forward(&q, &k, &v, &opts)?;
    let r = f.tensor("R")?.to_dtype(dtype)?.to_device(dev)?;
    // f32/f64 seed the backward pass with R itself (the seed op's CUDA forward included).
    let grads = match dtype {
        DType::F32 | DType::F64 => candle_mha::autograd::backward_with(&out.output, &r)?,
        _ => (out.output.to_dtype(DType::F32)? * r.to_dtype(DType::F32)?)?
            .sum_all()?
            .backward()?,
    };
    let cpu =
        |t: &Tensor| -> Result<Tensor> { Ok(t.to_dtype(DType::F64)?.to_device(&Device::Cpu)?) };
    let mut res = HashMap::from([("output".to_string(), cpu(&out.output)?)]);
    if let Some(w) = &out.weights {
        res.insert("weights".into(), cpu(w)?);
    }
    // The inputs that are separate variables (self-attention: one; key is value: two).
    let mut inputs = vec![("query".to_string(), q.clone())];
    if k.as_tensor().id() != q.as_tensor().id() {
        inputs.push(("key".to_string(), k.clone()));
    }
    if v.as_tensor().id() != k.as_tensor().id() {
        inputs.push(("value".to_string(), v.clone()));
    }
    for (name, var) in vars.iter().chain(inputs.iter().map(|(n, v)| (n, v))) {
        if let Some(g) = grads.get(var.as_tensor()) {
            res.insert(format!("grad.{name}"), cpu(g)?);
        }
    }
    Ok(res)
}
