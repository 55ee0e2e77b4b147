//! The progress display of `mha train`: a bar on a terminal (log lines otherwise), on
//! stderr, and the signal that stops a run at a checkpoint.

use std::time::Instant;

use candle_mha_train::{Evaluation, StepStats, TrainObserver};
use indicatif::ProgressBar;

/// Progress bar, evaluation lines and Ctrl-C.
pub struct Progress {
    pub bar: ProgressBar,
    pub start: Instant,
    pub tokens: usize,
    pub quiet: bool,
}

impl Progress {
    /// A log line above the bar, or plain when there is no bar (not a terminal, --quiet).
    fn line(&self, text: String) {
        if self.quiet {
            eprintln!("{text}");
        } else {
            self.bar.println(text);
        }
    }
}

impl TrainObserver for Progress {
    fn on_step(&mut self, step: u64, s: &StepStats) {
        self.tokens += s.input_tokens;
        let rate = self.tokens as f64 / self.start.elapsed().as_secs_f64().max(1e-9);
        self.bar.set_position(step);
        self.bar.set_message(format!(
            "loss {:.4} | lr {:.2e} | {rate:.0} tok/s",
            s.loss, s.lr
        ));
        if self.quiet && step.is_multiple_of(100) {
            eprintln!(
                "step {step}: loss {:.4}, lr {:.2e}, {rate:.0} tok/s",
                s.loss, s.lr
            );
        }
    }
    fn on_eval(&mut self, step: u64, e: &Evaluation) {
        self.line(format!("step {step}: eval {e}"));
    }
    fn on_save(&mut self, step: u64, dir: &std::path::Path) {
        self.line(format!(
            "step {step}: checkpoint saved to {}",
            dir.display()
        ));
    }
    fn on_best(&mut self, step: u64, e: &Evaluation, dir: &std::path::Path) {
        self.line(format!(
            "step {step}: new best validation loss {:.4}, saved to {}",
            e.loss,
            dir.display()
        ));
    }
    fn notice(&mut self, line: &str) {
        self.line(format!("warning: {line}"));
    }
    fn should_stop(&self) -> bool {
        super::signals::caught().is_some()
    }
}
