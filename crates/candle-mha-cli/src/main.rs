//! `mha`: the command-line interface of candle-mha.
//!
//! ```text
//! mha prepare --text PATH... --out DATA_DIR        encode a corpus once (streaming, parallel)
//! mha train [--tokens F | --text F... | --data D]  train a next-token predictor (default: synthetic task)
//! mha generate --checkpoint DIR --prompt "..."      continue a prompt (greedy, or --top-k/--top-p/--temperature)
//! mha eval --checkpoint DIR [--text F | --data D]   loss, perplexity, accuracy, bits/byte [--baseline bigram]
//! mha plot RUN_DIR [RUN_DIR...] --png F | --svg F   train/val loss curves from metrics.jsonl
//! mha inspect --checkpoint DIR --input "..."      attention tables, --png/--svg heatmaps, --dot/--graphml graphs,
//!                                                  --html: an interactive page of every layer and head
//! mha vocab-matrix --checkpoint DIR [--tokens F]   vocabulary x vocabulary attention over a corpus [--html PAGE]
//! mha info FILE [--prefix P]                        tensors, dtypes, shapes, attention modules
//! mha convert IN.pt OUT.safetensors [--dtype D] [--prefix P]   validated conversion
//! mha import SRC --out RUN [--meta meta.pkl]       a Hugging Face GPT-2 or nanoGPT checkpoint as a run
//! mha export RUN --out DIR [--format hf|nanogpt]    a run as a Hugging Face GPT-2 directory or nanoGPT's ckpt.pt
//! ```

mod bounds;
mod checkpoint_dir;
mod choices;
mod convert;
mod device;
mod eval;
mod export;
mod generate;
mod import;
mod info;
mod inspect;
mod plot;
mod prepare;
mod train;
mod vocab_matrix;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// PyTorch's nn.MultiheadAttention on candle: checkpoints, training, analysis.
///
/// Each command writes its product (tables, generated text, evaluations, the run's result) on
/// stdout, and its notices (device, progress, files written, warnings) on stderr.
#[derive(Parser, Debug)]
#[command(name = "mha", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Encode a text corpus (or token files) once into a data directory for --data.
    Prepare(prepare::PrepareArgs),
    /// Train a next-token predictor (default: the built-in associative-recall task).
    Train(Box<train::TrainArgs>),
    /// Continue a prompt with a trained checkpoint.
    Generate(generate::GenerateArgs),
    /// Evaluate a checkpoint: loss, perplexity, accuracy.
    Eval(eval::EvalArgs),
    /// Plot the train and validation loss of one or more runs (PNG and/or SVG).
    Plot(plot::PlotArgs),
    /// Show a trained model's attention on one input: tables, heatmaps, graphs, an HTML page.
    Inspect(Box<inspect::InspectArgs>),
    /// Aggregate which token attends to which over a corpus (CSV, safetensors, an HTML page).
    VocabMatrix(vocab_matrix::VocabMatrixArgs),
    /// List a checkpoint's tensors (name, dtype, shape) and the attention modules in it.
    Info(info::InfoArgs),
    /// Convert a PyTorch checkpoint (.pt/.pth/.bin or safetensors) to safetensors, validated.
    Convert(convert::ConvertArgs),
    /// Import a GPT-2-family checkpoint (Hugging Face GPT2LMHeadModel, nanoGPT's ckpt.pt) as
    /// a run directory.
    Import(import::ImportArgs),
    /// Export a run's model as a Hugging Face GPT-2 directory (--format hf) or nanoGPT's
    /// ckpt.pt (--format nanogpt).
    Export(export::ExportArgs),
}

/// Sets `RAYON_NUM_THREADS` to candle's default when it is unset. Without it, candle asks
/// `num_cpus` for the physical cores on every matmul, parsing `/proc/cpuinfo` each time: most
/// of a one-token decoding step (`docs/benchmarks.md`). Called first, before any thread reads
/// the environment. Under `mpirun`, the ranks on one machine share its cores (2 ranks on 8
/// cores: 4 threads each) rather than each taking them all.
fn pin_thread_count() {
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let local_ranks = std::env::var("OMPI_COMM_WORLD_LOCAL_SIZE")
            .or_else(|_| std::env::var("MPI_LOCALNRANKS"))
            .ok()
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or(1);
        let threads = (candle_mha::candle::utils::get_num_threads() / local_ranks).max(1);
        std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    }
}

fn main() -> std::process::ExitCode {
    // Training and corpus passes allocate the same large buffers every step: keep freed memory
    // for reuse rather than page-faulting it in again (see `candle_mha::runtime`).
    candle_mha::runtime::retain_freed_memory();
    // candle attaches a backtrace to its errors when RUST_BACKTRACE is set, and its Display
    // prints it: the user errors below are one line. RUST_LIB_BACKTRACE governs only those
    // captures (panics still follow RUST_BACKTRACE); a user may set it to 1.
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        std::env::set_var("RUST_LIB_BACKTRACE", "0");
    }
    pin_thread_count();
    // Before any candle op starts candle's element-wise pool (see `candle_mha::runtime`).
    for (name, value) in candle_mha::runtime::recommended_env() {
        if std::env::var_os(name).is_none() {
            std::env::set_var(name, value);
        }
    }
    // Paths end up in JSON records (trainer_state.json, meta.json): refused at start, not
    // at the first save after the compute.
    let bad = std::env::args_os()
        .enumerate()
        .skip(1)
        .find(|(_, a)| a.to_str().is_none());
    if let Some((i, arg)) = bad {
        eprintln!(
            "error: argument {i} ({}) is not valid UTF-8; paths and options must be UTF-8",
            arg.to_string_lossy()
        );
        return std::process::ExitCode::from(2);
    }
    // A negative number is a value (`--lr -1`), answered by the option's own range check,
    // not clap's "unexpected argument".
    let matches = Cli::command()
        .mut_subcommands(|c| c.allow_negative_numbers(true))
        .get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let result = match cli.command {
        Command::Prepare(args) => prepare::run(&args),
        Command::Train(args) => train::run(&args),
        Command::Generate(args) => generate::run(&args),
        Command::Eval(args) => eval::run(&args),
        Command::Plot(args) => plot::run(&args),
        Command::Inspect(args) => inspect::run(&args),
        Command::VocabMatrix(args) => vocab_matrix::run(&args),
        Command::Info(args) => info::run(&args),
        Command::Convert(args) => convert::run(&args),
        Command::Import(args) => import::run(&args),
        Command::Export(args) => export::run(&args),
    };
    match result {
        // A run stopped by SIGINT or SIGTERM saved its checkpoint, and says it stopped early.
        Ok(()) => match train::signals::caught() {
            Some(sig) => std::process::ExitCode::from(train::signals::exit_status(sig)),
            None => std::process::ExitCode::SUCCESS,
        },
        Err(e) => {
            // The whole cause chain on one line, no backtrace: these are user errors.
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
