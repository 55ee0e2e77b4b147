//! Word vectors: the GloVe reader, cosine and dot-product attention, the identity-projection
//! equivalence with `MultiheadAttention`, and the shipped embedding file.

use candle_mha_test_support as common;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Result;
use candle_mha::candle::{DType, Device, Tensor};
use candle_mha::{AttentionOptions, MultiheadAttention, MultiheadAttentionConfig};
use candle_mha_viz::word_vectors::{
    cosine_attention, cosine_similarity_matrix, load_glove, read_glove, self_attention,
};
use candle_nn::VarBuilder;
use common::max_abs_diff;

/// The shipped file and its documented size (weights/README.md).
const SHIPPED: &str = "weights/wordllama_l2_1500w_64d.txt";
const SHIPPED_WORDS: usize = 1508;
const SHIPPED_DIM: usize = 64;

fn write_file(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    std::fs::File::create(&path)?.write_all(text.as_bytes())?;
    Ok(path)
}

fn load_err(text: &str) -> Result<String> {
    let dir = tempfile::tempdir()?;
    let path = write_file(dir.path(), "v.txt", text)?;
    Ok(load_glove(&path).unwrap_err().to_string())
}

#[test]
fn loads_a_good_file() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = write_file(
        dir.path(),
        "good.txt",
        "the 0.1 0.2 -0.3\ncat 1 2 3\r\n\nsat -1.5e-1 0 4\n",
    )?;
    let wv = load_glove(&path)?;
    assert_eq!(wv.words(), ["the", "cat", "sat"]);
    assert_eq!((wv.len(), wv.dim()), (3, 3));
    assert_eq!(wv.vectors().dims(), &[3, 3]);
    assert_eq!(wv.vectors().dtype(), DType::F32);
    assert_eq!(wv.index("cat"), Some(1));
    assert_eq!(wv.index("dog"), None);
    assert_eq!(wv.get("sat").unwrap().to_vec1::<f32>()?, [-0.15, 0., 4.]);
    assert!(wv.get("Cat").is_none());
    let x = wv.stack(&["sat", "the", "sat"])?;
    assert_eq!(x.dims(), &[3, 3]);
    assert_eq!(x.get(2)?.to_vec1::<f32>()?, [-0.15, 0., 4.]);
    let e = wv.stack(&["the", "dog", "mat"]).unwrap_err().to_string();
    assert!(e.contains("\"dog\"") && e.contains("\"mat\""), "{e}");
    assert!(wv.stack(&[]).is_err());
    Ok(())
}

#[test]
fn accepts_a_word2vec_header() -> Result<()> {
    let text = "2 3\nthe 0.1 0.2 0.3\ncat 1 2 3\n";
    let wv = read_glove(text.as_bytes(), "mem")?;
    assert_eq!((wv.len(), wv.dim()), (2, 3));
    let e = read_glove("3 3\nthe 0.1 0.2 0.3\n".as_bytes(), "mem")
        .unwrap_err()
        .to_string();
    assert!(e.contains("mem:1") && e.contains("3 words"), "{e}");
    let e = read_glove("2 4\nthe 0.1 0.2 0.3\n".as_bytes(), "mem")
        .unwrap_err()
        .to_string();
    assert!(e.contains("mem:2") && e.contains("header on line 1"), "{e}");
    Ok(())
}

#[test]
fn ragged_row_names_its_line() -> Result<()> {
    let e = load_err("the 0.1 0.2 0.3\ncat 1 2 3\nsat 1 2\n")?;
    assert!(
        e.contains(":3:") && e.contains("\"sat\" has 2 values; expected 3"),
        "{e}"
    );
    let e = load_err("the 0.1 0.2 0.3\nlonely\n")?;
    assert!(e.contains(":2:") && e.contains("0 values"), "{e}");
    Ok(())
}

#[test]
fn non_numeric_value_names_its_line() -> Result<()> {
    let e = load_err("the 0.1 0.2 0.3\n\ncat 1 two 3\n")?;
    assert!(
        e.contains(":3:") && e.contains("value 2") && e.contains("\"two\""),
        "{e}"
    );
    let e = load_err("the 0.1 nan 0.3\n")?;
    assert!(e.contains(":1:") && e.contains("finite"), "{e}");
    Ok(())
}

