//! The `mha` binary: `info` and `convert` on PyTorch-made checkpoints.

mod common;

use std::path::PathBuf;

use anyhow::Result;
use candle_mha::candle::DType;
use candle_mha::checkpoint::StateDict;
use common::{assert_close, mha, run_mha};

fn ckpt(name: &str) -> PathBuf {
    common::fixtures_dir().join("checkpoints").join(name)
}

#[test]
fn info_lists_tensors_and_attention_modules() -> Result<()> {
    let (ok, out, err) = mha(&["info", ckpt("transformer.safetensors").to_str().unwrap()])?;
    assert!(ok, "{err}");
    assert!(out.contains("metadata format = pt"), "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("encoder.layers.0.self_attn.in_proj_weight "));
    let cols: Vec<&str> = line.unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        cols,
        [
            "encoder.layers.0.self_attn.in_proj_weight",
            "f32",
            "[24,",
            "8]"
        ],
        "{out}"
    );
    assert!(out.contains("attention modules (3):"), "{out}");
    for p in [
        "decoder.layers.0.multihead_attn: embed_dim=8",
        "decoder.layers.0.self_attn:",
        "encoder.layers.0.self_attn:",
    ] {
        assert!(out.contains(p), "{p} not in {out}");
    }
    let (ok, out, _) = run_mha!(
        "info {} --prefix decoder",
        ckpt("cross_kv.safetensors").to_str().unwrap()
    )?;
    assert!(
        ok && out.contains("cross_attn.k_proj_weight") && !out.contains("head.weight"),
        "{out}"
    );
    assert!(
        out.contains("decoder.cross_attn: embed_dim=8 kdim=6 vdim=4 bias=true add_bias_kv=true"),
        "{out}"
    );
    Ok(())
}

#[test]
fn convert_pickle_to_safetensors_validated() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let out_path = dir.path().join("enc.safetensors");
    let (ok, out, err) = mha(&[
        "convert",
        ckpt("encoder_bf_nested_state_dict.pt").to_str().unwrap(),
        out_path.to_str().unwrap(),
    ])?;
    assert!(ok, "{err}");
    assert!(
        out.contains("24 tensors, 4448 parameters, verified"),
        "{out}"
    );
    let (converted, original) = (
        StateDict::load(&out_path)?,
        StateDict::load(ckpt("encoder_bf.safetensors"))?,
    );
    assert_eq!(converted.len(), original.len());
    for (name, t) in original.tensors() {
        assert_close(name, converted.get(name).unwrap(), t, 0.0)?;
    }
    assert_eq!(
        converted.metadata().get("format").map(String::as_str),
        Some("pt")
    );

    // One layer, as a bare nn.MultiheadAttention state_dict, in f16.
    let one = dir.path().join("attn.safetensors");
    let seq = ckpt("encoder_seq.pt");
    let args = [
        "convert",
        seq.to_str().unwrap(),
        one.to_str().unwrap(),
        "--prefix",
        "layers.1.self_attn",
        "--dtype",
        "f16",
    ];
    let (ok, out, err) = mha(&args)?;
    assert!(
        ok && out.contains("attention module (root): embed_dim=16"),
        "{out}{err}"
    );
    let sd = StateDict::load(&one)?;
    let names: Vec<_> = sd
        .tensors()
        .iter()
        .map(|(n, t)| (n.as_str(), t.dtype()))
        .collect();
    assert_eq!(
        names,
        [
            ("in_proj_bias", DType::F16),
            ("in_proj_weight", DType::F16),
            ("out_proj.bias", DType::F16),
            ("out_proj.weight", DType::F16)
        ]
    );
    Ok(())
}

/// An error is one line even when the user runs with `RUST_BACKTRACE=1` (candle would attach
/// and print a backtrace); `RUST_LIB_BACKTRACE=1` asks for it.
#[test]
fn errors_are_one_line_under_rust_backtrace() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let run = |lib: Option<&str>| -> Result<String> {
        let mut cmd = std::process::Command::new(common::mha_exe()?);
        cmd.args(["convert", ckpt("no_tensors.pt").to_str().unwrap()])
            .arg(dir.path().join("x.safetensors"))
            .env("RUST_BACKTRACE", "1")
            .env_remove("RUST_LIB_BACKTRACE");
        if let Some(v) = lib {
            cmd.env("RUST_LIB_BACKTRACE", v);
        }
        let out = cmd.output()?;
        assert!(!out.status.success());
        Ok(String::from_utf8(out.stderr)?)
    };
    let err = run(None)?;
    assert!(
        err.contains("holds no tensors") && err.trim_end().lines().count() == 1,
        "{err}"
    );
    let err = run(Some("1"))?;
    assert!(
        err.contains("holds no tensors") && err.lines().count() > 1,
        "{err}"
    );
    Ok(())
}

#[test]
fn bad_input_is_a_clear_error() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let out_path = dir.path().join("x.safetensors");
    let (ok, _, err) = mha(&[
        "convert",
        ckpt("no_tensors.pt").to_str().unwrap(),
        out_path.to_str().unwrap(),
    ])?;
    assert!(
        !ok && err.starts_with("error: ") && err.contains("holds no tensors"),
        "{err}"
    );
    assert!(!out_path.exists());
    let (ok, _, err) = run_mha!(
        "convert {} {} --prefix nope",
        ckpt("encoder_bf.pt").to_str().unwrap(),
        out_path.to_str().unwrap()
    )?;
    assert!(
        !ok && err.contains("no tensor under prefix \"nope\""),
        "{err}"
    );
    let (ok, _, err) = run_mha!(
        "convert {} {} --dtype f8",
        ckpt("encoder_bf.pt").to_str().unwrap(),
        out_path.to_str().unwrap()
    )?;
    assert!(!ok && err.contains("unknown dtype \"f8\""), "{err}");
    let (ok, _, err) = mha(&["info", dir.path().to_str().unwrap()])?;
    assert!(!ok && err.contains("is a directory"), "{err}");
    // Tensors the reader cannot represent are listed by info and stop a convert (the file
    // would lack them), unless a prefix leaves them out.
    let views = ckpt("views_dtypes.pt");
    let (ok, out, _) = mha(&["info", views.to_str().unwrap()])?;
    assert!(
        ok && out.contains("not readable (2):\n  c64: its dtype complex64"),
        "{out}"
    );
    let (ok, _, err) = mha(&[
        "convert",
        views.to_str().unwrap(),
        out_path.to_str().unwrap(),
    ])?;
    assert!(
        !ok && err.contains("2 tensor(s) of") && err.contains("i8: its dtype int8"),
        "{err}"
    );
    assert!(!out_path.exists());
    Ok(())
}

#[test]
fn info_lists_transformer_modules() -> Result<()> {
    let path = common::fixtures_dir().join("checkpoints/encoder_nf_gelu.safetensors");
    let (ok, out, err) = common::mha(&["info", path.to_str().unwrap()])?;
    assert!(ok, "{err}");
    assert!(out.contains("Transformer modules (3):"), "{out}");
    assert!(
        out.contains("(root): TransformerEncoder num_layers=2 final_norm=true d_model=8 dim_feedforward=12 bias=false"),
        "{out}"
    );
    assert!(
        out.contains("  layers.1: TransformerEncoderLayer d_model=8"),
        "{out}"
    );
    Ok(())
}
