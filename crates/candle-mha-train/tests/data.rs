//! Tests of the `data` module: vocabularies, synthetic task, token files, splitting and
//! batching (text tokenization: `data_text.rs`).

use std::collections::HashSet;

use anyhow::Result;
use candle::Device;
use candle_mha_train::data::{
    encode_sequences, read_token_file, AssociativeRecall, Batch, Dataset, Example, Vocab, BOS,
    BOS_ID, EOS, EOS_ID, PAD, PAD_ID, UNK, UNK_ID,
};

fn strings(words: &[&str]) -> Vec<String> {
    words.iter().map(|s| s.to_string()).collect()
}

fn err_text<T: std::fmt::Debug>(r: candle::Result<T>) -> String {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.to_string(),
    }
}

// ---------------------------------------------------------------- vocab

#[test]
fn vocab_build_encode_decode() {
    let seqs = [strings(&["b", "a", "b"]), strings(&["c", "a"])];
    let vocab = Vocab::build(seqs.iter().map(Vec::as_slice));
    assert_eq!(vocab.len(), 7);
    assert!(!vocab.is_empty());
    assert_eq!(
        (PAD_ID, UNK_ID, BOS_ID, EOS_ID),
        (
            vocab.id(PAD).unwrap(),
            vocab.id(UNK).unwrap(),
            vocab.id(BOS).unwrap(),
            vocab.id(EOS).unwrap()
        )
    );
    assert_eq!(vocab.id("b"), Some(4));
    assert_eq!(vocab.id("a"), Some(5));
    assert_eq!(vocab.id("c"), Some(6));
    assert_eq!(vocab.symbol(6), Some("c"));
    assert_eq!(vocab.symbol(7), None);
    assert_eq!(vocab.encode(&["a", "zz", "c"]), vec![5, UNK_ID, 6]);
    assert_eq!(vocab.decode(&[4, 5, 99]), strings(&["b", "a", UNK]));

    let from = Vocab::from_symbols(&["b", "a", "b", "c", PAD]);
    assert_eq!(from, vocab);
}

#[test]
fn vocab_strict_names_unknown_symbols() {
    let vocab = Vocab::from_symbols(&["x", "y"]);
    assert_eq!(vocab.encode_strict(&["y", "x"]).unwrap(), vec![5, 4]);
    let msg = err_text(vocab.encode_strict(&["x", "foo", "bar", "foo"]));
    assert!(msg.contains("\"foo\"") && msg.contains("\"bar\""), "{msg}");
    assert!(msg.contains("2 unknown"), "{msg}");
}

#[test]
fn vocab_save_load_round_trip() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("vocab.json");
    let vocab = Vocab::from_symbols(&["k0", "v0", "?", "with space", "ünï"]);
    vocab.save(&path)?;
    let json: Vec<String> = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    assert_eq!(json[..4], strings(&[PAD, UNK, BOS, EOS])[..]);
    assert_eq!(json.len(), vocab.len());
    let loaded = Vocab::load(&path)?;
    assert_eq!(loaded, vocab);
    assert_eq!(loaded.id("ünï"), Some(8));
    Ok(())
}

