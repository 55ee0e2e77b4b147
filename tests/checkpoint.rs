//! Checkpoint interop against PyTorch-made files (`scripts/make_checkpoint_fixtures.py`):
//! attention layers taken out of a PyTorch `nn.TransformerEncoder` reproduce PyTorch's
//! outputs; dtype casts, strict/non-strict reports, discovery and bad files (saving: `checkpoint_save.rs`).

use candle_mha_test_support as common;

use std::path::PathBuf;

use anyhow::Result;
use candle_mha::candle::{DType, Device, Tensor};
use candle_mha::checkpoint::{
    cast, find_attention_modules, load_attention, load_attention_file, AttentionLoadOptions,
    StateDict,
};
use candle_mha::AttentionOptions;
use common::{assert_close, Fixture};

fn ckpt(name: &str) -> PathBuf {
    common::fixtures_dir().join("checkpoints").join(name)
}

/// Loads both encoder attention layers from `file` and compares them with `expected`
/// (outputs under `{key_prefix}layers.{i}.self_attn.*`).
fn check_encoder(file: &str, expected: &str, key_prefix: &str) -> Result<()> {
    let exp = Fixture::load(&ckpt(expected))?;
    let batch_first = exp.flag("batch_first")?;
    let x = exp.tensor("input")?;
    for i in 0..2 {
        let prefix = format!("layers.{i}.self_attn");
        let opts = AttentionLoadOptions::new(exp.usize("num_heads")?).with_batch_first(batch_first);
        let loaded = load_attention_file(ckpt(file), &prefix, &opts, DType::F32, &Device::Cpu)?;
        assert!(loaded.report.is_clean(), "{}", loaded.report);
        assert_eq!(loaded.report.loaded.len(), 4, "{}", loaded.report);
        let out = loaded.module.forward(x, x, x, &AttentionOptions::new())?;
        let what = format!("{file} {prefix}");
        assert_close(
            &what,
            &out.output,
            exp.tensor(&format!("{key_prefix}{prefix}.output"))?,
            2e-5,
        )?;
        if key_prefix.is_empty() {
            assert_close(
                &what,
                &out.weights.unwrap(),
                exp.tensor(&format!("{prefix}.weights"))?,
                2e-5,
            )?;
        }
    }
    Ok(())
}

#[test]
fn encoder_layers_from_safetensors_and_pickles() -> Result<()> {
    check_encoder(
        "encoder_seq.safetensors",
        "encoder_seq_expected.safetensors",
        "",
    )?;
    check_encoder("encoder_seq.pt", "encoder_seq_expected.safetensors", "")?;
    check_encoder(
        "encoder_bf.safetensors",
        "encoder_bf_expected.safetensors",
        "",
    )?;
    check_encoder("encoder_bf.pt", "encoder_bf_expected.safetensors", "")?;
    check_encoder(
        "encoder_bf_nested_state_dict.pt",
        "encoder_bf_expected.safetensors",
        "",
    )?;
    check_encoder(
        "encoder_bf_nested_model.pt",
        "encoder_bf_expected.safetensors",
        "",
    )?;
    // The legacy stream format and a whole pickled model (`torch.save(model)`).
    check_encoder(
        "encoder_bf_legacy.pt",
        "encoder_bf_expected.safetensors",
        "",
    )?;
    check_encoder(
        "encoder_bf_module.pt",
        "encoder_bf_expected.safetensors",
        "",
    )
}

