//! Axis scales for [`line_plot`](super::line_plot): the drawn range of the data and "nice"
//! tick values (1, 2 or 5 × 10^k) with their labels, on a linear or a log10 scale.
//!
//! Only IEEE `+ − × ÷` and rounding are used (powers of ten by multiplication, log10 by a
//! series, never libm), so the same data gives the same ticks and pixels on every machine.
//!
//! # Ranges
//! An axis works in *axis space*: the value itself, or its log10 on a log scale. From the
//! smallest and largest finite axis-space values `lo ≤ hi`:
//! - a degenerate range (`hi − lo ≤ 1e-9·max(|lo|, |hi|)`, e.g. one point or a flat line) is
//!   widened to `c ± h` around its centre `c`, `h = 0.1·|c|` (`1` when `c = 0`) on a linear
//!   scale, `h = 0.5` (half a decade) on a log scale;
//! - then it is padded by `PAD = 5 %` of its span on each side, like matplotlib's margins;
//! - an end given by the caller replaces the padded data end; if that leaves the range empty
//!   (a fixed top below all data, say), the other end moves to one padded span away.
//!
//! # Ticks
//! Linear: `raw = (hi − lo) / target = n × 10^k` with `n` in `[1, 10)`; `step` = 1, 2, 5 or
//! 10 × 10^k for `n` below 1.5, 3, 7 or not (Heckbert's nice numbers, so about `target`
//! ticks); the ticks are the multiples of `step` inside `[lo, hi]`. Labels print `max(0, −k)` decimals, or
//! scientific notation (`2.5e6`, `1e-4`) when the largest tick magnitude is `≥ 1e6` or below
//! `1e-3`; zero prints as `0`.
//!
//! Log: the powers of ten inside the range when there are at least two (every `s`-th one,
//! `s = ⌈count / target⌉`, so at most `target` of them); else 1, 2 and 5 × 10^k when at least
//! two fall inside; else the linear ticks of the values, placed at their logs. Labels print
//! the value (`0.01`, `200`) for 10^-3 ≤ v < 10^6, else `1e-5`, `2e7`.

/// Fraction of the data span added on each side of an axis.
const PAD: f64 = 0.05;
/// The most ticks an axis draws (bounds every tick loop whatever the data).
const MAX_TICKS: i64 = 50;

/// One drawn axis: its range in axis space and its ticks.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Axis {
    /// Axis-space range drawn, `lo < hi`.
    pub(crate) lo: f64,
    pub(crate) hi: f64,
    /// Whether axis space is log10 of the values.
    pub(crate) log: bool,
    /// (axis-space position, label) of each tick, ascending.
    pub(crate) ticks: Vec<(f64, String)>,
    /// Axis-space distance between ticks (0 when irregular, e.g. a log fallback).
    pub(crate) step: f64,
}

impl Axis {
    /// The axis-space value of `v`: itself, or its log10 (`None` for `v ≤ 0` or non-finite).
    pub(crate) fn space(log: bool, v: f64) -> Option<f64> {
        match (log, v.is_finite()) {
            (_, false) => None,
            (false, true) => Some(v),
            (true, true) => (v > 0.0).then(|| log10(v)),
        }
    }

    /// Where an axis-space position lies between `lo` (0) and `hi` (1).
    pub(crate) fn frac_space(&self, t: f64) -> f64 {
        (t - self.lo) / (self.hi - self.lo)
    }

    /// The axis for axis-space data extremes `min ≤ max` (finite), with optional fixed ends
    /// given as values, and about `target` ticks. `Err` holds a message for a range that f64
    /// cannot hold (data spanning more than ~1.7e308).
    pub(crate) fn new(
        min: f64,
        max: f64,
        fixed: (Option<f64>, Option<f64>),
        log: bool,
        target: u32,
    ) -> Result<Self, String> {
        let (lo, hi) = range(min, max, fixed, log)?;
        let (ticks, step) = if log {
            (log_ticks(lo, hi, target), 0.0)
        } else {
            let (step, k) = nice_step((hi - lo) / target.max(1) as f64);
            (linear_ticks(lo, hi, step, k, false), step)
        };
        Ok(Self {
            lo,
            hi,
            log,
            ticks,
            step,
        })
    }
}

