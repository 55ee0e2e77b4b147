//! The Transformer layers' own checks of their masks, made before the attention's, so that an
//! error names the layer the user called, the option they set and `batch_first` (the usual
//! cause of a mask that does not fit).

use candle::{Result, Tensor};

/// How a layer reads its inputs: `batch_first` and the heads (a 3-D mask is `(N·nhead, L, S)`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub batch_first: bool,
    pub nhead: usize,
}

/// The batch size (`None`: unbatched) and length of a `(L, N, E)` / `(N, L, E)` / `(L, E)`
/// input read with `batch_first`.
fn batch_and_len(x: &Tensor, batch_first: bool) -> (Option<usize>, usize) {
    match (x.dims(), batch_first) {
        ([n, l, _], true) | ([l, n, _], false) => (Some(*n), *l),
        ([l, _], _) => (None, *l),
        _ => (None, 0),
    }
}

/// Whether an attention mask of `dims` fits queries `q` and keys `k` read with `batch_first`.
fn attn_mask_fits(dims: &[usize], q: &Tensor, k: &Tensor, batch_first: bool, nhead: usize) -> bool {
    let ((n, l), (_, s)) = (batch_and_len(q, batch_first), batch_and_len(k, batch_first));
    match dims {
        [a, b] => (*a, *b) == (l, s),
        [h, a, b] => (*h, *a, *b) == (n.unwrap_or(1) * nhead, l, s),
        _ => false,
    }
}

/// The sentence that ends an error when the other `batch_first` would make `fits` true.
fn batch_first_hint(layout: Layout, fits: impl Fn(bool) -> bool) -> String {
    match fits(!layout.batch_first) {
        true => format!(
            "; these shapes fit batch_first = {}: was the layer built with the batch_first you meant?",
            !layout.batch_first
        ),
        false => String::new(),
    }
}

/// `who: option has shape …, expected …` for an attention mask over queries `q` and keys `k`
/// (each `(name, tensor)`), or nothing when it fits.
pub(crate) fn attn_mask(
    who: &str,
    option: &str,
    mask: Option<&Tensor>,
    (q_name, q): (&str, &Tensor),
    (k_name, k): (&str, &Tensor),
    layout: Layout,
) -> Result<()> {
    let Some(mask) = mask else {
        return Ok(());
    };
    let dims = mask.dims();
    if attn_mask_fits(dims, q, k, layout.batch_first, layout.nhead) {
        return Ok(());
    }
    let ((n, l), (_, s)) = (
        batch_and_len(q, layout.batch_first),
        batch_and_len(k, layout.batch_first),
    );
    let heads = n.unwrap_or(1) * layout.nhead;
    let batch = match n {
        Some(_) => "N·nhead",
        None => "nhead",
    };
    let hint = batch_first_hint(layout, |bf| attn_mask_fits(dims, q, k, bf, layout.nhead));
    candle::bail!(
        "{who}: {option} has shape {dims:?}, expected (L, S) = ({l}, {s}) or ({batch}, L, S) = \
         ({heads}, {l}, {s}) for {q_name} {:?} and {k_name} {:?} read with batch_first = {}{hint}",
        q.dims(),
        k.dims(),
        layout.batch_first
    )
}

/// `who: option has shape …, expected (N, S)` for a key padding mask of the input `x`, or
/// nothing when it fits.
pub(crate) fn padding_mask(
    who: &str,
    option: &str,
    mask: Option<&Tensor>,
    (x_name, x): (&str, &Tensor),
    layout: Layout,
) -> Result<()> {
    let Some(mask) = mask else {
        return Ok(());
    };
    let dims = mask.dims();
    let fits = |bf: bool| match batch_and_len(x, bf) {
        (Some(n), s) => dims == [n, s],
        (None, s) => dims == [s],
    };
    if fits(layout.batch_first) {
        return Ok(());
    }
    let expected = match batch_and_len(x, layout.batch_first) {
        (Some(n), s) => format!("(N, S) = ({n}, {s})"),
        (None, s) => format!("(S) = ({s}) for an unbatched input"),
    };
    let hint = batch_first_hint(layout, fits);
    candle::bail!(
        "{who}: {option} has shape {dims:?}, expected {expected} for {x_name} {:?} read with \
         batch_first = {}{hint}",
        x.dims(),
        layout.batch_first
    )
}