#[test]
fn vocab_load_rejects_bad_files() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let p = dir.path().join("vocab.json");

    let msg = err_text(Vocab::load(&dir.path().join("missing.json")));
    assert!(msg.contains("missing.json"), "{msg}");

    std::fs::write(&p, "{\"a\": 1}")?;
    let msg = err_text(Vocab::load(&p));
    assert!(
        msg.contains("vocab.json") && msg.contains("line 1"),
        "{msg}"
    );

    std::fs::write(&p, "[\"<pad>\", \"<unk>\",\n 3]")?;
    let msg = err_text(Vocab::load(&p));
    assert!(msg.contains("line 2"), "{msg}");

    std::fs::write(&p, r#"["<pad>", "<bos>", "<unk>", "<eos>", "a"]"#)?;
    let msg = err_text(Vocab::load(&p));
    assert!(
        msg.contains("entry 1") && msg.contains("\"<bos>\""),
        "{msg}"
    );

    std::fs::write(&p, r#"["<pad>", "<unk>"]"#)?;
    let msg = err_text(Vocab::load(&p));
    assert!(msg.contains("2 entries"), "{msg}");

    std::fs::write(&p, r#"["<pad>", "<unk>", "<bos>", "<eos>", "a", "a"]"#)?;
    let msg = err_text(Vocab::load(&p));
    assert!(msg.contains("\"a\" appears twice"), "{msg}");
    Ok(())
}

// ---------------------------------------------------------------- associative recall

#[test]
fn recall_is_deterministic_by_seed() {
    let task = AssociativeRecall::default();
    let a = task.generate(50, 7);
    let b = task.generate(50, 7);
    let c = task.generate(50, 8);
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(a.len(), 50);
    // The first examples do not depend on how many are drawn.
    assert_eq!(task.generate(10, 7).examples[..], a.examples[..10]);
}

#[test]
fn recall_answers_are_correct_and_masked_at_the_end() {
    let task = AssociativeRecall {
        num_keys: 8,
        num_values: 5,
        pairs: 3,
    };
    assert!(task.validate().is_ok());
    let vocab = task.vocab();
    assert_eq!(vocab.len(), 4 + 8 + 5 + 1);
    assert_eq!(vocab.symbol(4), Some("k0"));
    assert_eq!(vocab.symbol(12), Some("v0"));
    assert_eq!(vocab.symbol(17), Some("?"));
    assert_eq!(task.seq_len(), 10);
    let data = task.generate(200, 1);
    let mut queried = HashSet::new();
    for e in &data.examples {
        assert_eq!(e.tokens.len(), task.seq_len());
        let s = vocab.decode(&e.tokens);
        assert_eq!(s[0], BOS);
        let mut keys = HashSet::new();
        for p in 0..task.pairs {
            let (k, v) = (&s[1 + 2 * p], &s[2 + 2 * p]);
            assert!(k.starts_with('k') && v.starts_with('v'), "{s:?}");
            assert!(keys.insert(k.clone()), "repeated key in {s:?}");
        }
        let n = s.len();
        assert_eq!(s[n - 3], "?");
        let q = &s[n - 2];
        let p = (0..task.pairs)
            .find(|p| &s[1 + 2 * p] == q)
            .unwrap_or_else(|| panic!("query key not shown in {s:?}"));
        assert_eq!(s[n - 1], s[2 + 2 * p], "{s:?}");
        queried.insert(p);
        assert_eq!(e.loss_mask.len(), n - 1);
        assert!(e.loss_mask[n - 2]);
        assert_eq!(e.loss_mask.iter().filter(|&&m| m).count(), 1);
    }
    assert_eq!(
        queried.len(),
        task.pairs,
        "every pair position gets queried"
    );
}

#[test]
fn recall_bad_settings_do_not_panic() {
    let bad = AssociativeRecall {
        num_keys: 2,
        num_values: 3,
        pairs: 5,
    };
    assert!(err_text(bad.validate()).contains("pairs = 5"));
    let d = bad.generate(4, 0);
    assert!(d.examples.iter().all(|e| e.tokens.len() == bad.seq_len()));
    let none = AssociativeRecall {
        num_keys: 0,
        num_values: 0,
        pairs: 0,
    };
    assert!(none.validate().is_err());
    assert!(none.generate(3, 0).is_empty());
}

// ---------------------------------------------------------------- token files

#[test]
fn token_file_good() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let p = dir.path().join("seqs.txt");
    std::fs::write(
        &p,
        "# header\n3 1 4\n\n  1 5 \t9\r\n   # indented comment\nx\n",
    )?;
    let seqs = read_token_file(&p, 10)?;
    assert_eq!(
        seqs,
        vec![
            strings(&["3", "1", "4"]),
            strings(&["1", "5", "9"]),
            strings(&["x"])
        ]
    );
    let vocab = Vocab::build(seqs.iter().map(Vec::as_slice));
    let data = encode_sequences(&seqs, &vocab);
    assert_eq!(data.len(), 3);
    assert_eq!(data.examples[0].tokens, vec![BOS_ID, 4, 5, 6, EOS_ID]);
    assert_eq!(data.examples[1].tokens, vec![BOS_ID, 5, 7, 8, EOS_ID]);
    assert_eq!(data.examples[2].tokens, vec![BOS_ID, 9, EOS_ID]);
    assert_eq!(data.examples[2].loss_mask, vec![true, true]);
    assert_eq!(data.max_len(), 5);
    // Unknown symbols become UNK.
    let small = Vocab::from_symbols(&["1"]);
    let d = encode_sequences(&seqs[..1], &small);
    assert_eq!(
        d.examples[0].tokens,
        vec![BOS_ID, UNK_ID, 4, UNK_ID, EOS_ID]
    );
    Ok(())
}

#[test]
fn token_file_errors() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "# only a comment\n\n   \n")?;
    let msg = err_text(read_token_file(&empty, 10));
    assert!(
        msg.contains("empty.txt") && msg.contains("no sequence"),
        "{msg}"
    );

    let msg = err_text(read_token_file(dir.path(), 10));
    assert!(msg.contains("directory"), "{msg}");

    let missing = dir.path().join("missing.txt");
    let msg = err_text(read_token_file(&missing, 10));
    assert!(msg.contains("missing.txt"), "{msg}");

    let long = dir.path().join("long.txt");
    std::fs::write(&long, "a b\n# c\n\na b c d e f g h i\n")?;
    let msg = err_text(read_token_file(&long, 10));
    assert!(msg.contains("long.txt:4"), "{msg}");
    assert!(
        msg.contains("9 symbols") && msg.contains("11 tokens"),
        "{msg}"
    );
    assert!(msg.contains("max_tokens = 10"), "{msg}");
    assert_eq!(read_token_file(&long, 11)?.len(), 2);

    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, b"a\n\xff\n")?;
    let msg = err_text(read_token_file(&bad, 10));
    assert!(msg.contains("bad.txt:2"), "{msg}");
    Ok(())
}

