//! Vocabulary × vocabulary matrices (`candle_mha_viz::vocab_matrix`): sums, counts and
//! means checked against numbers worked out by hand, streaming, padding, the CSV and
//! safetensors exports, and a corpus run through a real model.

use candle_mha_test_support as common;

use anyhow::Result;
use candle_mha::candle::{DType, Device, Tensor};
use candle_mha::checkpoint::StateDict;
use candle_mha::seeded_var_builder;
use candle_mha_train::data::{batches, Dataset, Example};
use candle_mha_train::models::{NextTokenPredictor, NextTokenPredictorConfig};
use candle_mha_viz::{corpus_vocab_matrix, VocabMatrix};
use candle_nn::VarMap;
use common::{assert_matrix, close, csv, labels};

const TOL: f64 = 1e-12;

/// Two sequences over V = 6 (ids 0..4 are the specials, 4 = "a", 5 = "b,c"):
///
/// ```text
/// seq 0: ids [4, 2, 4]           seq 1: ids [2, 5, pad]
///   q0 (4): [1.0, 0,   0  ]        q0 (2): [1.0, 0,   0]
///   q1 (2): [0.25, 0.75, 0 ]       q1 (5): [0.4, 0.6, 0]
///   q2 (4): [0.5, 0.2, 0.3]        q2 pad: [NaN, NaN, NaN]  (skipped)
/// ```
fn hand_batches() -> Result<[(Tensor, Tensor, Tensor); 2]> {
    let dev = Device::Cpu;
    let nan = f64::NAN;
    let b0 = (
        Tensor::new(&[[4u32, 2, 4]], &dev)?,
        Tensor::new(&[[1.0f64, 0., 0.], [0.25, 0.75, 0.], [0.5, 0.2, 0.3]], &dev)?.unsqueeze(0)?,
        Tensor::new(&[[0u8, 0, 0]], &dev)?,
    );
    let b1 = (
        Tensor::new(&[[2u32, 5, 0]], &dev)?,
        Tensor::new(&[[1.0f64, 0., 0.], [0.4, 0.6, 0.], [nan, nan, nan]], &dev)?.unsqueeze(0)?,
        Tensor::new(&[[0u8, 0, 1]], &dev)?,
    );
    Ok([b0, b1])
}

fn hand_matrix() -> Result<VocabMatrix> {
    let mut m = VocabMatrix::new(6);
    for (ids, w, mask) in hand_batches()? {
        m.add(&ids, &ids, &w, Some(&mask))?;
    }
    Ok(m)
}

/// Worked out by hand from [`hand_batches`]:
/// - (2,2): 0.75 (seq 0 q1) + 1.0 (seq 1 q0) = 1.75, count 2
/// - (2,4): 0.25, count 1
/// - (4,4): 1.0 (q0) + 0.5 + 0.3 (q2 sees "a" twice: one count) = 1.8, count 2
/// - (4,2): 0.2, count 1
/// - (5,2): 0.4, count 1; (5,5): 0.6, count 1
///
/// Row totals: 2 → 2.0, 4 → 2.0, 5 → 1.0.
#[test]
fn vocab_matrix_matches_hand_computation() -> Result<()> {
    let m = hand_matrix()?;
    let z = 0.0;
    assert_matrix(
        &m.sum()?,
        &[
            &[z, z, z, z, z, z],
            &[z, z, z, z, z, z],
            &[z, z, 1.75, z, 0.25, z],
            &[z, z, z, z, z, z],
            &[z, z, 0.2, z, 1.8, z],
            &[z, z, 0.4, z, z, 0.6],
        ],
        TOL,
    )?;
    assert_matrix(
        &m.count()?,
        &[
            &[z, z, z, z, z, z],
            &[z, z, z, z, z, z],
            &[z, z, 2., z, 1., z],
            &[z, z, z, z, z, z],
            &[z, z, 1., z, 2., z],
            &[z, z, 1., z, z, 1.],
        ],
        0.0,
    )?;
    assert_matrix(
        &m.mean()?,
        &[
            &[z, z, z, z, z, z],
            &[z, z, z, z, z, z],
            &[z, z, 0.875, z, 0.25, z],
            &[z, z, z, z, z, z],
            &[z, z, 0.2, z, 0.9, z],
            &[z, z, 0.4, z, z, 0.6],
        ],
        TOL,
    )?;
    assert_matrix(
        &m.row_normalized()?,
        &[
            &[z, z, z, z, z, z],
            &[z, z, z, z, z, z],
            &[z, z, 0.875, z, 0.125, z],
            &[z, z, z, z, z, z],
            &[z, z, 0.1, z, 0.9, z],
            &[z, z, 0.4, z, z, 0.6],
        ],
        TOL,
    )?;
    assert_eq!(m.cell(4, 4).1, 2);
    assert_eq!(m.cell(1, 1), (0.0, 0));
    assert_eq!(m.num_cells(), 6);
    Ok(())
}