/// `a` and `b` hold the same names, dtypes, shapes and bit-identical values.
fn assert_same_tensors(what: &str, a: &StateDict, b: &StateDict) -> Result<()> {
    let names = |sd: &StateDict| {
        sd.tensors()
            .iter()
            .map(|(n, _)| n.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(a), names(b), "{what}: names");
    for ((name, x), (_, y)) in a.tensors().iter().zip(b.tensors()) {
        assert_eq!(
            (x.dtype(), x.dims()),
            (y.dtype(), y.dims()),
            "{what}: {name}"
        );
        let bits = |t: &Tensor| -> Result<Vec<u64>> {
            let v = cast(&t.flatten_all()?, DType::F64)?.to_vec1::<f64>()?;
            Ok(v.iter().map(|v| v.to_bits()).collect())
        };
        assert_eq!(bits(x)?, bits(y)?, "{what}: {name} values");
    }
    Ok(())
}

#[test]
fn pickle_formats_read_as_pytorch_wrote_them() -> Result<()> {
    let bf = StateDict::load(ckpt("encoder_bf.safetensors"))?;
    for file in [
        "encoder_bf.pt",
        "encoder_bf_legacy.pt",
        "encoder_bf_module.pt",
    ] {
        let sd = StateDict::load(ckpt(file))?;
        assert_same_tensors(file, &sd, &bf)?;
        assert!(sd.skipped().is_empty(), "{file}: {:?}", sd.skipped());
    }
    assert_eq!(
        StateDict::load(ckpt("encoder_bf_module.pt"))?.metadata()["pickled_module"],
        "torch.nn.modules.transformer.TransformerEncoder"
    );
    // A pickled module: parameters, persistent buffers (int32, bool as u8) and submodules,
    // as state_dict() lists them; not the non-persistent buffer or the None parameter.
    let tagged = StateDict::load(ckpt("tagged_module.pt"))?;
    assert_same_tensors(
        "tagged_module.pt",
        &tagged,
        &StateDict::load(ckpt("tagged_module_expected.safetensors"))?,
    )?;
    assert_eq!(tagged.metadata()["pickled_module"], "__main__.Tagged");
    // Safetensors too: bool read as u8, an int8 tensor reported, the rest still read.
    let st = StateDict::load(ckpt("tagged_module_bool_i8.safetensors"))?;
    assert_same_tensors("tagged_module_bool_i8.safetensors", &st, &tagged)?;
    assert_eq!(st.skipped().len(), 1);
    assert_eq!(st.skipped()[0].0, "q8");
    // Loading the module that holds it names the tensor; the one beside it loads.
    let opts = AttentionLoadOptions::new(2);
    let err = load_attention(&st, "", &opts, DType::F32, &Device::Cpu)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("q8 cannot be read: its dtype I8"), "{err}");
    let attn = load_attention(&st, "attn", &opts, DType::F32, &Device::Cpu)?;
    assert!(attn.report.is_clean(), "{}", attn.report);
    // Views (offsets, strides, stride 0, permutations, shared storage) and every dtype
    // candle has; int8 and complex are reported, not dropped silently.
    let views = StateDict::load(ckpt("views_dtypes.pt"))?;
    assert_same_tensors(
        "views_dtypes.pt",
        &views,
        &StateDict::load(ckpt("views_dtypes_expected.safetensors"))?,
    )?;
    let skipped: Vec<_> = views.skipped().iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(skipped, ["c64", "i8"]);
    assert!(
        views.skipped()[0].1.contains("complex64"),
        "{:?}",
        views.skipped()
    );
    assert!(
        views.skipped()[1].1.contains("int8"),
        "{:?}",
        views.skipped()
    );
    assert_eq!(views.under("nothing").skipped().len(), 0);
    Ok(())
}

#[test]
fn half_and_double_checkpoints_load_into_f32_with_their_rounding() -> Result<()> {
    for (dt, stored) in [
        ("f16", DType::F16),
        ("bf16", DType::BF16),
        ("f64", DType::F64),
    ] {
        let file = format!("encoder_bf_{dt}.safetensors");
        check_encoder(&file, "encoder_bf_expected.safetensors", &format!("{dt}."))?;
        let opts = AttentionLoadOptions::new(4).with_batch_first(true);
        let loaded = load_attention_file(
            ckpt(&file),
            "layers.0.self_attn",
            &opts,
            DType::F32,
            &Device::Cpu,
        )?;
        assert_eq!(loaded.report.casts.len(), 4);
        assert!(loaded
            .report
            .casts
            .iter()
            .all(|c| c.from == stored && c.to == DType::F32));
        assert!(loaded
            .report
            .to_string()
            .contains(&format!("dtype cast {stored:?} -> F32")));
    }
    Ok(())
}