#[test]
fn empty_file_is_an_error() -> Result<()> {
    for text in ["", "\n\n  \n"] {
        let e = load_err(text)?;
        assert!(e.contains("no word vectors"), "{e}");
    }
    let e = load_glove(Path::new("/no/such/glove.txt"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("/no/such/glove.txt"), "{e}");
    Ok(())
}

#[test]
fn duplicate_word_names_both_lines() -> Result<()> {
    let e = load_err("the 0 1\ncat 1 0\nthe 2 2\n")?;
    assert!(
        e.contains(":3:") && e.contains("\"the\"") && e.contains("line 1"),
        "{e}"
    );
    Ok(())
}

/// One head, no bias, in_proj_weight = [I; I; I], out_proj.weight = I.
fn identity_mha(d: usize, dtype: DType) -> Result<MultiheadAttention> {
    let eye = Tensor::eye(d, dtype, &Device::Cpu)?;
    let params: HashMap<String, Tensor> = [
        (
            "in_proj_weight".to_string(),
            Tensor::cat(&[&eye, &eye, &eye], 0)?,
        ),
        ("out_proj.weight".to_string(), eye),
    ]
    .into_iter()
    .collect();
    Ok(MultiheadAttention::new(
        MultiheadAttentionConfig::new(d, 1).with_bias(false),
        VarBuilder::from_tensors(params, dtype, &Device::Cpu),
    )?)
}

#[test]
fn identity_projection_mha_equals_self_attention() -> Result<()> {
    for (l, d) in [(1, 1), (3, 4), (6, 8), (10, 16), (7, 50), (12, 64)] {
        let mha = identity_mha(d, DType::F32)?;
        // Seeded: candle's `randn` cannot be, and one draw in many came within a rounding of
        // the bound (1.19e-6 at L 12, d 64).
        let seed = (l * 100 + d) as u64;
        let x = candle_mha::rng::normal(0., 1., (l, d), DType::F32, &Device::Cpu, seed)?;
        let out = mha.forward(&x, &x, &x, &AttentionOptions::new())?;
        let (o, w) = self_attention(&x)?;
        let od = max_abs_diff(&out.output, &o)?;
        let wd = max_abs_diff(out.weights.as_ref().unwrap(), &w)?;
        assert!(
            od < 1e-6 && wd < 1e-6,
            "L {l} d {d}: output {od}, weights {wd}"
        );
    }
    Ok(())
}

#[test]
fn golden_numbers() -> Result<()> {
    let x = Tensor::new(
        &[[1f32, 0., 0., 1.], [0., 1.5, 1., 1.], [0., 1., 1., 1.]],
        &Device::Cpu,
    )?;
    let (out, w) = self_attention(&x)?;
    let ew = Tensor::new(
        &[
            [0.4519f32, 0.2741, 0.2741],
            [0.1045, 0.5307, 0.3648],
            [0.1387, 0.4842, 0.3771],
        ],
        &Device::Cpu,
    )?;
    let eo = Tensor::new(
        &[
            [0.4519f32, 0.6852, 0.5481, 1.0],
            [0.1045, 1.1609, 0.8955, 1.0],
            [0.1387, 1.1034, 0.8613, 1.0],
        ],
        &Device::Cpu,
    )?;
    assert!(max_abs_diff(&w, &ew)? <= 5e-5, "{w}");
    assert!(max_abs_diff(&out, &eo)? <= 5e-5, "{out}");
    Ok(())
}

#[test]
fn self_attention_is_differentiable() -> Result<()> {
    let x = candle::Var::new(&[[1f64, 0.], [0., 1.], [1., 1.]], &Device::Cpu)?;
    let (out, _) = self_attention(x.as_tensor())?;
    let grads = out.sum_all()?.backward()?;
    let g = grads.get(x.as_tensor()).expect("a gradient for x");
    assert_eq!(g.dims(), &[3, 2]);
    assert!(g.abs()?.sum_all()?.to_scalar::<f64>()? > 0.0);
    Ok(())
}

#[test]
fn cosine_matrix_is_symmetric_with_unit_diagonal() -> Result<()> {
    let x = candle_mha::rng::normal(0., 1., (7, 5), DType::F64, &Device::Cpu, 11)?;
    let c = cosine_similarity_matrix(&x)?;
    assert_eq!(c.dims(), &[7, 7]);
    let v = c.to_vec2::<f64>()?;
    for (i, row) in v.iter().enumerate() {
        assert!((row[i] - 1.0).abs() < 1e-12);
        for (j, &x) in row.iter().enumerate() {
            assert!((x - v[j][i]).abs() < 1e-12);
            assert!(x.abs() <= 1.0 + 1e-12);
        }
    }
    // Scaling a row does not change its cosines; a zero row gives zeros, not NaN.
    let x = Tensor::new(&[[1f32, 0.], [3., 3.], [0., 0.]], &Device::Cpu)?;
    let c = cosine_similarity_matrix(&x)?.to_vec2::<f32>()?;
    assert!((c[0][1] - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-6);
    assert_eq!(c[2], [0., 0., 0.]);
    let (out, scores) = cosine_attention(&x)?;
    assert_eq!(max_abs_diff(&out, &scores.matmul(&x)?)?, 0.0);
    Ok(())
}

#[test]
fn attention_functions_reject_bad_input() -> Result<()> {
    let dev = Device::Cpu;
    let e = self_attention(&Tensor::zeros((2, 3, 4), DType::F32, &dev)?)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("self_attention") && e.contains("[2, 3, 4]"),
        "{e}"
    );
    let e = cosine_similarity_matrix(&Tensor::zeros((0, 4), DType::F32, &dev)?)
        .unwrap_err()
        .to_string();
    assert!(e.contains("[0, 4]"), "{e}");
    let e = cosine_attention(&Tensor::zeros((2, 2), DType::U32, &dev)?)
        .unwrap_err()
        .to_string();
    assert!(e.contains("float"), "{e}");
    Ok(())
}

#[test]
fn shipped_file_loads_with_its_documented_size() -> Result<()> {
    let path = common::repo_root().join(SHIPPED);
    assert!(std::fs::metadata(&path)?.len() < 1 << 20, "under 1 MB");
    let wv = load_glove(&path)?;
    assert_eq!((wv.len(), wv.dim()), (SHIPPED_WORDS, SHIPPED_DIM));
    // The walkthrough's sentence is in it, and similar words are closer than unrelated ones.
    let x = wv.stack(&["the", "cat", "sat", "on", "the", "mat"])?;
    assert_eq!(x.dims(), &[6, SHIPPED_DIM]);
    let sim = |a: &str, b: &str| -> Result<f32> {
        let c = cosine_similarity_matrix(&wv.stack(&[a, b])?)?;
        Ok(c.to_vec2::<f32>()?[0][1])
    };
    for (a, near, far) in [
        ("king", "queen", "car"),
        ("woman", "lady", "car"),
        ("apple", "fruit", "bus"),
        ("car", "bus", "apple"),
    ] {
        let (n, f) = (sim(a, near)?, sim(a, far)?);
        assert!(n > f + 0.2, "{a}~{near} {n} vs {a}~{far} {f}");
    }
    Ok(())
}
