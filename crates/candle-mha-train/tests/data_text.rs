//! Tests of the `data` module's text tokenization: a byte-level BPE trained, used, saved and
//! loaded, and text cut into training windows.

use anyhow::Result;
use candle::Device;
use candle_mha_train::data::{text_dataset, TextTokenizer, BOS_ID, EOS_ID, UNK};

fn err_text<T: std::fmt::Debug>(r: candle::Result<T>) -> String {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.to_string(),
    }
}

const SENTENCES: [&str; 6] = [
    "The quick brown fox jumps over the lazy dog.",
    "Attention is all you need, said the transformer to the recurrent network.",
    "A tokenizer splits text into pieces that a model can read.",
    "Byte pair encoding merges the most frequent pairs of symbols again and again.",
    "The dog sleeps while the fox runs through the forest at night.",
    "Small models learn quickly when the data is simple and repeated.",
];

fn write_corpus(dir: &std::path::Path) -> Result<std::path::PathBuf> {
    let p = dir.join("corpus.txt");
    let mut text = String::new();
    for i in 0..40 {
        text.push_str(SENTENCES[i % SENTENCES.len()]);
        text.push(if i % 3 == 2 { '\n' } else { ' ' });
    }
    std::fs::write(&p, text)?;
    Ok(p)
}

#[test]
fn bpe_train_encode_decode_save_load() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let corpus = write_corpus(dir.path())?;
    let tok = TextTokenizer::train_bpe(&corpus, 400)?;
    assert!(
        tok.vocab_size() > 260 && tok.vocab_size() <= 400,
        "{}",
        tok.vocab_size()
    );
    assert_eq!(tok.pad_id(), 0);
    assert_eq!(tok.bos_id(), Some(2));
    assert_eq!(tok.eos_id(), Some(3));
    assert_eq!(tok.inner().token_to_id(UNK), Some(1));

    let sentence = "The lazy fox reads: attention, again!  Ünïcödé too.";
    let ids = tok.encode(sentence)?;
    assert_eq!(tok.decode(&ids)?, sentence);
    // Merges were learned: a frequent word is fewer tokens than bytes.
    let the = tok.encode("The quick brown fox")?;
    assert!(the.len() < "The quick brown fox".len(), "{the:?}");
    assert!(ids.iter().all(|&i| i > 3), "no special token in plain text");
    // Special ids decode to nothing; unknown ids are errors.
    assert_eq!(
        tok.decode(&[BOS_ID, ids[0], EOS_ID])?,
        tok.decode(&ids[..1])?
    );
    assert!(err_text(tok.decode(&[1_000_000])).contains("1000000"));

    let path = dir.path().join("tokenizer.json");
    tok.save(&path)?;
    let loaded = TextTokenizer::load(&path)?;
    assert_eq!(loaded.encode(sentence)?, ids);
    assert_eq!(loaded.vocab_size(), tok.vocab_size());
    assert_eq!(loaded.decode(&ids)?, sentence);

    assert!(TextTokenizer::train_bpe(&corpus, 100).is_err());
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "")?;
    assert!(err_text(TextTokenizer::train_bpe(&empty, 300)).contains("empty.txt"));
    std::fs::write(dir.path().join("bad.json"), "{not json")?;
    let msg = err_text(TextTokenizer::load(&dir.path().join("bad.json")));
    assert!(msg.contains("bad.json"), "{msg}");
    assert!(err_text(TextTokenizer::load(dir.path())).contains("directory"));
    Ok(())
}

#[test]
fn text_dataset_windows() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let corpus = write_corpus(dir.path())?;
    let tok = TextTokenizer::train_bpe(&corpus, 320)?;
    let stream = tok.encode(&std::fs::read_to_string(&corpus)?)?;
    let window = 16;
    let data = text_dataset(&corpus, &tok, window)?;
    assert!(data.len() > 1);
    assert!(data.max_len() <= window);
    let mut joined = Vec::new();
    for (i, e) in data.examples.iter().enumerate() {
        assert_eq!(e.tokens[0], BOS_ID);
        assert!(e.tokens.len() >= 2 && e.tokens.len() <= window);
        if i + 1 < data.len() {
            assert_eq!(e.tokens.len(), window, "only the last window is short");
        }
        assert_eq!(e.loss_mask.len(), e.tokens.len() - 1);
        assert!(e.loss_mask.iter().all(|&m| m));
        joined.extend_from_slice(&e.tokens[1..]);
    }
    assert_eq!(
        joined, stream,
        "windows are the token stream, in order, without overlap"
    );
    let b = data.batch(4, 0, 0, 9, &Device::Cpu)?;
    assert_eq!(b.input.dims()[1], window - 1);

    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "")?;
    assert!(err_text(text_dataset(&empty, &tok, window)).contains("empty.txt"));
    assert!(text_dataset(&corpus, &tok, 1).is_err());
    Ok(())
}