/// The drawn axis-space range (module docs).
fn range(
    min: f64,
    max: f64,
    (fix_lo, fix_hi): (Option<f64>, Option<f64>),
    log: bool,
) -> Result<(f64, f64), String> {
    let too_wide = || format!("the values span {min} to {max}, too wide a range to draw");
    let (fix_lo, fix_hi) = (
        fix_lo.and_then(|v| Axis::space(log, v)),
        fix_hi.and_then(|v| Axis::space(log, v)),
    );
    if let (Some(lo), Some(hi)) = (fix_lo, fix_hi) {
        return Ok((lo, hi));
    }
    let (mut lo, mut hi) = (min, max);
    let span = hi - lo;
    if !span.is_finite() {
        return Err(too_wide());
    }
    if span <= 1e-9 * lo.abs().max(hi.abs()) {
        let c = lo / 2.0 + hi / 2.0;
        let h = match (log, c == 0.0) {
            (true, _) => 0.5,
            (false, true) => 1.0,
            (false, false) => 0.1 * c.abs(),
        };
        (lo, hi) = (c - h, c + h);
    }
    let pad = PAD * (hi - lo);
    (lo, hi) = (lo - pad, hi + pad);
    let span = hi - lo;
    match (fix_lo, fix_hi) {
        (Some(f), None) => (lo, hi) = (f, if hi > f { hi } else { f + span }),
        (None, Some(f)) => (lo, hi) = (if lo < f { lo } else { f - span }, f),
        _ => {}
    }
    if !(lo.is_finite() && hi.is_finite() && (hi - lo).is_finite()) || lo >= hi {
        return Err(too_wide());
    }
    Ok((lo, hi))
}

/// `10^k` by multiplication (exact for `|k| ≤ 22`, then correctly rounded once).
pub(crate) fn pow10(k: i32) -> f64 {
    let mut p = 1.0f64;
    for _ in 0..k.unsigned_abs().min(400) {
        p *= 10.0;
    }
    if k < 0 {
        1.0 / p
    } else {
        p
    }
}

/// `⌊log10 v⌋` for a finite `v > 0`, by comparison with powers of ten.
fn exponent(v: f64) -> i32 {
    let mut k = 0i32;
    while k < 330 && pow10(k + 1) <= v {
        k += 1;
    }
    while k > -340 && pow10(k) > v {
        k -= 1;
    }
    k
}

/// The nice step near `raw > 0` (1, 2, 5 or 10 × 10^k, module docs), and its `k`.
pub(crate) fn nice_step(raw: f64) -> (f64, i32) {
    if !(raw > 0.0 && raw.is_finite()) {
        return (1.0, 0);
    }
    let k = exponent(raw);
    for (m, below) in [(1.0, 1.5), (2.0, 3.0), (5.0, 7.0)] {
        if raw < below * pow10(k) {
            return (m * pow10(k), k);
        }
    }
    (pow10(k + 1), k + 1)
}

/// The multiples of `step = m × 10^k` inside `[lo, hi]` (axis space), labelled; on a log
/// axis (`log`), `lo..hi` are values and the positions are their logs.
fn linear_ticks(lo: f64, hi: f64, step: f64, k: i32, log: bool) -> Vec<(f64, String)> {
    let (k0, k1) = ((lo / step).ceil(), (hi / step).floor());
    if !(k0.is_finite() && k1.is_finite()) || k1 - k0 > MAX_TICKS as f64 {
        return Vec::new();
    }
    let values: Vec<f64> = (k0 as i64..=k1 as i64)
        .map(|i| i as f64 * step)
        .map(|v| if v == 0.0 { 0.0 } else { v })
        .collect();
    let m = values.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let sci = m >= 1e6 || (m > 0.0 && m < 1e-3);
    values
        .into_iter()
        .filter_map(|v| {
            let label = if sci && v == 0.0 {
                "0".to_string()
            } else if sci {
                let p = (exponent(m) - k).clamp(0, 6) as usize;
                format!("{v:.p$e}")
            } else {
                let d = (-k).max(0) as usize;
                format!("{v:.d$}")
            };
            let pos = if log { Axis::space(true, v)? } else { v };
            Some((pos, label))
        })
        .collect()
}

