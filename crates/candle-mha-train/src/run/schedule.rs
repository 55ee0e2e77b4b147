//! [`LrSchedule`]: linear warmup, then cosine decay.

/// Learning rate at each step: linear warmup from `base_lr / warmup_steps` to `base_lr`
/// over `warmup_steps`, then cosine decay to `min_lr` at `total_steps`, then `min_lr`.
///
/// PyTorch equivalent: `LambdaLR` with that formula (as in nanoGPT's `get_lr`); PyTorch has
/// no single built-in for it.
#[derive(Clone, Debug, PartialEq)]
pub struct LrSchedule {
    /// Peak learning rate.
    pub base_lr: f64,
    /// Final learning rate.
    pub min_lr: f64,
    /// Warmup steps (0 = none).
    pub warmup_steps: u64,
    /// Steps of the whole run.
    pub total_steps: u64,
}

impl LrSchedule {
    /// The learning rate of step `step` (0-based).
    pub fn lr(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.base_lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let decay = self.total_steps.saturating_sub(self.warmup_steps).max(1);
        let progress = ((step - self.warmup_steps) as f64 / decay as f64).min(1.0);
        self.min_lr
            + 0.5 * (self.base_lr - self.min_lr) * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine() {
        let s = LrSchedule {
            base_lr: 1.0,
            min_lr: 0.1,
            warmup_steps: 4,
            total_steps: 14,
        };
        let lrs: Vec<f64> = (0..16).map(|t| s.lr(t)).collect();
        assert_eq!(&lrs[..4], &[0.25, 0.5, 0.75, 1.0]);
        assert_eq!(lrs[4], 1.0);
        // halfway through the decay: (1 + 0.1) / 2
        assert!((lrs[9] - 0.55).abs() < 1e-12);
        assert!((lrs[14] - 0.1).abs() < 1e-12 && (lrs[15] - 0.1).abs() < 1e-12);
        assert!(lrs[4..15].windows(2).all(|w| w[1] <= w[0]));
    }
}