/// Softmax rows sum to 1, so the total mass is the number of non-padded query positions.
#[test]
fn totals_count_non_padded_queries() -> Result<()> {
    let m = hand_matrix()?;
    assert_eq!(m.num_queries(), 5);
    assert!(close(m.total_mass(), 5.0, TOL), "{}", m.total_mass());
    Ok(())
}

#[test]
fn streaming_equals_one_shot() -> Result<()> {
    let streamed = hand_matrix()?;
    let [(i0, w0, m0), (i1, w1, m1)] = hand_batches()?;
    // One batch of both sequences (same L = 3).
    let ids = Tensor::cat(&[&i0, &i1], 0)?;
    let w = Tensor::cat(&[&w0, &w1], 0)?;
    let mask = Tensor::cat(&[&m0, &m1], 0)?;
    let mut once = VocabMatrix::new(6);
    once.add(&ids, &ids, &w, Some(&mask))?;
    assert_eq!(once.num_queries(), streamed.num_queries());
    let (a, b) = (once.cells(), streamed.cells());
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.0, y.0);
        assert_eq!(x.1 .1, y.1 .1);
        assert!(close(x.1 .0, y.1 .0, TOL), "{x:?} vs {y:?}");
    }
    Ok(())
}

#[test]
fn padding_is_skipped_and_errors_leave_the_matrix_unchanged() -> Result<()> {
    let [_, (ids, w, mask)] = hand_batches()?;
    let mut m = VocabMatrix::new(6);
    m.add(&ids, &ids, &w, Some(&mask))?;
    // The padded query (id 0, NaN weights) added nothing; key 0 received nothing either.
    assert_eq!(m.num_queries(), 2);
    assert_eq!(m.cell(0, 0), (0.0, 0));
    // Without the mask the NaN row is an error, and nothing is added.
    let before = m.clone();
    let err = m.add(&ids, &ids, &w, None).unwrap_err().to_string();
    assert!(err.contains("weights[0, 2, 0]"), "{err}");
    assert_eq!(m, before);
    Ok(())
}

#[test]
fn vocab_matrix_rejects_bad_input() -> Result<()> {
    let dev = Device::Cpu;
    let mut m = VocabMatrix::new(4);
    let ids = Tensor::new(&[[1u32, 2]], &dev)?;
    let w = Tensor::new(&[[[1f32, 0.], [0.5, 0.5]]], &dev)?;
    let err = |r: candle_mha::candle::Result<()>| r.unwrap_err().to_string();
    let e = err(m.add(&ids, &ids, &w.squeeze(0)?, None));
    assert!(
        e.contains("weights must be (N, L, S)") && e.contains("[2, 2]"),
        "{e}"
    );
    let e = err(m.add(&Tensor::new(&[[1u32, 9]], &dev)?, &ids, &w, None));
    assert!(e.contains("query_ids") && e.contains("id 9"), "{e}");
    let e = err(m.add(&ids.to_dtype(DType::F32)?, &ids, &w, None));
    assert!(e.contains("query_ids") && e.contains("F32"), "{e}");
    let e = err(m.add(&ids, &Tensor::new(&[[1u32, 2, 3]], &dev)?, &w, None));
    assert!(e.contains("weights must be (N, L, S)"), "{e}");
    let e = err(m.add(&ids, &ids, &w, Some(&Tensor::new(&[[0u8]], &dev)?)));
    assert!(e.contains("query_mask"), "{e}");
    let neg = Tensor::new(&[[[1f32, 0.], [1.5, -0.5]]], &dev)?;
    let e = err(m.add(&ids, &ids, &neg, None));
    assert!(e.contains("weights[0, 1, 1] = -0.5"), "{e}");
    assert_eq!(m.num_queries(), 0);
    Ok(())
}

#[test]
fn top_k_ranks_by_row_share() -> Result<()> {
    let m = hand_matrix()?;
    let top1 = m.top_k(1);
    assert_eq!(
        top1.iter()
            .map(|(q, r)| (*q, r.iter().map(|e| e.0).collect::<Vec<_>>()))
            .collect::<Vec<_>>(),
        vec![(2, vec![2]), (4, vec![4]), (5, vec![5])]
    );
    let top2 = m.top_k(2);
    assert_eq!(top2[0].0, 2);
    assert_eq!(top2[0].1.len(), 2);
    assert_eq!(top2[0].1[1].0, 4);
    assert!(close(top2[0].1[0].1, 0.875, TOL) && close(top2[0].1[1].1, 0.125, TOL));
    // Asking for more than a row has gives the whole row.
    assert_eq!(m.top_k(10)[2].1.len(), 2);
    assert!(m.top_k(0).iter().all(|(_, r)| r.is_empty()));
    Ok(())
}

