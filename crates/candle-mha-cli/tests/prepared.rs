//! Prepared token data (`mha prepare`'s format), random training windows and fixed
//! validation windows, and streaming text windows.

mod common;

use std::collections::HashSet;
use std::path::PathBuf;

use anyhow::Result;
use candle_mha_train::data::{
    consecutive_windows, expand_sources, prepare_text, prepare_token_files, Codec, PrepareOptions,
    TextTokenizer, TextWindows, TokenData, TokenDtype, TokenWindows, BOS_ID, EOS_ID, TOKENS_FILE,
};
use common::{mha, run_mha};

fn err<T>(r: candle_mha::candle::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

/// English text no one here wrote: the GPL v3 (verbatim copying is permitted).
fn english() -> PathBuf {
    common::fixtures_dir().join("text/gpl-3.0.txt")
}

fn opts(chunk_bytes: usize) -> PrepareOptions {
    PrepareOptions {
        val_fraction: 0.1,
        chunk_bytes,
        bpe: None,
    }
}

#[test]
fn text_prepared_in_small_pieces_equals_the_whole_file_encoded() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let tok = TextTokenizer::train_bpe(&english(), 400)?;
    let text = std::fs::read_to_string(english())?;
    // 500-byte pieces: the 35 KB file is cut about 70 times.
    let mut calls = 0;
    let meta = prepare_text(
        &[english()],
        &tok,
        &dir.path().join("d"),
        &opts(500),
        &mut |_| calls += 1,
    )?;
    assert!(calls > 10, "progress was reported {calls} times");
    let data = TokenData::open(&dir.path().join("d"))?;
    let mut want = vec![tok.bos_id().unwrap()];
    want.extend(tok.encode(&text)?);
    want.push(tok.eos_id().unwrap());
    assert_eq!(data.tokens(0..data.len())?, want);
    assert_eq!(meta.dtype, TokenDtype::U16);
    assert_eq!(meta.num_tokens, want.len() as u64);
    assert_eq!(meta.source_bytes, text.len() as u64);
    assert_eq!(
        meta.train_tokens,
        want.len() as u64 - (want.len() as f64 * 0.1).round() as u64
    );
    // tokens.bin is little-endian u16, 2 bytes per id.
    let raw = std::fs::read(dir.path().join("d").join(TOKENS_FILE))?;
    assert_eq!(raw.len(), 2 * want.len());
    assert_eq!(u16::from_le_bytes([raw[2], raw[3]]) as u32, want[1]);
    // The source's hash is SHA-256 of its bytes (a known value for the empty string checks
    // the helper itself).
    assert_eq!(
        candle_mha_train::checksum::sha256_hex(b""),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    assert_eq!(
        meta.sources[0].sha256,
        candle_mha_train::checksum::sha256_hex(text.as_bytes())
    );
    // The codec is stored beside the data and matches; another tokenizer does not.
    assert_eq!(data.codec()?.vocab_size(), tok.vocab_size());
    let other = Codec::Text(Box::new(TextTokenizer::train_bpe(&english(), 300)?));
    let e = err(data.check_codec(&other, "--tokenizer"));
    assert!(e.contains("--tokenizer does not match the data"), "{e}");
    // A second prepare into the same directory is refused.
    let e = err(prepare_text(
        &[english()],
        &tok,
        &dir.path().join("d"),
        &opts(500),
        &mut |_| {},
    ));
    assert!(e.contains("already holds prepared data"), "{e}");
    Ok(())
}

#[test]
fn token_files_round_trip_in_u16_and_u32() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let small = dir.path().join("small.txt");
    std::fs::write(&small, "# comment\na b c\n\nb d\n")?;
    prepare_token_files(&[small], &dir.path().join("s"), &opts(1 << 20))?;
    let data = TokenData::open(&dir.path().join("s"))?;
    assert_eq!(data.meta().dtype, TokenDtype::U16);
    // Specials take ids 0..4; then a=4, b=5, c=6, d=7 in first-seen order.
    assert_eq!(
        data.tokens(0..data.len())?,
        vec![BOS_ID, 4, 5, 6, EOS_ID, BOS_ID, 5, 7, EOS_ID]
    );

    // 70,000 distinct symbols do not fit u16 ids.
    let big = dir.path().join("big.txt");
    let line: Vec<String> = (0..70_000).map(|i| format!("s{i}")).collect();
    std::fs::write(&big, format!("{}\ns69999 s0\n", line.join(" ")))?;
    let meta = prepare_token_files(&[big], &dir.path().join("b"), &opts(1 << 20))?;
    assert_eq!(meta.dtype, TokenDtype::U32);
    assert_eq!(meta.vocab_size, 70_004);
    let data = TokenData::open(&dir.path().join("b"))?;
    assert_eq!(data.len(), 70_002 + 4);
    let raw = std::fs::read(dir.path().join("b").join(TOKENS_FILE))?;
    assert_eq!(raw.len() as u64, 4 * data.len());
    assert_eq!(
        data.tokens(70_002..data.len())?,
        vec![BOS_ID, 70_003, 4, EOS_ID]
    );
    Ok(())
}

