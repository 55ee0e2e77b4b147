//! [`checkpoint_corpus`]: the data an evaluation or analysis reads from a checkpoint's run: a
//! file given for it, or the run's own split rebuilt from its recorded [`DataSpec`].

use std::path::Path;

use candle::Result;

use super::run_data_spec;
use crate::data::{open_prepared, Codec, Corpus, DataSource, DataSpec, RunSplit};

/// The data an analysis or evaluation command reads: `source` when given (encoded with, or
/// checked against, the checkpoint's `codec`; text: one file), else the run's own `split`
/// rebuilt from `trainer_state.json`. Returns a description for messages and the corpus.
pub fn checkpoint_corpus(
    checkpoint: &Path,
    source: Option<&DataSource>,
    codec: &Codec,
    max_tokens: usize,
    split: RunSplit,
) -> Result<(String, Corpus)> {
    if let Some(DataSource::Tokens(p)) = source {
        let spec = DataSpec::Tokens {
            path: p.to_path_buf(),
            val_fraction: 0.0,
            seed: 0,
        };
        let Some(d) = spec
            .load(Some(codec.clone()), None, 0, Some(max_tokens))?
            .train
            .into_sequences()
        else {
            unreachable!("token files load as sequences")
        };
        return Ok((p.display().to_string(), Corpus::Sequences(d)));
    }
    if let Some(DataSource::Text(files)) = source {
        let [p] = &files[..] else {
            candle::bail!(
                "--text: {} files; an evaluation reads one text file",
                files.len()
            )
        };
        let Codec::Text(tok) = codec else {
            candle::bail!(
                "this checkpoint uses a symbol vocabulary: give it a token file, not text"
            )
        };
        return Ok((
            p.display().to_string(),
            Corpus::Text {
                path: p.to_path_buf(),
                tok: tok.clone(),
            },
        ));
    }
    if let Some(DataSource::Prepared(dir)) = source {
        let (d, _) = open_prepared(dir, Some(codec), "the checkpoint's tokenizer")?;
        let range = match split {
            RunSplit::Train => d.meta().train_range(),
            RunSplit::Val => d.meta().val_range(),
        };
        let name = format!(
            "{} ({} part, {} tokens)",
            dir.display(),
            if split == RunSplit::Train {
                "training"
            } else {
                "validation"
            },
            range.end - range.start
        );
        return Ok((
            name,
            Corpus::Prepared {
                data: Box::new(d),
                range,
            },
        ));
    }
    let spec = run_data_spec(checkpoint).map_err(|e| {
        candle::Error::Msg(format!(
            "the checkpoint's own data cannot be rebuilt (give a token file, a text or a data directory): {e}"
        ))
    })?;
    if let (
        DataSpec::Prepared {
            dir, train_tokens, ..
        },
        RunSplit::Train,
    ) = (&spec, split)
    {
        let (d, _) = open_prepared(dir, Some(codec), "the checkpoint's tokenizer")?;
        spec.check_prepared(&d)?;
        return Ok((
            "the run's training tokens".to_string(),
            Corpus::Prepared {
                data: Box::new(d),
                range: 0..*train_tokens,
            },
        ));
    }
    let data = spec.load(Some(codec.clone()), None, 0, Some(max_tokens))?;
    Ok(match split {
        RunSplit::Train => match data.train.into_sequences() {
            Some(d) => ("the run's training set".to_string(), Corpus::Sequences(d)),
            None => unreachable!("streams are handled above"),
        },
        RunSplit::Val => (
            "the run's validation set".to_string(),
            Corpus::Sequences(data.val),
        ),
    })
}
