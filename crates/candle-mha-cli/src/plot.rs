//! `mha plot`: the loss curves of one or more training runs, from their `metrics.jsonl`, as a
//! PNG and/or SVG line chart.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_mha_train::run_dir::METRICS_FILE;
use candle_mha_train::{read_metrics, MetricsRecord};
use candle_mha_viz::heatmap::save;
use candle_mha_viz::{LinePlot, Series, PALETTE};

/// Arguments of `mha plot`.
#[derive(clap::Args, Debug)]
pub struct PlotArgs {
    /// Run directories written by `mha train` (each holding a metrics.jsonl); several are
    /// overlaid in one chart.
    #[arg(required = true, value_name = "RUN_DIR")]
    pub runs: Vec<PathBuf>,
    /// Write the chart as a PNG file.
    #[arg(long)]
    pub png: Option<PathBuf>,
    /// Write the chart as an SVG file.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Image width in pixels (64 to 16384).
    #[arg(long, default_value_t = 800, value_parser = super::bounds::count_u32(64, 16384))]
    pub width: u32,
    /// Image height in pixels (64 to 16384).
    #[arg(long, default_value_t = 500, value_parser = super::bounds::count_u32(64, 16384))]
    pub height: u32,
    /// Chart title.
    #[arg(long, default_value = "loss")]
    pub title: String,
    /// Log-scale y axis.
    #[arg(long)]
    pub log_y: bool,
    /// Bottom of the y axis (default: from the data).
    #[arg(long, allow_hyphen_values = true, value_parser = super::bounds::finite)]
    pub y_min: Option<f64>,
    /// Top of the y axis (default: from the data), e.g. to cut off the first steps' loss.
    #[arg(long, allow_hyphen_values = true, value_parser = super::bounds::finite)]
    pub y_max: Option<f64>,
}

/// One run's records, under the name the chart gives it.
struct Run {
    name: String,
    records: Vec<MetricsRecord>,
}

/// Runs `mha plot`.
pub fn run(args: &PlotArgs) -> Result<()> {
    if args.png.is_none() && args.svg.is_none() {
        bail!("nothing to write: give --png FILE and/or --svg FILE");
    }
    let names = run_names(&args.runs);
    let mut runs = Vec::with_capacity(args.runs.len());
    for (dir, name) in args.runs.iter().zip(names) {
        if !dir.is_dir() {
            bail!(
                "{}: not a directory (expected a run directory written by `mha train`)",
                dir.display()
            );
        }
        let path = dir.join(METRICS_FILE);
        if !path.is_file() {
            bail!(
                "{}: no {METRICS_FILE} in this directory (expected a run directory written by `mha train`)",
                dir.display()
            );
        }
        let log = read_metrics(&path)?;
        for warning in &log.skipped {
            eprintln!("warning: {warning}");
        }
        let records = log.records;
        println!("{}", summary(&name, &records));
        runs.push(Run { name, records });
    }

    let mut plot = LinePlot::new(args.width, args.height);
    plot.title = Some(args.title.clone());
    plot.x_label = "step".into();
    plot.y_label = "loss (nats/token)".into();
    plot.log_y = args.log_y;
    (plot.y_min, plot.y_max) = (args.y_min, args.y_max);
    for (k, run) in runs.iter().enumerate() {
        // Each run keeps its two colours whether or not the other runs have both curves.
        let (train_color, val_color) = (PALETTE[2 * k % 10], PALETTE[(2 * k + 1) % 10]);
        let train = points(&run.records, |r| r.train_loss);
        if !train.is_empty() {
            let name = format!("{} train", run.name);
            plot.series
                .push(Series::new(name, train).with_color(train_color));
        }
        let val = points(&run.records, |r| r.val_loss);
        if !val.is_empty() {
            let name = format!("{} val", run.name);
            let series = Series::new(name, val).dashed().with_markers();
            plot.series.push(series.with_color(val_color));
        }
    }
    if plot.series.is_empty() {
        bail!(
            "nothing to plot: no train or validation loss in {}",
            list(args.runs.iter().map(|d| d.join(METRICS_FILE)))
        );
    }
    if let Some(path) = &args.png {
        let png = plot.to_png()?;
        save(path, &png).with_context(|| format!("writing the PNG {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.svg {
        let svg = plot.to_svg()?;
        save(path, svg.as_bytes())
            .with_context(|| format!("writing the SVG {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// Each run's name: its directory's file name, or the path as given when two runs share it
/// (or it has none, like `.`).
fn run_names(dirs: &[PathBuf]) -> Vec<String> {
    let base = |d: &Path| d.file_name().map(|n| n.to_string_lossy().into_owned());
    let mut count: HashMap<String, usize> = HashMap::new();
    for name in dirs.iter().filter_map(|d| base(d)) {
        *count.entry(name).or_default() += 1;
    }
    dirs.iter()
        .map(|d| match base(d) {
            Some(n) if count[&n] == 1 => n,
            _ => d.display().to_string(),
        })
        .collect()
}

/// `(step, value)` for each record that has the value.
fn points(
    records: &[MetricsRecord],
    value: impl Fn(&MetricsRecord) -> Option<f64>,
) -> Vec<(f64, f64)> {
    records
        .iter()
        .filter_map(|r| value(r).map(|v| (r.step as f64, v)))
        .collect()
}

/// One line per run: training steps logged, the last train loss, the best validation loss.
fn summary(name: &str, records: &[MetricsRecord]) -> String {
    let train: Vec<(u64, f64)> = records
        .iter()
        .filter_map(|r| r.train_loss.map(|l| (r.step, l)))
        .collect();
    let evals: Vec<(u64, f64)> = records
        .iter()
        .filter_map(|r| r.val_loss.map(|l| (r.step, l)))
        .collect();
    let train_text = match train.last() {
        Some(&(step, loss)) => format!(
            "{} steps logged, last train loss {loss:.4} at step {step}",
            train.len()
        ),
        None => "no training steps logged".to_string(),
    };
    // The lowest finite loss, the earliest on a tie.
    let best = evals.iter().filter(|(_, l)| l.is_finite()).fold(
        None,
        |best: Option<(u64, f64)>, &(s, l)| match best {
            Some((_, b)) if b <= l => best,
            _ => Some((s, l)),
        },
    );
    let val_text = match best {
        Some((step, loss)) => format!(
            "best val loss {loss:.4} at step {step} ({} evaluation{})",
            evals.len(),
            if evals.len() == 1 { "" } else { "s" }
        ),
        None if evals.is_empty() => "no evaluations".to_string(),
        None => format!("no finite val loss ({} evaluations)", evals.len()),
    };
    format!("{name}: {train_text}; {val_text}")
}

fn list(paths: impl Iterator<Item = PathBuf>) -> String {
    paths
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