#[test]
fn csv_lists_every_cell() -> Result<()> {
    let m = hand_matrix()?;
    let names = labels(&["<pad>", "<unk>", "<bos>", "<eos>", "a", "b,c"]);
    let csv = m.to_csv(&names);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], "query,key,sum,count,mean,row_share");
    let expected: [(&str, &str, f64, u64, f64, f64); 6] = [
        ("<bos>", "<bos>", 1.75, 2, 0.875, 0.875),
        ("<bos>", "a", 0.25, 1, 0.25, 0.125),
        ("a", "<bos>", 0.2, 1, 0.2, 0.1),
        ("a", "a", 1.8, 2, 0.9, 0.9),
        ("b,c", "<bos>", 0.4, 1, 0.4, 0.4),
        ("b,c", "b,c", 0.6, 1, 0.6, 0.6),
    ];
    assert_eq!(lines.len(), 1 + expected.len(), "{csv}");
    assert!(lines[5].starts_with("\"b,c\","), "{}", lines[5]);
    for (line, e) in lines[1..].iter().zip(expected) {
        let f = csv::split_line(line);
        assert_eq!(f.len(), 6, "{line}");
        assert_eq!((f[0].as_str(), f[1].as_str()), (e.0, e.1), "{line}");
        assert_eq!(f[3].parse::<u64>()?, e.3, "{line}");
        for (field, want) in [(&f[2], e.2), (&f[4], e.4), (&f[5], e.5)] {
            assert!(close(field.parse::<f64>()?, want, TOL), "{line}");
        }
    }
    // Labels too short: bare ids.
    assert!(m.to_csv(&[]).contains("\n4,4,"), "{}", m.to_csv(&[]));
    Ok(())
}

#[test]
fn safetensors_holds_dense_matrices() -> Result<()> {
    let m = hand_matrix()?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("vm.safetensors");
    m.save_safetensors(&path)?;
    let sd = StateDict::load(&path)?;
    for name in ["sum", "count", "mean", "row_normalized"] {
        let t = sd.get(name).unwrap_or_else(|| panic!("missing {name}"));
        assert_eq!(t.dims(), &[6, 6]);
    }
    let sum = sd
        .get("sum")
        .map(|t| t.to_vec2::<f64>())
        .transpose()?
        .unwrap_or_default();
    assert!(close(sum[4][4], 1.8, TOL));
    assert_eq!(
        sd.metadata().get("num_queries").map(String::as_str),
        Some("5")
    );
    assert_eq!(
        sd.metadata().get("vocab_size").map(String::as_str),
        Some("6")
    );
    Ok(())
}

fn tiny_model(vocab: usize) -> Result<NextTokenPredictor> {
    let cfg = NextTokenPredictorConfig {
        vocab_size: vocab,
        max_len: 8,
        embed_dim: 8,
        num_heads: 2,
        num_layers: 2,
        ff_dim: 16,
        dropout: 0.0,
        resid_dropout: 0.0,
        ..NextTokenPredictorConfig::new(0)
    };
    let varmap = VarMap::new();
    Ok(NextTokenPredictor::new(
        cfg,
        seeded_var_builder(&varmap, 3, DType::F32, &Device::Cpu),
    )?)
}

/// The corpus matrix of `model` over `data`, `batch_size` sequences at a time.
fn matrix(
    model: &NextTokenPredictor,
    data: &Dataset,
    layer: usize,
    head: Option<usize>,
    batch_size: usize,
    dev: &Device,
) -> candle::Result<VocabMatrix> {
    let examples = data.examples.iter().cloned().map(Ok);
    let batches =
        batches(examples, batch_size, dev)?.map(|b| b.map(|b| (b.input, b.key_padding_mask)));
    corpus_vocab_matrix(
        model.config().vocab_size,
        batches,
        layer,
        head,
        |ids, kpm| Ok(model.forward_with_attention(ids, Some(kpm))?.1),
    )
}