#[test]
fn bad_sources_and_damaged_data_are_errors_naming_the_file() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let tok = TextTokenizer::train_bpe(&english(), 300)?;
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "")?;
    let e = err(prepare_text(
        &[empty],
        &tok,
        &dir.path().join("x"),
        &opts(64),
        &mut |_| {},
    ));
    assert!(e.contains("empty.txt is empty"), "{e}");
    let latin1 = dir.path().join("latin1.txt");
    std::fs::write(&latin1, b"line one\nline two caf\xe9\n")?;
    let e = err(prepare_text(
        &[latin1],
        &tok,
        &dir.path().join("y"),
        &opts(64),
        &mut |_| {},
    ));
    assert!(e.contains("latin1.txt:2: invalid UTF-8 at byte 21"), "{e}");
    assert!(!dir.path().join("y").join("meta.json").exists());
    let e = err(expand_sources(&[dir.path().join("nope/*.txt")]));
    assert!(e.contains("matches no file"), "{e}");

    // Damaged data directories.
    let e = err(TokenData::open(&dir.path().join("missing")));
    assert!(e.contains("missing: not found"), "{e}");
    let good = dir.path().join("good");
    prepare_text(&[english()], &tok, &good, &opts(1 << 20), &mut |_| {})?;
    let bin = good.join(TOKENS_FILE);
    let bytes = std::fs::read(&bin)?;
    std::fs::write(&bin, &bytes[..bytes.len() - 2])?;
    let e = err(TokenData::open(&good));
    assert!(
        e.contains("the file is truncated or not this data's"),
        "{e}"
    );
    std::fs::write(&bin, &bytes)?;
    TokenData::open(&good)?;
    std::fs::write(good.join("meta.json"), "{\"format\": 3}")?;
    let e = err(TokenData::open(&good));
    assert!(
        e.contains("meta.json: not a prepared-data description"),
        "{e}"
    );
    Ok(())
}

#[test]
fn sources_expand_directories_and_patterns_in_order() -> Result<()> {
    let dir = tempfile::tempdir()?;
    for name in ["b.txt", "a.txt", "sub/c.txt", ".hidden.txt", "d.md"] {
        let p = dir.path().join(name);
        std::fs::create_dir_all(p.parent().unwrap())?;
        std::fs::write(p, "x")?;
    }
    let names = |v: Vec<PathBuf>| -> Vec<String> {
        v.iter()
            .map(|p| p.strip_prefix(dir.path()).unwrap().display().to_string())
            .collect()
    };
    assert_eq!(
        names(expand_sources(&[dir.path().to_path_buf()])?),
        ["a.txt", "b.txt", "d.md", "sub/c.txt"]
    );
    let pattern = PathBuf::from(format!("{}/*.txt", dir.path().display()));
    assert_eq!(
        names(expand_sources(&[pattern, dir.path().join("a.txt")])?),
        ["a.txt", "b.txt"]
    );
    Ok(())
}

