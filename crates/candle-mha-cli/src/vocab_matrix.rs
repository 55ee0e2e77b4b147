//! `mha vocab-matrix`: which token attends to which, aggregated over a corpus.

use std::path::PathBuf;

use anyhow::{Context, Result};
use candle_mha::candle::DType;
use candle_mha::io::human_size;
use candle_mha_viz::html::{vocab_matrix_html, VocabHtmlOptions};
use candle_mha_viz::{corpus_vocab_matrix, MAX_DENSE_VOCAB};

use candle_mha_train::data::RunSplit;

/// Arguments of `mha vocab-matrix`.
#[derive(clap::Args, Debug)]
pub struct VocabMatrixArgs {
    #[command(flatten)]
    pub corpus: super::checkpoint_dir::CorpusArgs,
    /// The layer (0-based; default: the last).
    #[arg(long)]
    pub layer: Option<usize>,
    /// One head (0-based; default: the mean over heads).
    #[arg(long)]
    pub head: Option<usize>,
    /// Keys listed per query token in the report.
    #[arg(long, default_value_t = 3, value_parser = super::bounds::count(1, super::bounds::MAX_COUNT))]
    pub top_k: usize,
    /// Where to write vocab_matrix.csv and vocab_matrix.safetensors (default CHECKPOINT/vocab_matrix).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also write the matrix as one interactive HTML page (sortable, filterable; works
    /// offline) to this file.
    #[arg(long, value_name = "PATH")]
    pub html: Option<PathBuf>,
    /// Skip `vocab_matrix.safetensors` (sum, count, mean and row share as V × V f64 matrices:
    /// 4·8·V² bytes, 537 MB at V = 4096; above 8192 ids the nonzero cells as vectors); the
    /// CSV (and the HTML page) hold the nonzero cells only.
    #[arg(long)]
    pub no_safetensors: bool,
}

/// Runs `mha vocab-matrix`.
pub fn run(args: &VocabMatrixArgs) -> Result<()> {
    let run = args.corpus.open(DType::F32, RunSplit::Train)?;
    let (ckpt, name) = (&run.ckpt, &run.name);
    let layer = args.layer.unwrap_or(ckpt.model.config().num_layers - 1);
    let sequences = std::cell::Cell::new(0usize);
    let examples = run
        .corpus
        .examples(run.len)?
        .inspect(|_| sequences.set(sequences.get() + 1));
    let batches = candle_mha_train::data::batches(examples, args.corpus.batch_size, &run.device)?
        .map(|b| b.map(|b| (b.input, b.key_padding_mask)));
    let vm = corpus_vocab_matrix(
        ckpt.model.config().vocab_size,
        batches,
        layer,
        args.head,
        |ids, kpm| Ok(ckpt.model.forward_with_attention(ids, Some(kpm))?.1),
    )?;
    let labels: Vec<String> = (0..vm.vocab_size() as u32)
        .map(|i| ckpt.codec.token_label(i))
        .collect();
    let heads = args
        .head
        .map(|h| format!("head {h}"))
        .unwrap_or_else(|| "mean over heads".into());
    println!(
        "vocabulary matrix: layer {layer}, {heads}, over {name} ({} sequences): {} query positions, total mass {:.1}",
        sequences.get(),
        vm.num_queries(),
        vm.total_mass()
    );
    println!(
        "query token -> top {} key tokens (share of the query token's attention)",
        args.top_k
    );
    for (q, keys) in vm.top_k(args.top_k) {
        let row: Vec<String> = keys
            .iter()
            .map(|(k, share)| format!("{} {:.3}", labels[*k as usize], share))
            .collect();
        println!("  {:<10} -> {}", labels[q as usize], row.join(", "));
    }
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| args.corpus.checkpoint.join("vocab_matrix"));
    // The default lies inside the checkpoint, which may come from someone else: never
    // written through a link there.
    candle_mha::io::refuse_link(&out)?;
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    candle_mha::io::write_atomic(&out.join("vocab_matrix.csv"), vm.to_csv(&labels).as_bytes())?;
    if args.no_safetensors {
        eprintln!("wrote {}/vocab_matrix.csv", out.display());
    } else if vm.vocab_size() <= MAX_DENSE_VOCAB {
        vm.save_safetensors(out.join("vocab_matrix.safetensors"))?;
        eprintln!(
            "wrote {}/vocab_matrix.csv and vocab_matrix.safetensors (about {}; --no-safetensors skips it)",
            out.display(),
            human_size(32 * (vm.vocab_size() as u64).pow(2))
        );
    } else {
        // V × V dense would not fit in memory at GPT-2's 50,257 ids (81 GB): the cells only.
        vm.save_sparse_safetensors(out.join("vocab_matrix.safetensors"))?;
        eprintln!(
            "wrote {}/vocab_matrix.csv and vocab_matrix.safetensors ({} nonzero cells as query/key/sum/count/mean/row_share vectors: {} ids are more than the {MAX_DENSE_VOCAB} written dense)",
            out.display(),
            vm.num_cells(),
            vm.vocab_size()
        );
    }
    if let Some(path) = &args.html {
        let opts = VocabHtmlOptions::default()
            .with_title(format!(
                "Vocabulary attention matrix: layer {layer}, {heads}, over {name}"
            ))
            .with_top_k(args.top_k.max(1));
        let page = vocab_matrix_html(&vm, &labels, &opts)?;
        candle_mha::io::write_atomic(path, page.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!(
            "wrote {} ({}; {} tokens, {} cells)",
            path.display(),
            human_size(page.len() as u64),
            vm.vocab_size(),
            vm.num_cells()
        );
    }
    Ok(())
}