#[test]
fn separate_projections_and_bias_kv_inferred() -> Result<()> {
    let exp = Fixture::load(&ckpt("cross_kv_expected.safetensors"))?;
    let sd = StateDict::load(ckpt("cross_kv.safetensors"))?;
    let loaded = load_attention(
        &sd,
        "decoder.cross_attn",
        &AttentionLoadOptions::new(2),
        DType::F32,
        &Device::Cpu,
    )?;
    let cfg = loaded.module.config();
    assert_eq!(
        (
            cfg.embed_dim,
            cfg.kdim(),
            cfg.vdim(),
            cfg.bias,
            cfg.add_bias_kv
        ),
        (8, 6, 4, true, true)
    );
    // head.* is outside the prefix: not unexpected.
    assert!(loaded.report.is_clean(), "{}", loaded.report);
    let (q, k, v) = (
        exp.tensor("query")?,
        exp.tensor("key")?,
        exp.tensor("value")?,
    );
    let out = loaded.module.forward(q, k, v, &AttentionOptions::new())?;
    assert_close("output", &out.output, exp.tensor("output")?, 2e-5)?;
    assert_close(
        "weights",
        &out.weights.unwrap(),
        exp.tensor("weights")?,
        2e-5,
    )?;
    Ok(())
}

#[test]
fn discovers_every_attention_layer_of_a_transformer() -> Result<()> {
    let sd = StateDict::load(ckpt("transformer.safetensors"))?;
    let found = find_attention_modules(&sd);
    let prefixes: Vec<&str> = found.iter().map(|a| a.prefix.as_str()).collect();
    assert_eq!(
        prefixes,
        [
            "decoder.layers.0.multihead_attn.",
            "decoder.layers.0.self_attn.",
            "encoder.layers.0.self_attn."
        ]
    );
    assert!(found
        .iter()
        .all(|a| a.embed_dim == 8 && a.bias && !a.add_bias_kv));
    let cross = find_attention_modules(&StateDict::load(ckpt("cross_kv.safetensors"))?);
    assert_eq!((cross.len(), cross[0].kdim, cross[0].vdim), (1, 6, 4));
    // A bare module at the root, without bias.
    let bare = find_attention_modules(&StateDict::load(ckpt("mha_bias_false.pt"))?);
    assert_eq!(
        (bare.len(), bare[0].prefix.as_str(), bare[0].bias),
        (1, "", false)
    );
    Ok(())
}