/// The encoder's masks (`names`: the mask's and the padding mask's option names).
pub(crate) fn encoder_masks(
    who: &str,
    names: [&str; 2],
    src: &Tensor,
    (mask, padding): (Option<&Tensor>, Option<&Tensor>),
    layout: Layout,
) -> Result<()> {
    attn_mask(who, names[0], mask, ("src", src), ("src", src), layout)?;
    padding_mask(who, names[1], padding, ("src", src), layout)
}

/// The decoder's masks (`names`: tgt_mask, memory_mask, tgt_key_padding_mask,
/// memory_key_padding_mask).
pub(crate) fn decoder_masks(
    who: &str,
    names: [&str; 4],
    (tgt, memory): (&Tensor, &Tensor),
    masks: [Option<&Tensor>; 4],
    layout: Layout,
) -> Result<()> {
    attn_mask(who, names[0], masks[0], ("tgt", tgt), ("tgt", tgt), layout)?;
    attn_mask(
        who,
        names[1],
        masks[1],
        ("tgt", tgt),
        ("memory", memory),
        layout,
    )?;
    padding_mask(who, names[2], masks[2], ("tgt", tgt), layout)?;
    padding_mask(who, names[3], masks[3], ("memory", memory), layout)
}

/// The option names of [`EncoderOptions`](super::EncoderOptions).
pub(crate) const ENCODER_OPTIONS: [&str; 2] = [
    "EncoderOptions::mask",
    "EncoderOptions::src_key_padding_mask",
];

/// The option names of [`DecoderOptions`](super::DecoderOptions).
pub(crate) const DECODER_OPTIONS: [&str; 4] = [
    "DecoderOptions::tgt_mask",
    "DecoderOptions::memory_mask",
    "DecoderOptions::tgt_key_padding_mask",
    "DecoderOptions::memory_key_padding_mask",
];

#[cfg(test)]
mod tests {
    use super::*;
    use candle::{DType, Device};

    fn zeros(dims: &[usize]) -> Tensor {
        Tensor::zeros(dims, DType::U8, &Device::Cpu).unwrap()
    }

    #[test]
    fn a_mask_for_the_other_batch_first_says_so() {
        let src = Tensor::zeros((3, 7, 8), DType::F32, &Device::Cpu).unwrap();
        let layout = Layout {
            batch_first: false,
            nhead: 2,
        };
        // Read as (L, N, E) = (3, 7, 8); a (7, 7) mask fits (N, L, E).
        let e = attn_mask(
            "TransformerEncoder",
            "EncoderOptions::mask",
            Some(&zeros(&[7, 7])),
            ("src", &src),
            ("src", &src),
            layout,
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("TransformerEncoder: EncoderOptions::mask has shape [7, 7], expected (L, S) = (3, 3) or (N·nhead, L, S) = (14, 3, 3)"), "{e}");
        assert!(e.contains("fit batch_first = true"), "{e}");
        let e = padding_mask(
            "TransformerEncoder",
            "EncoderOptions::src_key_padding_mask",
            Some(&zeros(&[3, 7])),
            ("src", &src),
            layout,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("expected (N, S) = (7, 3)") && e.contains("fit batch_first = true"),
            "{e}"
        );
        // Shapes that fit pass; one that fits neither reading gives no hint.
        attn_mask(
            "T",
            "m",
            Some(&zeros(&[14, 3, 3])),
            ("src", &src),
            ("src", &src),
            layout,
        )
        .unwrap();
        let e = attn_mask(
            "T",
            "m",
            Some(&zeros(&[5, 5])),
            ("src", &src),
            ("src", &src),
            layout,
        )
        .unwrap_err()
        .to_string();
        assert!(!e.contains("fit batch_first"), "{e}");
    }
}