/// `m × 10^k` as a log-axis label (module docs).
fn log_label(m: u32, k: i32) -> String {
    if (-3..6).contains(&k) {
        let d = (-k).max(0) as usize;
        format!("{:.d$}", m as f64 * pow10(k))
    } else {
        format!("{m}e{k}")
    }
}

/// Log-axis ticks for the axis-space (log10) range `[lo, hi]` (module docs).
fn log_ticks(lo: f64, hi: f64, target: u32) -> Vec<(f64, String)> {
    let (k0, k1) = (lo.ceil().max(-400.0) as i32, hi.floor().min(400.0) as i32);
    let count = (k1 - k0 + 1).max(0);
    if count >= 2 {
        let stride = (count as u32).div_ceil(target.max(1)).max(1) as i32;
        return (k0..=k1)
            .filter(|k| k.rem_euclid(stride) == 0)
            .map(|k| (k as f64, log_label(1, k)))
            .collect();
    }
    let mut ticks = Vec::new();
    for k in lo.floor().max(-400.0) as i32..=hi.ceil().min(400.0) as i32 {
        for m in [1u32, 2, 5] {
            let t = log10(m as f64 * pow10(k));
            if (lo..=hi).contains(&t) {
                ticks.push((t, log_label(m, k)));
            }
        }
    }
    if ticks.len() >= 2 {
        return ticks;
    }
    let (vlo, vhi) = (pow10_real(lo), pow10_real(hi));
    let (step, k) = nice_step((vhi - vlo) / target.max(1) as f64);
    linear_ticks(vlo, vhi, step, k, true)
}

/// `10^t` for a real `t` (the log-axis fallback only): `10^⌊t⌋ · e^(frac·ln 10)` by a series.
fn pow10_real(t: f64) -> f64 {
    let k = t.floor();
    let x = (t - k) * std::f64::consts::LN_10;
    // e^x for x in [0, ln 10): Taylor terms until they vanish (at most 60).
    let (mut sum, mut term) = (1.0f64, 1.0f64);
    for n in 1..60 {
        term *= x / n as f64;
        sum += term;
        if term < 1e-17 * sum {
            break;
        }
    }
    sum * pow10(k.clamp(-400.0, 400.0) as i32)
}