#[test]
fn strict_fails_with_the_report_and_non_strict_reports() -> Result<()> {
    let sd = StateDict::load(ckpt("encoder_bf.safetensors"))?;
    let p = "layers.0.self_attn.";
    let tensors: Vec<(String, Tensor)> = sd
        .tensors()
        .iter()
        .filter(|(n, _)| n != &format!("{p}in_proj_bias"))
        .map(|(n, t)| {
            let t = if n == &format!("{p}out_proj.bias") {
                t.narrow(0, 0, 8).unwrap()
            } else {
                t.clone()
            };
            (n.clone(), t)
        })
        .chain([(
            format!("{p}extra"),
            Tensor::zeros(3, DType::F32, &Device::Cpu)?,
        )])
        .collect();
    let broken = StateDict::from_tensors(tensors);
    let opts = AttentionLoadOptions::new(4);
    let err = match load_attention(&broken, p, &opts, DType::F32, &Device::Cpu) {
        Ok(_) => anyhow::bail!("strict loading accepted a broken state_dict"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.starts_with("Error(s) in loading state_dict for MultiheadAttention: 1 missing key(s), 1 unexpected key(s), 1 size mismatch(es); nothing was loaded (strict)."),
        "{err}"
    );
    for needle in [
        "Missing key(s) in state_dict: \"in_proj_bias\"",
        "Unexpected key(s) in state_dict: \"layers.0.self_attn.extra\"",
        "size mismatch for out_proj.bias: copying a param with shape [8] from checkpoint, the shape in current model is [16]",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in:\n{err}");
    }
    let loaded = load_attention(
        &broken,
        p,
        &opts.with_strict(false),
        DType::F32,
        &Device::Cpu,
    )?;
    let r = &loaded.report;
    assert_eq!(
        (r.missing.clone(), r.unexpected.clone()),
        (vec!["in_proj_bias".to_string()], vec![format!("{p}extra")])
    );
    assert_eq!(r.shape_mismatches[0].name, "out_proj.bias");
    assert_eq!(r.loaded, ["in_proj_weight", "out_proj.weight"]);
    // Loaded values are the checkpoint's.
    let w = sd.get(&format!("{p}in_proj_weight")).unwrap();
    assert_close(
        "in_proj_weight",
        loaded.module.in_proj_weight().unwrap(),
        w,
        0.0,
    )?;
    Ok(())
}

/// Every bad file gives an error naming the problem, and nothing panics.
#[test]
fn bad_files_are_errors_not_panics() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let good = std::fs::read(ckpt("encoder_bf.safetensors"))?;
    let good_pt = std::fs::read(ckpt("encoder_bf.pt"))?;
    let header_len = u64::from_le_bytes(good[..8].try_into()?) as usize;
    let header = std::str::from_utf8(&good[8..8 + header_len])?.to_string();
    // A header whose offsets claim more data than the file has.
    let lying = {
        let grown = header.replacen("\"data_offsets\":[0,", "\"data_offsets\":[0,9", 1);
        let mut h = grown.into_bytes();
        h.resize(header_len.max(h.len()), b' ');
        let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
        bytes.extend(h);
        bytes.extend(&good[8 + header_len..]);
        bytes
    };
    let files: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty.safetensors", vec![], "empty"),
        (
            "truncated.safetensors",
            good[..good.len() / 2].to_vec(),
            "cannot read checkpoint",
        ),
        (
            "garbage.safetensors",
            b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!".to_vec(),
            "invalid safetensors header",
        ),
        (
            "huge_header.safetensors",
            u64::MAX.to_le_bytes().to_vec(),
            "invalid safetensors header",
        ),
        ("lying.safetensors", lying, "cannot read checkpoint"),
        (
            "truncated.pt",
            good_pt[..good_pt.len() / 2].to_vec(),
            "cannot read checkpoint",
        ),
        (
            "garbage.pt",
            b"PK\x03\x04 this is not a zip archive".to_vec(),
            "cannot read checkpoint",
        ),
        ("empty.pt", vec![], "cannot read checkpoint"),
    ];
    let mut cases: Vec<(PathBuf, &str)> = Vec::new();
    for (name, bytes, needle) in files {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes)?;
        cases.push((p, needle));
    }
    cases.push((dir.path().to_path_buf(), "is a directory"));
    cases.push((
        dir.path().join("missing.safetensors"),
        "cannot read checkpoint",
    ));
    cases.push((ckpt("no_tensors.pt"), "holds no tensors"));
    // A zero-stride view of 2**29 elements over one float: refused before any allocation.
    cases.push((ckpt("expanded_view.pt"), "more than the 268435456 bytes"));
    let mut failures = Vec::new();
    for (path, needle) in &cases {
        let result = std::panic::catch_unwind(|| StateDict::load(path).map(|sd| sd.len()));
        match result {
            Err(_) => failures.push(format!("{}: panicked", path.display())),
            Ok(Ok(n)) => failures.push(format!("{}: loaded {n} tensors", path.display())),
            Ok(Err(e)) if !e.to_string().contains(needle) => {
                failures.push(format!("{}: error {e:?} lacks {needle:?}", path.display()))
            }
            Ok(Err(_)) => {}
        }
    }
    // An integer tensor where a float parameter belongs is refused, not cast.
    let int_weight: Vec<(String, Tensor)> = StateDict::load(ckpt("encoder_bf.safetensors"))?
        .tensors()
        .iter()
        .map(|(n, t)| {
            let t = if n == "layers.0.self_attn.in_proj_weight" {
                t.to_dtype(DType::I64).unwrap()
            } else {
                t.clone()
            };
            (n.clone(), t)
        })
        .collect();
    let err = load_attention(
        &StateDict::from_tensors(int_weight),
        "layers.0.self_attn",
        &AttentionLoadOptions::new(4),
        DType::F32,
        &Device::Cpu,
    )
    .err()
    .map(|e| e.to_string());
    assert!(
        err.as_deref().is_some_and(|e| e.contains(
            "dtype mismatch for in_proj_weight: the checkpoint holds I64, the model expects F32"
        )),
        "{err:?}"
    );
    // Good file, wrong content for the module: missing prefix, wrong head count.
    let sd = StateDict::load(ckpt("encoder_bf.safetensors"))?;
    let opts = AttentionLoadOptions::new(4);
    let err = load_attention(&sd, "layers.7.self_attn", &opts, DType::F32, &Device::Cpu)
        .err()
        .map(|e| e.to_string());
    assert!(
        err.as_deref().is_some_and(|e| e
            .contains("no attention module at prefix \"layers.7.self_attn.\"")
            && e.contains("layers.0.self_attn.")),
        "{err:?}"
    );
    let err = load_attention(
        &sd,
        "layers.0.self_attn",
        &AttentionLoadOptions::new(3),
        DType::F32,
        &Device::Cpu,
    )
    .err()
    .map(|e| e.to_string());
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains("divisible") && e.contains("[1, 2, 4, 8, 16]")),
        "{err:?}"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