/// Sequences of different lengths: padding appears in some batchings and not others, and the
/// matrix must not change.
#[test]
fn corpus_matrix_ignores_batching_and_padding() -> Result<()> {
    let model = tiny_model(9)?;
    let data = Dataset {
        examples: vec![
            Example::full(vec![2, 4, 5, 6, 3]),
            Example::full(vec![2, 7, 3]),
            Example::full(vec![2, 8, 8, 4, 5, 6, 3]),
            Example::full(vec![2, 5, 3]),
        ],
    };
    let positions: usize = data.examples.iter().map(|e| e.tokens.len() - 1).sum();
    let dev = Device::Cpu;
    for layer in 0..2 {
        for head in [None, Some(0), Some(1)] {
            let one = matrix(&model, &data, layer, head, 1, &dev)?;
            let all = matrix(&model, &data, layer, head, 4, &dev)?;
            assert_eq!(one.num_queries() as usize, positions);
            assert_eq!(all.num_queries() as usize, positions);
            assert!(
                close(all.total_mass(), positions as f64, 1e-4),
                "{}",
                all.total_mass()
            );
            // No padding id (0) anywhere.
            assert!(all.cells().iter().all(|((q, k), _)| *q != 0 && *k != 0));
            let (a, b) = (one.cells(), all.cells());
            assert_eq!(a.len(), b.len());
            for (x, y) in a.iter().zip(&b) {
                assert_eq!((x.0, x.1 .1), (y.0, y.1 .1));
                assert!(close(x.1 .0, y.1 .0, 1e-5), "{x:?} vs {y:?}");
            }
        }
    }
    // The mean over heads is the mean of the per-head matrices.
    let h0 = matrix(&model, &data, 1, Some(0), 2, &dev)?.sum()?;
    let h1 = matrix(&model, &data, 1, Some(1), 2, &dev)?.sum()?;
    let mean = matrix(&model, &data, 1, None, 2, &dev)?.sum()?;
    let diff = ((h0 + h1)? * 0.5 - mean)?
        .abs()?
        .max_all()?
        .to_scalar::<f64>()?;
    assert!(diff < 1e-5, "{diff}");
    Ok(())
}

#[test]
fn corpus_matrix_rejects_bad_layer_and_head() -> Result<()> {
    let model = tiny_model(9)?;
    let data = Dataset {
        examples: vec![Example::full(vec![2, 4, 3])],
    };
    let dev = Device::Cpu;
    let e = matrix(&model, &data, 2, None, 1, &dev)
        .unwrap_err()
        .to_string();
    assert!(e.contains("layer 2") && e.contains("2 layer(s)"), "{e}");
    let e = matrix(&model, &data, 0, Some(5), 1, &dev)
        .unwrap_err()
        .to_string();
    assert!(e.contains("head 5") && e.contains("2 head(s)"), "{e}");
    let e = matrix(&model, &data, 0, None, 0, &dev)
        .unwrap_err()
        .to_string();
    assert!(e.contains("batch_size 0"), "{e}");
    Ok(())
}

/// Large vocabularies: the dense exports are refused above `MAX_DENSE_VOCAB` ids (a V × V
/// buffer of GPT-2's 50,257 ids would take 20 GB each) while the sparse export holds the same
/// cells; a cell budget bounds the accumulator, and an `add` past it changes nothing.
#[test]
fn large_vocabularies_export_sparse_within_a_cell_budget() -> Result<()> {
    let v = 50_257;
    let dev = Device::Cpu;
    let ids = Tensor::new(&[[50_256u32, 7, 50_256]], &dev)?;
    let w =
        Tensor::new(&[[1.0f64, 0., 0.], [0.25, 0.75, 0.], [0.5, 0.2, 0.3]], &dev)?.unsqueeze(0)?;
    let mut m = VocabMatrix::new(v);
    m.add(&ids, &ids, &w, None)?;
    let e = m.sum().unwrap_err().to_string();
    assert!(e.contains("50257 x 50257") && e.contains("sparse"), "{e}");
    let tmp = tempfile::tempdir()?;
    let path = tmp.path().join("vm.safetensors");
    m.save_sparse_safetensors(&path)?;
    let sd = StateDict::load(&path)?;
    assert_eq!(sd.metadata().get("layout").map(String::as_str), Some("coo"));
    assert_eq!(
        sd.metadata().get("vocab_size").map(String::as_str),
        Some("50257")
    );
    let q = sd.get("query").expect("query").to_vec1::<u32>()?;
    let k = sd.get("key").expect("key").to_vec1::<u32>()?;
    let sum = sd.get("sum").expect("sum").to_vec1::<f64>()?;
    let count = sd.get("count").expect("count").to_vec1::<f64>()?;
    // (7, 7): 0.75; (7, 50256): 0.25; (50256, 7): 0.2; (50256, 50256): 1.0 + 0.5 + 0.3.
    assert_eq!(q, [7, 7, 50_256, 50_256]);
    assert_eq!(k, [7, 50_256, 7, 50_256]);
    for (got, want) in sum.iter().zip([0.75, 0.25, 0.2, 1.8]) {
        assert!(close(*got, want, TOL), "{sum:?}");
    }
    assert_eq!(count, [1.0, 1.0, 1.0, 2.0]);

    let mut small = VocabMatrix::new(v).with_max_cells(3);
    let e = small.add(&ids, &ids, &w, None).unwrap_err().to_string();
    assert!(e.contains("more than 3 nonzero cells"), "{e}");
    assert_eq!(small.num_cells(), 0);
    assert_eq!(small.num_queries(), 0);
    Ok(())
}