/// `log10 v` for a finite `v > 0`, with `+ − × ÷` only (the same bits on every machine):
/// `v = m·2^e` with `m` in `[√½, √2)`, `ln m = 2·atanh((m − 1)/(m + 1))` by its series.
pub(crate) fn log10(v: f64) -> f64 {
    if !(v > 0.0 && v.is_finite()) {
        return f64::NAN;
    }
    let bits = v.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i64;
    if biased == 0 {
        // Subnormal: scale into the normal range first.
        let two54 = (1u64 << 54) as f64;
        return log10(v * two54) - 54.0 * std::f64::consts::LOG10_2;
    }
    let mut e = biased - 1023;
    let mut m = f64::from_bits((bits & ((1u64 << 52) - 1)) | (1023u64 << 52));
    if m > std::f64::consts::SQRT_2 {
        m /= 2.0;
        e += 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let (mut sum, mut term) = (0.0f64, s);
    for n in (1..=41).step_by(2) {
        sum += term / n as f64;
        term *= s2;
    }
    let ln = 2.0 * sum + e as f64 * std::f64::consts::LN_2;
    ln * std::f64::consts::LOG10_E
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(a: &Axis) -> Vec<&str> {
        a.ticks.iter().map(|(_, l)| l.as_str()).collect()
    }

    #[test]
    fn log10_matches_known_values() {
        for (v, want) in [
            (1.0, 0.0),
            (10.0, 1.0),
            (1000.0, 3.0),
            (0.01, -2.0),
            (100.0, 2.0),
        ] {
            assert!((log10(v) - want).abs() < 1e-5, "{v}: {}", log10(v));
        }
        for v in [1e-300, 3.7, 123456.0, 5e-324, 1e308] {
            assert!((log10(v) - v.log10()).abs() < 1e-12, "{v}");
        }
        assert!(log10(0.0).is_nan() && log10(-1.0).is_nan());
    }

    #[test]
    fn nice_steps_are_1_2_5() {
        assert_eq!(nice_step(0.7), (0.5, -1));
        assert_eq!(nice_step(1.0), (1.0, 0));
        assert_eq!(nice_step(1.6), (2.0, 0));
        assert_eq!(nice_step(3.0), (5.0, 0));
        assert_eq!(nice_step(7.5), (10.0, 1));
        assert_eq!(nice_step(220.0), (200.0, 2));
        assert_eq!(nice_step(0.013), (0.01, -2));
    }

    #[test]
    fn linear_axes() {
        // Steps 0..1000 padded by 50 on each side; target 5 → raw 220 → step 200.
        let a = Axis::new(0.0, 1000.0, (None, None), false, 5).unwrap();
        assert_eq!((a.lo, a.hi), (-50.0, 1050.0));
        assert_eq!(labels(&a), ["0", "200", "400", "600", "800", "1000"]);
        // 0.12..0.5 padded to 0.101..0.519: 0.1 is outside.
        let a = Axis::new(0.12, 0.5, (None, None), false, 4).unwrap();
        assert_eq!(labels(&a), ["0.2", "0.3", "0.4", "0.5"]);
        // A flat line at 2 is widened to 1.8..2.2 (then padded).
        let a = Axis::new(2.0, 2.0, (None, None), false, 4).unwrap();
        assert!((a.lo - 1.78).abs() < 1e-12 && (a.hi - 2.22).abs() < 1e-12);
        assert_eq!(labels(&a), ["1.8", "1.9", "2.0", "2.1", "2.2"]);
        let a = Axis::new(0.0, 0.0, (None, None), false, 2).unwrap();
        assert_eq!(labels(&a), ["-1", "0", "1"]);
        let a = Axis::new(-3e6, 5e6, (None, None), false, 4).unwrap();
        assert_eq!(labels(&a), ["-2e6", "0", "2e6", "4e6"]);
        // Fixed ends are kept exactly.
        let a = Axis::new(0.0, 10.0, (Some(1.0), Some(3.0)), false, 2).unwrap();
        assert_eq!((a.lo, a.hi), (1.0, 3.0));
        let a = Axis::new(5.0, 6.0, (None, Some(1.0)), false, 2).unwrap();
        assert!(a.lo < a.hi && a.hi == 1.0);
        assert!(Axis::new(-1e308, 1e308, (None, None), false, 4).is_err());
    }

    #[test]
    fn log_axes() {
        let (lo, hi) = (log10(0.01), log10(10.0));
        let a = Axis::new(lo, hi, (None, None), true, 6).unwrap();
        assert_eq!(labels(&a), ["0.01", "0.1", "1", "10"]);
        let a = Axis::new(log10(1e-8), log10(1e8), (None, None), true, 4).unwrap();
        // 17 decades -8..8 inside -8.8..8.8; every 5th: -5, 0, 5.
        assert_eq!(labels(&a), ["1e-5", "1", "100000"]);
        // Less than a decade: 1, 2, 5 × 10^k.
        let a = Axis::new(log10(1.5), log10(6.0), (None, None), true, 4).unwrap();
        assert_eq!(labels(&a), ["2", "5"]);
        // Narrower still: linear ticks of the values.
        let a = Axis::new(log10(2.1), log10(2.4), (None, None), true, 3).unwrap();
        assert_eq!(labels(&a), ["2.1", "2.2", "2.3", "2.4"]);
        assert_eq!(Axis::space(true, 0.0), None);
    }
}