#[test]
fn training_windows_are_seeded_reachable_and_inside_the_training_part() -> Result<()> {
    // 50 training tokens, windows of 8: offsets 0..=42.
    let w = TokenWindows::new(8, 0..50, 50..70)?;
    assert_eq!(w.num_train_offsets(), 43);
    assert_eq!(w.train_offsets(7, 3, 16), w.train_offsets(7, 3, 16));
    assert_ne!(w.train_offsets(7, 3, 16), w.train_offsets(7, 4, 16));
    assert_ne!(w.train_offsets(7, 3, 16), w.train_offsets(8, 3, 16));
    let mut seen = HashSet::new();
    for step in 0..200 {
        for o in w.train_offsets(0, step, 16) {
            assert!(o + 8 <= 50, "window at {o} reaches past the training part");
            seen.insert(o);
        }
    }
    assert_eq!(seen.len(), 43, "every offset is drawn");

    // Validation windows lie in the tail and predict each of its tokens after the first once.
    let ranges = w.val_ranges(usize::MAX);
    assert_eq!(ranges, vec![50..58, 57..65, 64..70]);
    assert!(ranges.iter().all(|r| r.start >= 50));
    let mut predicted: Vec<u64> = ranges.iter().flat_map(|r| r.start + 1..r.end).collect();
    predicted.sort();
    assert_eq!(predicted, (51..70).collect::<Vec<_>>());
    // Capped: evenly spaced windows of the full list.
    assert_eq!(w.val_ranges(2), vec![50..58, 57..65]);
    assert_eq!(consecutive_windows(0..2, 8, 10), vec![0..2]);
    assert!(consecutive_windows(0..1, 8, 10).is_empty());

    let e = err(TokenWindows::new(8, 0..5, 5..9));
    assert!(
        e.contains("the training part has 5 tokens, fewer than one window of 8"),
        "{e}"
    );
    Ok(())
}

#[test]
fn text_windows_stream_the_prepared_tokens() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let tok = TextTokenizer::train_bpe(&english(), 300)?;
    prepare_text(
        &[english()],
        &tok,
        &dir.path().join("d"),
        &opts(1 << 20),
        &mut |_| {},
    )?;
    let data = TokenData::open(&dir.path().join("d"))?;
    let all = data.tokens(0..data.len())?;
    let windows: Vec<Vec<u32>> = TextWindows::open(&english(), &tok, 65)?
        .map(|e| e.map(|e| e.tokens))
        .collect::<candle_mha::candle::Result<_>>()?;
    let want: Vec<Vec<u32>> = consecutive_windows(0..all.len() as u64, 65, usize::MAX)
        .into_iter()
        .map(|r| all[r.start as usize..r.end as usize].to_vec())
        .collect();
    assert_eq!(windows, want);
    Ok(())
}