// ---------------------------------------------------------------- split and batching

fn numbered(n: usize) -> Dataset {
    // Example i has tokens [BOS, 10 + i, EOS] plus i % 3 extra tokens: distinct and of varied
    // length.
    let examples = (0..n)
        .map(|i| {
            let mut t = vec![BOS_ID, 10 + i as u32];
            t.extend(std::iter::repeat_n(5, i % 3));
            t.push(EOS_ID);
            Example::full(t)
        })
        .collect();
    Dataset { examples }
}

fn ids_of(d: &Dataset) -> Vec<u32> {
    d.examples.iter().map(|e| e.tokens[1]).collect()
}

#[test]
fn split_is_deterministic_and_disjoint() {
    let (train, val) = numbered(20).split(0.1, 3);
    let (train2, val2) = numbered(20).split(0.1, 3);
    assert_eq!(
        (ids_of(&train), ids_of(&val)),
        (ids_of(&train2), ids_of(&val2))
    );
    assert_eq!((train.len(), val.len()), (18, 2));
    let mut all: Vec<u32> = ids_of(&train).into_iter().chain(ids_of(&val)).collect();
    all.sort();
    assert_eq!(all, (10..30).collect::<Vec<u32>>());
    let (train3, _) = numbered(20).split(0.1, 4);
    assert_ne!(ids_of(&train3), ids_of(&train), "the seed matters");
    let (train4, val4) = numbered(20).split(0.5, 4);
    assert_eq!((train4.len(), val4.len()), (10, 10));

    // Small fractions still give one validation example; training keeps at least one.
    assert_eq!(numbered(5).split(0.01, 0).1.len(), 1);
    assert_eq!(numbered(5).split(1.0, 0).0.len(), 1);
    assert_eq!(numbered(5).split(0.0, 0).1.len(), 0);
    assert_eq!(numbered(1).split(0.5, 0).0.len(), 1);
    assert_eq!(numbered(5).split(f64::NAN, 0).1.len(), 0);
}

#[test]
fn batch_pads_and_masks_by_hand() -> Result<()> {
    let a = Example::full(vec![2, 7, 8, 3]);
    let b = Example {
        tokens: vec![2, 9],
        loss_mask: vec![true],
    };
    let c = Example {
        tokens: vec![2, 5, 6],
        loss_mask: vec![false, true],
    };
    let batch = Batch::from_examples(&[&a, &b, &c], &Device::Cpu)?;
    assert_eq!(batch.input.dims(), &[3, 3]);
    assert_eq!(batch.input.dtype(), candle::DType::U32);
    assert_eq!(batch.targets.dtype(), candle::DType::U32);
    assert_eq!(batch.loss_mask.dtype(), candle::DType::U8);
    assert_eq!(batch.key_padding_mask.dtype(), candle::DType::U8);
    assert_eq!(
        batch.input.to_vec2::<u32>()?,
        vec![vec![2, 7, 8], vec![2, PAD_ID, PAD_ID], vec![2, 5, PAD_ID]]
    );
    assert_eq!(
        batch.targets.to_vec2::<u32>()?,
        vec![vec![7, 8, 3], vec![9, PAD_ID, PAD_ID], vec![5, 6, PAD_ID]]
    );
    assert_eq!(
        batch.loss_mask.to_vec2::<u8>()?,
        vec![vec![1, 1, 1], vec![1, 0, 0], vec![0, 1, 0]]
    );
    assert_eq!(
        batch.key_padding_mask.to_vec2::<u8>()?,
        vec![vec![0, 0, 0], vec![0, 1, 1], vec![0, 0, 1]]
    );
    assert_eq!(batch.num_tokens, 5);
    assert_eq!((batch.batch_size(), batch.seq_len()), (3, 3));
    Ok(())
}