/// A `torch.save` file nesting 200,000 lists is an error, not a stack overflow; devices and
/// FIFOs are refused rather than read forever.
#[test]
fn hostile_files_are_errors_not_aborts() -> Result<()> {
    use std::io::Write;
    let tmp = tempfile::tempdir()?;
    let path = tmp.path().join("nested.pt");
    let mut pkl = vec![0x80, 2];
    pkl.extend(std::iter::repeat_n(b']', 200_000));
    pkl.extend(std::iter::repeat_n(b'a', 199_999));
    pkl.push(b'.');
    let mut zip = zip::ZipWriter::new(std::fs::File::create(&path)?);
    zip.start_file("archive/data.pkl", zip::write::SimpleFileOptions::default())?;
    zip.write_all(&pkl)?;
    zip.finish()?;
    let e = StateDict::load(&path).unwrap_err().to_string();
    assert!(e.contains("deeper than 1000 levels"), "{e}");
    #[cfg(unix)]
    for device in ["/dev/zero", "/dev/urandom"] {
        if std::path::Path::new(device).exists() {
            let e = StateDict::load(device).unwrap_err().to_string();
            assert!(e.contains("not a regular file"), "{device}: {e}");
        }
    }
    Ok(())
}

/// `StateDict::load` reads a safetensors file one tensor at a time; it gives what parsing the
/// whole file in memory gives (`from_safetensors_bytes`, the `safetensors` crate's own
/// parser): names, dtypes, values bit for bit, skipped tensors (bool, int8) and metadata, for
/// every safetensors fixture PyTorch wrote.
#[test]
fn streamed_load_equals_the_whole_file_parsed() -> Result<()> {
    let dir = common::fixtures_dir().join("checkpoints");
    let mut files = 0;
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "safetensors") {
            continue;
        }
        files += 1;
        let streamed = StateDict::load(&path)?;
        let whole = StateDict::from_safetensors_bytes(&std::fs::read(&path)?)?;
        let what = path.display().to_string();
        assert_eq!(streamed.skipped(), whole.skipped(), "{what}");
        assert_eq!(streamed.tensors().len(), whole.tensors().len(), "{what}");
        for ((n1, t1), (n2, t2)) in streamed.tensors().iter().zip(whole.tensors()) {
            assert_eq!(n1, n2, "{what}");
            assert_eq!(
                (t1.dtype(), t1.dims()),
                (t2.dtype(), t2.dims()),
                "{what} {n1}"
            );
            let bits = |t: &Tensor| -> Result<Vec<u8>> {
                Ok(StateDict::from_tensors([("t".to_string(), t.clone())])
                    .to_safetensors_bytes()?)
            };
            assert_eq!(bits(t1)?, bits(t2)?, "{what} {n1}");
        }
        let mut m1: Vec<_> = streamed.metadata().iter().collect();
        let mut m2: Vec<_> = whole.metadata().iter().collect();
        m1.sort();
        m2.sort();
        assert_eq!(m1, m2, "{what}");
    }
    assert!(files >= 10, "{files} safetensors fixtures");
    Ok(())
}

