//! `mha inspect`: a trained model's attention on one input, as labelled tables, heatmaps
//! (PNG/SVG), graphs (DOT/GraphML) and an interactive page (HTML) of every layer and head.

use std::path::PathBuf;

use anyhow::{bail, Result};
use candle_mha::candle::{DType, Tensor};
use candle_mha::io::human_size;
use candle_mha::io::write_atomic;
use candle_mha_train::data::{Codec, TextWindows};
use candle_mha_viz::html::{attention_explorer, ExplorerOptions};
use candle_mha_viz::{
    attention_rollout, format_table, fuse_heads, head_stats, heatmap, AttentionGraph, GraphOptions,
    HeatmapOptions, TableOptions, ATTENTION_FLOW_MAX_LEN,
};

use super::choices::Fusion;

/// Arguments of `mha inspect`.
#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// A checkpoint directory written by `mha train`.
    #[arg(long)]
    pub checkpoint: PathBuf,
    #[command(flatten)]
    pub read: super::checkpoint_dir::ReadOptions,
    /// The input: symbols separated by spaces (token models) or text (text models).
    #[arg(
        long,
        required_unless_present = "input_file",
        conflicts_with = "input_file"
    )]
    pub input: Option<String>,
    /// Read the input from a text file instead: its first context-length tokens (read and
    /// encoded piece by piece, so the file may be of any size). Text models only.
    #[arg(long)]
    pub input_file: Option<PathBuf>,
    /// The layer to show (0-based; default: the last).
    #[arg(long)]
    pub layer: Option<usize>,
    /// One head (0-based) instead of all heads fused.
    #[arg(long)]
    pub head: Option<usize>,
    /// How heads are fused when --head is not given.
    #[arg(long, value_enum, default_value_t = Fusion::Mean)]
    pub fusion: Fusion,
    /// Also print every head's table.
    #[arg(long)]
    pub all_heads: bool,
    /// Print the attention rollout over all layers (Abnar & Zuidema 2020).
    #[arg(long)]
    pub rollout: bool,
    /// Write a heatmap PNG (one panel per head with --all-heads).
    #[arg(long)]
    pub png: Option<PathBuf>,
    /// Write a heatmap SVG (one panel per head with --all-heads).
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Write the attention graph as DOT (edge i -> j: weight of query i on key j).
    #[arg(long)]
    pub dot: Option<PathBuf>,
    /// Write the attention graph as GraphML.
    #[arg(long)]
    pub graphml: Option<PathBuf>,
    /// Write an interactive page (one self-contained HTML file, works offline) of every layer
    /// and head: head view, model view, matrix view with the rollout and flow.
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// Graph: drop edges below this weight (0 to 1).
    #[arg(long, default_value_t = 0.0, value_parser = super::bounds::real(0.0, 1.0))]
    pub threshold: f64,
    /// Graph: keep each query's k strongest edges.
    #[arg(long, value_parser = super::bounds::count(1, super::bounds::MAX_COUNT))]
    pub top_k: Option<usize>,
    /// Decimals in the tables (0 to 12).
    #[arg(long, default_value_t = 3, value_parser = super::bounds::count(0, 12))]
    pub decimals: usize,
    /// Colour the tables (ANSI).
    #[arg(long)]
    pub color: bool,
    /// Where to run.
    #[arg(long, default_value = "auto", value_parser = super::choices::DeviceParser)]
    pub device: String,
}

