//! What a `tokenizer.json` is checked for before the `tokenizers` crate builds it: the crate
//! panics on some inconsistent files (a merge whose result is not in the vocabulary) and
//! sizes its tables by the largest id.

use std::collections::{HashMap, HashSet};

use candle::Result;
use serde::Deserialize;

use super::text::MAX_BPE_VOCAB;

/// The largest `tokenizer.json` read: the largest in common use (Gemma's) is about 34 MB, and
/// the `tokenizers` crate takes about 30 times a file's size to build it (about 2 GB here).
pub const MAX_TOKENIZER_BYTES: u64 = 64 << 20;

#[derive(Deserialize)]
struct File {
    model: Model,
    #[serde(default)]
    added_tokens: Vec<Added>,
}

#[derive(Deserialize)]
struct Model {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    vocab: Option<VocabPart>,
    #[serde(default)]
    merges: Vec<Merge>,
    #[serde(default)]
    continuing_subword_prefix: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum VocabPart {
    /// BPE, WordLevel, WordPiece: token → id.
    Map(HashMap<String, serde_json::Value>),
    /// Unigram's `[token, score]` list (ids are its order), or anything else.
    Other(serde::de::IgnoredAny),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Merge {
    /// `"a b"` (the older form).
    Line(String),
    /// `["a", "b"]`.
    Pair(String, String),
}

#[derive(Deserialize)]
struct Added {
    id: serde_json::Value,
    content: String,
}

/// Checks the text of a `tokenizer.json` (`source` names it in errors): every id a whole
/// number below [`MAX_BPE_VOCAB`] and no id given to two tokens of the vocabulary; for BPE,
/// both parts of every merge and the token it makes in the vocabulary. A file these checks
/// cannot read is left to the `tokenizers` crate's own errors.
pub(crate) fn check_tokenizer_json(text: &str, source: &str) -> Result<()> {
    let Ok(file) = serde_json::from_str::<File>(text) else {
        return Ok(());
    };
    let id_of = |token: &str, id: &serde_json::Value| -> Result<u32> {
        match id.as_u64() {
            Some(i) if i < MAX_BPE_VOCAB as u64 => Ok(i as u32),
            _ => candle::bail!(
                "{source}: token {} has id {id}; expected ids below {MAX_BPE_VOCAB} (whole numbers)",
                shown(token)
            ),
        }
    };
    let mut vocab: HashMap<&str, u32> = HashMap::new();
    if let Some(VocabPart::Map(map)) = &file.model.vocab {
        let mut owner: HashMap<u32, &str> = HashMap::with_capacity(map.len());
        for (token, id) in map {
            let id = id_of(token, id)?;
            if let Some(other) = owner.insert(id, token) {
                candle::bail!(
                    "{source}: id {id} is given to two tokens, {} and {}; expected one id a token",
                    shown(other.min(token)),
                    shown(other.max(token))
                )
            }
            vocab.insert(token, id);
        }
    }
    for added in &file.added_tokens {
        let id = id_of(&added.content, &added.id)?;
        if let Some(&v) = vocab.get(added.content.as_str()) {
            if v != id {
                candle::bail!(
                    "{source}: added token {} has id {id}, the vocabulary gives it {v}",
                    shown(&added.content)
                )
            }
        }
    }
    if file.model.kind.as_deref() == Some("BPE") {
        let prefix = file
            .model
            .continuing_subword_prefix
            .as_deref()
            .unwrap_or("");
        let known: HashSet<&str> = vocab.keys().copied().collect();
        for (i, merge) in file.model.merges.iter().enumerate() {
            let (a, b) = match merge {
                Merge::Pair(a, b) => (a.as_str(), b.as_str()),
                Merge::Line(line) => match line.split_once(' ') {
                    Some(pair) => pair,
                    None => candle::bail!(
                        "{source}: merge {i} is {}; expected two tokens separated by a space",
                        shown(line)
                    ),
                },
            };
            // As the `tokenizers` crate forms the merged token.
            let made = format!("{a}{}", b.strip_prefix(prefix).unwrap_or(b));
            for (what, token) in [
                ("its first part", a),
                ("its second part", b),
                ("the token it makes", &made),
            ] {
                if !known.contains(token) {
                    candle::bail!(
                        "{source}: merge {i} ({} + {}): {what}, {}, is not in the vocabulary; expected merges of tokens the vocabulary has",
                        shown(a),
                        shown(b),
                        shown(token)
                    )
                }
            }
        }
    }
    Ok(())
}

/// A token for a message: quoted, escaped, long ones cut.
fn shown(token: &str) -> String {
    candle_mha::io::quoted(token, 40)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bpe(vocab: &str, merges: &str) -> String {
        format!(
            r#"{{"added_tokens": [], "model": {{"type": "BPE", "vocab": {vocab}, "merges": {merges}}}}}"#
        )
    }

    #[test]
    fn a_merge_outside_the_vocabulary_is_refused_by_name() {
        let e = check_tokenizer_json(&bpe(r#"{"a":0,"b":1,"c":2}"#, r#"[["a","b"]]"#), "t.json")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("merge 0") && e.contains("\"ab\"") && e.contains("the token it makes"),
            "{e}"
        );
        let e = check_tokenizer_json(&bpe(r#"{"a":0,"b":1,"ab":2}"#, r#"["a x"]"#), "t.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("its second part, \"x\""), "{e}");
        check_tokenizer_json(
            &bpe(r#"{"a":0,"b":1,"ab":2}"#, r#"[["a","b"], "a b"]"#),
            "t",
        )
        .unwrap();
    }

    /// A `tokenizer.json` past the bound is refused by its size, before it is read (the
    /// `tokenizers` crate takes about 30 times a file's size).
    #[test]
    fn a_tokenizer_larger_than_the_bound_is_not_read() -> candle::Result<()> {
        let tmp = tempfile::tempdir()?;
        let path = tmp.path().join("tokenizer.json");
        std::fs::File::create(&path)?.set_len(MAX_TOKENIZER_BYTES + 1)?; // sparse
        let e = crate::data::TextTokenizer::load(&path)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("more than the {MAX_TOKENIZER_BYTES} bytes")),
            "{e}"
        );
        Ok(())
    }

    #[test]
    fn repeated_or_out_of_range_ids_are_refused() {
        let e = check_tokenizer_json(&bpe(r#"{"a":0,"b":0}"#, "[]"), "t")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("id 0 is given to two tokens, \"a\" and \"b\""),
            "{e}"
        );
        for id in ["-1", "1.5", "\"3\"", "4294967296"] {
            let e = check_tokenizer_json(&bpe(&format!(r#"{{"a":{id}}}"#), "[]"), "t")
                .unwrap_err()
                .to_string();
            assert!(e.contains("expected ids below"), "{id}: {e}");
        }
    }
}