/// A model built with `zeroed_var_builder` (zeros, no initialisation) and filled by
/// `load_into_varmap_owned` equals the model the state_dict came from; a state_dict missing a
/// parameter is refused by name and writes nothing (the variables stay zeros).
#[test]
fn zeroed_model_loaded_owned_equals_the_source() -> Result<()> {
    use candle_mha::checkpoint::{load_into_varmap_owned, state_dict_of, LoadOptions};
    use candle_mha::{
        seeded_var_builder, zeroed_var_builder, MultiheadAttention, MultiheadAttentionConfig,
    };
    let dev = Device::Cpu;
    let cfg = MultiheadAttentionConfig::new(8, 2);
    let source_map = candle_nn::VarMap::new();
    let source = MultiheadAttention::new(
        cfg.clone(),
        seeded_var_builder(&source_map, 5, DType::F32, &dev),
    )?;
    let sd = state_dict_of(&[("", &source_map)]);
    let x = Tensor::randn(0f32, 1.0, (2, 3, 8), &dev)?;
    let want = source.forward(&x, &x, &x, &AttentionOptions::new())?.output;

    let map = candle_nn::VarMap::new();
    let loaded = MultiheadAttention::new(cfg.clone(), zeroed_var_builder(&map, DType::F32, &dev))?;
    let zero = loaded.forward(&x, &x, &x, &AttentionOptions::new())?.output;
    assert_eq!(zero.abs()?.sum_all()?.to_scalar::<f32>()?, 0.0);
    let report = load_into_varmap_owned(&map, sd.clone(), &LoadOptions::new())?;
    assert_eq!(report.loaded.len(), sd.tensors().len());
    let got = loaded.forward(&x, &x, &x, &AttentionOptions::new())?.output;
    assert_eq!(got.to_vec3::<f32>()?, want.to_vec3::<f32>()?);

    let short = StateDict::from_tensors(
        sd.tensors()
            .iter()
            .filter(|(n, _)| n != "out_proj.bias")
            .cloned(),
    );
    let map = candle_nn::VarMap::new();
    let m = MultiheadAttention::new(cfg, zeroed_var_builder(&map, DType::F32, &dev))?;
    let e = load_into_varmap_owned(&map, short, &LoadOptions::new()).unwrap_err();
    assert!(e.to_string().contains("out_proj.bias"), "{e}");
    let still = m.forward(&x, &x, &x, &AttentionOptions::new())?.output;
    assert_eq!(still.abs()?.sum_all()?.to_scalar::<f32>()?, 0.0);
    Ok(())
}

/// `torch.save` to a file named with a 21-character stem (`ckpt_iter_000400_best.pt`): its
/// first central directory record is as long as PyTorch's zip64 records, and the zip crate's
/// search for the directory took the second record for the first ("Invalid Central Directory
/// header"). Written by PyTorch (`scripts/make_checkpoint_fixtures.py`).
#[test]
fn a_torch_save_archive_with_a_21_character_name_is_read() -> Result<()> {
    let sd = StateDict::load(ckpt("ckpt_iter_000400_best.pt"))?;
    let w = sd.get("w").expect("w");
    assert_eq!(w.dims(), [2, 3]);
    assert_eq!(
        w.flatten_all()?.to_vec1::<f32>()?,
        [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    );
    Ok(())
}