#[test]
fn batch_rejects_bad_examples() {
    let dev = Device::Cpu;
    assert!(Batch::from_examples(&[], &dev).is_err());
    let short = Example::full(vec![2]);
    let msg = err_text(Batch::from_examples(&[&short], &dev));
    assert!(msg.contains("1 token"), "{msg}");
    let bad = Example {
        tokens: vec![2, 3, 4],
        loss_mask: vec![true],
    };
    let msg = err_text(Batch::from_examples(&[&bad], &dev));
    assert!(
        msg.contains("length 1") && msg.contains("length 2"),
        "{msg}"
    );
}

fn epoch_ids(d: &Dataset, bs: usize, epoch: u64, seed: u64) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for i in 0..d.num_batches(bs) {
        let b = d.batch(bs, epoch, i, seed, &Device::Cpu)?;
        assert!(b.batch_size() <= bs);
        // Column 0 of the input is BOS, column 0 of the targets is the example's id.
        let t = b.targets.to_vec2::<u32>()?;
        out.extend(t.iter().map(|row| row[0]));
    }
    Ok(out)
}

#[test]
fn epochs_cover_every_example_once_and_reproduce() -> Result<()> {
    let d = numbered(23);
    assert_eq!(d.num_batches(5), 5);
    assert_eq!(d.num_batches(23), 1);
    assert_eq!(d.num_batches(0), 0);
    let e0 = epoch_ids(&d, 5, 0, 42)?;
    let e1 = epoch_ids(&d, 5, 1, 42)?;
    for e in [&e0, &e1] {
        let mut sorted = e.clone();
        sorted.sort();
        assert_eq!(sorted, (10..33).collect::<Vec<u32>>());
    }
    assert_ne!(e0, e1, "epochs are shuffled differently");
    assert_eq!(e0, epoch_ids(&d, 5, 0, 42)?, "same epoch, same order");
    assert_ne!(e0, epoch_ids(&d, 5, 0, 43)?, "the seed matters");
    // Resuming mid-epoch: batch 3 alone equals batch 3 of the full pass.
    let b3 = d.batch(5, 1, 3, 42, &Device::Cpu)?;
    let t = b3.targets.to_vec2::<u32>()?;
    assert_eq!(
        t.iter().map(|r| r[0]).collect::<Vec<_>>(),
        e1[15..20].to_vec()
    );
    // The last batch is partial.
    assert_eq!(d.batch(5, 0, 4, 42, &Device::Cpu)?.batch_size(), 3);
    assert!(err_text(d.batch(5, 0, 5, 42, &Device::Cpu)).contains("index 5"));
    assert!(d.batch(0, 0, 0, 42, &Device::Cpu).is_err());
    assert!(Dataset::default().batch(4, 0, 0, 1, &Device::Cpu).is_err());
    Ok(())
}

#[test]
fn eval_batches_are_in_order() -> Result<()> {
    let d = numbered(7);
    let batches = d.eval_batches(3, &Device::Cpu)?;
    assert_eq!(batches.len(), 3);
    let ids: Vec<u32> = batches
        .iter()
        .flat_map(|b| b.targets.to_vec2::<u32>().unwrap())
        .map(|r| r[0])
        .collect();
    assert_eq!(ids, (10..17).collect::<Vec<u32>>());
    assert_eq!(batches[2].batch_size(), 1);
    assert!(Dataset::default().eval_batches(3, &Device::Cpu)?.is_empty());
    assert!(d.eval_batches(0, &Device::Cpu).is_err());
    Ok(())
}