/// Token data is checked where it is made and where it is opened: `meta.json` records the
/// largest id and `tokens.bin`'s SHA-256; opening names the offset of an id outside the
/// vocabulary (or above the largest prepared); `verify` finds a flipped bit that keeps ids in
/// range, as do `mha info DIR` and `mha train --verify`.
#[test]
fn ids_and_hashes_are_checked_where_data_is_made_and_opened() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let tok = TextTokenizer::train_bpe(&english(), 300)?;
    let meta = prepare_text(&[english()], &tok, &dir, &opts(4096), &mut |_| {})?;
    let vocab = meta.vocab_size as u32;
    let max = meta.max_id.expect("the largest id is recorded");
    assert!(max < vocab);
    assert!(meta.tokens_sha256.as_ref().is_some_and(|h| h.len() == 64));
    assert!(TokenData::open(&dir)?.verify()?);
    let path = dir.join(TOKENS_FILE);
    let pristine = std::fs::read(&path)?;
    let width = meta.dtype.width();
    let set_id = |i: usize, id: u32| -> Result<()> {
        let mut bytes = pristine.clone();
        match meta.dtype {
            TokenDtype::U16 => bytes[i * 2..i * 2 + 2].copy_from_slice(&(id as u16).to_le_bytes()),
            TokenDtype::U32 => bytes[i * 4..i * 4 + 4].copy_from_slice(&id.to_le_bytes()),
        }
        Ok(std::fs::write(&path, bytes)?)
    };
    // An id outside the vocabulary, deep in the file: named with its offset when opened.
    let at = meta.num_tokens as usize - 7;
    set_id(at, vocab + 5)?;
    let e = err(TokenData::open(&dir));
    assert!(
        e.contains(&format!(
            "id {} at offset {at} (byte {})",
            vocab + 5,
            at * width
        )) && e.contains("outside the vocabulary"),
        "{e}"
    );
    let (ok, _, stderr) = run_mha!(
        "train --data {} --out {} --steps 2",
        dir.to_str().unwrap(),
        tmp.path().join("r").to_str().unwrap()
    )?;
    assert!(!ok && stderr.contains("outside the vocabulary"), "{stderr}");
    // An id in range but another than prepared (a flipped bit): the hash finds it.
    let other = (0..vocab)
        .find(|&id| id != u32::from(pristine[3 * width]))
        .unwrap()
        % (max + 1);
    set_id(3, other)?;
    let data = TokenData::open(&dir)?;
    let e = err(data.verify());
    assert!(e.contains("changed after it was prepared"), "{e}");
    let (ok, _, stderr) = mha(&["info", dir.to_str().unwrap()])?;
    assert!(
        !ok && stderr.contains("changed after it was prepared"),
        "{stderr}"
    );
    let (ok, _, stderr) = run_mha!(
        "train --data {} --out {} --steps 2 --verify",
        dir.to_str().unwrap(),
        tmp.path().join("r2").to_str().unwrap()
    )?;
    assert!(
        !ok && stderr.contains("changed after it was prepared"),
        "{stderr}"
    );
    std::fs::write(&path, &pristine)?;
    let (ok, stdout, stderr) = mha(&["info", dir.to_str().unwrap()])?;
    assert!(ok && stdout.contains("SHA-256 matches"), "{stdout}{stderr}");
    Ok(())
}

/// `mha prepare` never overwrites files it did not write, cleans up what a killed preparation
/// left (its temporary token file included), and says when the BPE has fewer ids than asked.
#[test]
fn prepare_keeps_foreign_files_and_cleans_its_own() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("d");
    std::fs::create_dir(&dir)?;
    std::fs::write(dir.join(TOKENS_FILE), b"a user's own file")?;
    let (d, t) = (dir.to_str().unwrap(), english());
    let (ok, _, err) = run_mha!("prepare --text {} --out {} --quiet", t.to_str().unwrap(), d)?;
    assert!(!ok && err.contains("that preparing did not write"), "{err}");
    assert_eq!(std::fs::read(dir.join(TOKENS_FILE))?, b"a user's own file");
    // What a killed preparation left: its marker, a token file and a temporary file of a
    // process that is gone.
    std::fs::write(dir.join(".preparing"), "pid 999999999\n")?;
    std::fs::write(dir.join(".tokens.bin.tmp-999999999"), b"partial")?;
    let (ok, _, err) = run_mha!(
        "prepare --text {} --out {} --vocab-size 70000 --quiet",
        t.to_str().unwrap(),
        d
    )?;
    assert!(ok, "{err}");
    assert!(err.contains("fewer than the 70000 asked"), "{err}");
    let left: Vec<String> = std::fs::read_dir(&dir)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.') && n != ".lock")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(TokenData::open(&dir)?.verify()?);
    Ok(())
}
