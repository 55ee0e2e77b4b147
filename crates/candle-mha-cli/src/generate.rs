//! `mha generate`: continue a prompt with a trained model.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use candle_mha::candle::DType;
use candle_mha_train::data::Codec;
use candle_mha_train::models::{generate_batch, generate_stream, GenerateConfig};
use clap::builder::{PossibleValuesParser, TypedValueParser};

/// Arguments of `mha generate`. Greedy unless --top-k, --top-p or --temperature is given; then
/// the next token is sampled (temperature, then top-k, then top-p, as Hugging Face's
/// `model.generate(do_sample=True, ...)`).
#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// A checkpoint directory written by `mha train`.
    #[arg(long)]
    pub checkpoint: PathBuf,
    #[command(flatten)]
    pub read: super::checkpoint_dir::ReadOptions,
    /// The prompt: symbols separated by spaces (token models) or text (text models). Give it
    /// several times to continue several prompts at once (a batch, left-padded); each is
    /// printed as a single prompt is, in order, once all are done.
    #[arg(long, required = true)]
    pub prompt: Vec<String>,
    /// Tokens to generate at most (stops early at end of sequence; at most 1000000).
    #[arg(long, default_value_t = 20, value_parser = super::bounds::count(0, 1_000_000))]
    pub max_new_tokens: usize,
    /// Sample among the k most likely tokens (default: greedy; no top-k filtering when
    /// sampling).
    #[arg(long, value_name = "K", value_parser = super::bounds::count(1, super::bounds::MAX_COUNT))]
    pub top_k: Option<usize>,
    /// Nucleus sampling: sample among the most likely tokens whose probabilities sum to at
    /// least P, in (0, 1] (default: greedy; no top-p filtering when sampling).
    #[arg(long, value_name = "P", value_parser = parse_top_p)]
    pub top_p: Option<f64>,
    /// Sampling temperature, positive (below 1 sharper, above 1 flatter); alone it samples
    /// from the whole distribution (default: greedy; 1 when sampling).
    #[arg(long, value_name = "T", value_parser = parse_temperature)]
    pub temperature: Option<f64>,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where to run.
    #[arg(long, default_value = "auto", value_parser = super::choices::DeviceParser)]
    pub device: String,
    /// Compute dtype.
    #[arg(long, default_value = "f32", value_parser = super::choices::DtypeParser)]
    pub dtype: DType,
    /// The matrix products in bf16 with f32 sums (`torch.autocast("cpu", torch.bfloat16)`;
    /// CPU, f32): each weight rounded to bf16 once, so decoding streams half the bytes per
    /// token. bf16 or off.
    #[arg(long, default_value = "off", action = clap::ArgAction::Set, value_parser = PossibleValuesParser::new(["bf16", "off"]).map(|s| s == "bf16"))]
    pub autocast: bool,
    /// Run the whole context through the model for every token instead of decoding through
    /// the key/value cache (the same tokens, slower; for comparison).
    #[arg(long)]
    pub no_kv_cache: bool,
}

/// Parses `--top-p`: a probability in (0, 1].
fn parse_top_p(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(p) if p > 0.0 && p <= 1.0 => Ok(p),
        _ => Err(format!("--top-p {s}: expected a probability in (0, 1]")),
    }
}

/// Parses `--temperature`: a positive finite number.
fn parse_temperature(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(t) if t > 0.0 && t.is_finite() => Ok(t),
        _ => Err(format!(
            "--temperature {s}: expected a positive finite number"
        )),
    }
}