/// Runs `mha inspect`.
pub fn run(args: &InspectArgs) -> Result<()> {
    let (device, notice) = crate::device::open(&args.device)?;
    eprintln!("{notice}");
    let ckpt = super::checkpoint_dir::open(&args.checkpoint, &args.read, DType::F32, &device, 1)?;
    let (fusion, rollout_fusion) = args.fusion.head_and_rollout();
    let max_len = ckpt.model.config().max_len;
    let ids = match (&args.input, &args.input_file, &ckpt.codec) {
        (Some(input), _, codec) => codec.encode_prompt(input)?,
        (None, Some(path), Codec::Text(tok)) => match TextWindows::open(path, tok, max_len)?.next()
        {
            Some(window) => window?.tokens,
            None => bail!("--input-file {}: fewer than 2 tokens", path.display()),
        },
        (None, Some(_), Codec::Symbols(_)) => {
            bail!("--input-file reads text; this checkpoint uses a symbol vocabulary: pass --input")
        }
        (None, None, _) => bail!("give --input or --input-file"),
    };
    if let Some(skipped) = ckpt.codec.unknown_skipped() {
        eprintln!("warning: left out of the input {}", skipped.describe());
    }
    if ids.len() > max_len {
        bail!(
            "the input has {} tokens; the model's context is {max_len}",
            ids.len()
        )
    }
    let labels: Vec<String> = ids.iter().map(|&i| ckpt.codec.token_label(i)).collect();
    let tokens = Tensor::new(ids.as_slice(), &device)?.unsqueeze(0)?;
    let (_, layers) = ckpt.model.forward_with_attention(&tokens, None)?;
    let layers: Vec<Tensor> = layers
        .iter()
        .map(|w| w.get(0))
        .collect::<candle_mha::candle::Result<_>>()?; // (H, L, L)
    let n_layers = layers.len();
    let layer = args.layer.unwrap_or(n_layers - 1);
    if layer >= n_layers {
        bail!(
            "--layer {layer}: the model has {n_layers} layers (0..{})",
            n_layers - 1
        )
    }
    let heads = &layers[layer];
    let h = heads.dim(0)?;
    if let Some(head) = args.head {
        if head >= h {
            bail!("--head {head}: the model has {h} heads (0..{})", h - 1)
        }
    }
    let (matrix, what) = match args.head {
        Some(head) => (heads.get(head)?, format!("layer {layer}, head {head}")),
        None => (
            fuse_heads(heads, fusion)?,
            format!("layer {layer}, {} over {h} heads", args.fusion),
        ),
    };
    let table = |m: &Tensor, title: String| -> Result<String> {
        let opts = TableOptions {
            decimals: args.decimals,
            color: args.color,
            title: Some(title),
        };
        Ok(format_table(m, &labels, &labels, &opts)?)
    };
    println!(
        "{}",
        table(
            &matrix,
            format!("attention, {what} (row = query, column = key)")
        )?
    );
    println!("head   mean entropy   mean max weight");
    for s in head_stats(heads)? {
        println!(
            "{:>4}   {:>12.4}   {:>15.4}",
            s.head, s.mean_entropy, s.mean_max_weight
        );
    }
    if args.all_heads {
        for head in 0..h {
            println!(
                "\n{}",
                table(&heads.get(head)?, format!("layer {layer}, head {head}"))?
            );
        }
    }
    if args.rollout {
        let r = attention_rollout(&layers, rollout_fusion, true, 0.0)?;
        println!(
            "\n{}",
            table(
                &r,
                format!(
                    "attention rollout over {n_layers} layers (residual, {})",
                    args.fusion
                )
            )?
        );
    }

    // The grid shows every head, not the fused matrix the tables start with.
    let hopts = HeatmapOptions {
        title: Some(match args.all_heads {
            true => format!("layer {layer}, {h} heads"),
            false => what.clone(),
        }),
        ..HeatmapOptions::default()
    };
    let panels: Vec<Tensor> = (0..h)
        .map(|i| heads.get(i))
        .collect::<candle_mha::candle::Result<_>>()?;
    let titles: Vec<String> = (0..h).map(|i| format!("head {i}")).collect();
    if let Some(p) = &args.png {
        let bytes = match args.all_heads {
            true => heatmap::heatmap_grid_png(&panels, &titles, &labels, &labels, &hopts)?,
            false => heatmap::heatmap_png(&matrix, &labels, &labels, &hopts)?,
        };
        write_atomic(p, &bytes)?;
        eprintln!("wrote {}", p.display());
    }
    if let Some(p) = &args.svg {
        let svg = match args.all_heads {
            true => heatmap::heatmap_grid_svg(&panels, &titles, &labels, &labels, &hopts)?,
            false => heatmap::heatmap_svg(&matrix, &labels, &labels, &hopts)?,
        };
        write_atomic(p, svg.as_bytes())?;
        eprintln!("wrote {}", p.display());
    }
    if args.dot.is_some() || args.graphml.is_some() {
        // Positions make node names unique when a token repeats.
        let nodes: Vec<String> = labels
            .iter()
            .enumerate()
            .map(|(i, l)| format!("{i}:{l}"))
            .collect();
        let gopts = GraphOptions {
            threshold: args.threshold,
            top_k: args.top_k,
            ..GraphOptions::default()
        };
        let graph = AttentionGraph::from_matrix(&matrix, &nodes, &nodes, &gopts)?;
        if let Some(p) = &args.dot {
            write_atomic(p, graph.to_dot().as_bytes())?;
            eprintln!("wrote {} ({} edges)", p.display(), graph.edges.len());
        }
        if let Some(p) = &args.graphml {
            write_atomic(p, graph.to_graphml().as_bytes())?;
            eprintln!("wrote {} ({} edges)", p.display(), graph.edges.len());
        }
    }
    if let Some(p) = &args.html {
        let all = Tensor::stack(&layers, 0)?; // (layers, H, L, L)
        let input = match &args.input {
            Some(text) => format!("\"{}\"", shorten(text, 60)),
            None => args
                .input_file
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
        };
        let ckpt_name = args.checkpoint.file_name().map_or_else(
            || args.checkpoint.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        let opts =
            ExplorerOptions::default().with_title(format!("{ckpt_name}: attention on {input}"));
        let page = attention_explorer(&all, &labels, &labels, &opts)?;
        write_atomic(p, page.as_bytes())?;
        eprintln!(
            "wrote {} ({}; {n_layers} layers × {h} heads × {} tokens)",
            p.display(),
            human_size(page.len() as u64),
            labels.len()
        );
        if labels.len() > ATTENTION_FLOW_MAX_LEN {
            eprintln!(
                "note: the page has the rollout but not the attention flow ({} tokens; flow \
                 takes at most {ATTENTION_FLOW_MAX_LEN})",
                labels.len()
            );
        }
    }
    Ok(())
}

/// `text` cut to `max` characters, with an ellipsis when cut.
fn shorten(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}