/// Runs `mha generate`. Text models: prints the prompt as typed followed by its continuation,
/// as one text. Symbol models: the prompt on one line, `=> continuation` on the next. One
/// prompt: the continuation appears token by token as it is generated (stdout flushed per
/// token). Several prompts: generated as one batch, then printed one after another.
pub fn run(args: &GenerateArgs) -> Result<()> {
    if args.autocast {
        crate::device::check_autocast(Some(args.dtype), &args.device)?;
    }
    let (device, notice) = crate::device::open(&args.device)?;
    eprintln!("{notice}");
    let ckpt = super::checkpoint_dir::open(&args.checkpoint, &args.read, args.dtype, &device, 1)?;
    let prompts = args
        .prompt
        .iter()
        .map(|p| ckpt.codec.encode_prompt(p))
        .collect::<candle_mha::candle::Result<Vec<_>>>()?;
    if let Some(skipped) = ckpt.codec.unknown_skipped() {
        eprintln!("warning: left out of the prompt {}", skipped.describe());
    }
    let cfg = GenerateConfig {
        max_new_tokens: args.max_new_tokens,
        do_sample: args.top_k.is_some() || args.top_p.is_some() || args.temperature.is_some(),
        top_k: args.top_k,
        top_p: args.top_p,
        temperature: args.temperature.unwrap_or(1.0),
        seed: args.seed,
        // A Llama-family model stops where transformers' generate does: at its
        // generation_config.json's ids, not the tokenizer's.
        eos_id: match ckpt.model.llama() {
            Some(_) => None,
            None => ckpt.codec.eos_id(),
        },
        eos_ids: ckpt.model.config().eos_token_ids()?,
        kv_cache: !args.no_kv_cache,
        autocast_bf16: args.autocast,
    };
    if let [prompt] = prompts.as_slice() {
        let mut out = Printer::start(&ckpt.codec, &args.prompt[0])?;
        let mut new = Vec::new();
        let start = std::time::Instant::now();
        let mut first = None;
        generate_stream(&ckpt.model, prompt, &cfg, |id| {
            new.push(id);
            first.get_or_insert_with(|| start.elapsed());
            out.update(&ckpt.codec.decode_continuation(prompt, &new)?, false)
                .map_err(candle_mha::candle::Error::wrap)
        })?;
        out.update(&ckpt.codec.decode_continuation(prompt, &new)?, true)?;
        if let Some(first) = first {
            eprintln!("{}", speed(prompt.len(), new.len(), first, start.elapsed()));
        }
        return Ok(());
    }
    let all = generate_batch(&ckpt.model, &prompts, &cfg)?;
    for ((typed, prompt), new) in args.prompt.iter().zip(&prompts).zip(&all) {
        let mut out = Printer::start(&ckpt.codec, typed)?;
        out.update(&ckpt.codec.decode_continuation(prompt, new)?, true)?;
    }
    Ok(())
}

/// The line `mha generate` ends with on stderr: the prompt's time (to the first new token)
/// and the rate of the tokens after it, as `transformers`' and llama.cpp's timings split them.
fn speed(
    prompt: usize,
    tokens: usize,
    first: std::time::Duration,
    all: std::time::Duration,
) -> String {
    let rest = (all - first).as_secs_f64();
    let rate = match tokens {
        1 => String::new(),
        _ => format!(
            ", then {:.1} tokens/s",
            (tokens - 1) as f64 / rest.max(1e-9)
        ),
    };
    format!(
        "{tokens} new tokens in {:.2} s: prompt of {prompt} and the first token {:.0} ms{rate}",
        all.as_secs_f64(),
        first.as_secs_f64() * 1e3
    )
}

/// Prints a continuation as it grows: only the text added since the last call, and only
/// while the text so far is stable (a token that ends inside a multi-byte character decodes
/// to U+FFFD until the next token completes it).
struct Printer {
    printed: String,
}

impl Printer {
    /// Prints what comes before the continuation: the prompt as typed (text models), or the
    /// prompt line and `=> ` (symbol models).
    fn start(codec: &Codec, typed: &str) -> Result<Self> {
        let mut stdout = std::io::stdout().lock();
        match codec {
            Codec::Text(_) => write!(stdout, "{typed}")?,
            Codec::Symbols(_) => write!(stdout, "{typed}\n=> ")?,
        }
        stdout.flush()?;
        Ok(Self {
            printed: String::new(),
        })
    }

    /// Prints the new part of `text` (the whole continuation so far); `last`: the final text,
    /// printed even if it ends in U+FFFD, then the line ends.
    fn update(&mut self, text: &str, last: bool) -> Result<()> {
        let mut stdout = std::io::stdout().lock();
        if let Some(rest) = new_stable_text(&self.printed, text, last) {
            write!(stdout, "{rest}")?;
            self.printed = text.to_string();
        }
        if last {
            writeln!(stdout)?;
        }
        stdout.flush()?;
        Ok(())
    }
}

/// What of `text` (the whole continuation so far) to print after `printed`: its new part,
/// unless `text` ends in U+FFFD (a multi-byte character cut between tokens, completed by a
/// later one) and is not the `last` text, or does not extend `printed` (a decoder that
/// rewrites earlier text, rare, cannot be unprinted).
fn new_stable_text<'a>(printed: &str, text: &'a str, last: bool) -> Option<&'a str> {
    if !last && text.ends_with('\u{FFFD}') {
        return None;
    }
    text.strip_prefix(printed).filter(|rest| !rest.is_empty())
}

#[cfg(test)]
mod tests {
    use super::new_stable_text;

    #[test]
    fn only_stable_new_text_is_printed() {
        assert_eq!(new_stable_text("", " the", false), Some(" the"));
        assert_eq!(new_stable_text(" the", " the cat", false), Some(" cat"));
        // "é" split across two byte tokens: wait for the second.
        assert_eq!(new_stable_text(" the", " the caf\u{FFFD}", false), None);
        assert_eq!(new_stable_text(" the", " the café", false), Some(" café"));
        // At the end, whatever is there.
        assert_eq!(new_stable_text("a", "ab\u{FFFD}", true), Some("b\u{FFFD}"));
        // Nothing new, or earlier text rewritten: nothing.
        assert_eq!(new_stable_text("ab", "ab", false), None);
        assert_eq!(new_stable_text("ab", "xb c", false), None);
    }
}
