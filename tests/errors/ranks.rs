//! Ranks: inputs and masks of the wrong number of dimensions.

#[allow(unused_imports)]
use super::*;

pub fn cases() -> Vec<Case> {
    vec![
        // ---- Ranks ---------------------------------------------------------------------
        Case {
            name: "query rank 1",
            run: || {
                let m = default_module()?;
                call(
                    &m,
                    &t(&[E])?,
                    &t(&[E])?,
                    &t(&[E])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &[
                "query should be unbatched 2D or batched 3D tensor",
                "received 1-D query tensor",
                "[8]",
            ],
        },
        Case {
            name: "query rank 4",
            run: || {
                let m = default_module()?;
                let x = t(&[L, N, 1, E])?;
                call(&m, &x, &x, &x, &AttentionOptions::new())
            },
            expect: &[
                "query should be unbatched 2D or batched 3D tensor",
                "received 4-D query tensor",
                "[3, 2, 1, 8]",
            ],
        },
        Case {
            name: "query rank 0 (scalar)",
            run: || {
                let m = default_module()?;
                let x = Tensor::new(1f32, &dev())?;
                call(&m, &x, &x, &x, &AttentionOptions::new())
            },
            expect: &["received 0-D query tensor"],
        },
        Case {
            name: "ModuleT::forward_t with 4-D input",
            run: || ModuleT::forward_t(&default_module()?, &t(&[L, N, 1, E])?, false).map(|_| ()),
            expect: &["received 4-D query tensor", "[3, 2, 1, 8]"],
        },
        Case {
            name: "batched query, 2-D key",
            run: || {
                let m = default_module()?;
                call(
                    &m,
                    &t(&[L, N, E])?,
                    &t(&[S, E])?,
                    &t(&[S, N, E])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &[
                "For batched (3-D) `query`, expected `key` and `value` to be 3-D",
                "found 2-D and 3-D",
                "[4, 8]",
            ],
        },
        Case {
            name: "batched query, 2-D value",
            run: || {
                let m = default_module()?;
                call(
                    &m,
                    &t(&[L, N, E])?,
                    &t(&[S, N, E])?,
                    &t(&[S, E])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &[
                "For batched (3-D) `query`, expected `key` and `value` to be 3-D",
                "found 3-D and 2-D",
                "[4, 8]",
            ],
        },
        Case {
            name: "unbatched query, 3-D key",
            run: || {
                let m = default_module()?;
                call(
                    &m,
                    &t(&[L, E])?,
                    &t(&[S, N, E])?,
                    &t(&[S, E])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &[
                "For unbatched (2-D) `query`, expected `key` and `value` to be 2-D",
                "found 3-D and 2-D",
                "[4, 2, 8]",
            ],
        },
        Case {
            name: "batched key_padding_mask 1-D",
            run: || batched_with(kpm(td(&[S], DType::U8)?)),
            expect: &[
                "For batched (3-D) `query`, expected `key_padding_mask` to be `None` or 2-D",
                "found 1-D",
                "[4]",
            ],
        },
        Case {
            name: "batched key_padding_mask 3-D",
            run: || batched_with(kpm(td(&[N, 1, S], DType::U8)?)),
            expect: &[
                "`key_padding_mask` to be `None` or 2-D",
                "found 3-D",
                "[2, 1, 4]",
            ],
        },
        Case {
            name: "unbatched key_padding_mask 2-D",
            run: || unbatched_with(kpm(td(&[1, S], DType::U8)?)),
            expect: &[
                "For unbatched (2-D) `query`, expected `key_padding_mask` to be `None` or 1-D",
                "found 2-D",
                "[1, 4]",
            ],
        },
        Case {
            name: "attn_mask 1-D",
            run: || batched_with(attn_mask(td(&[S], DType::U8)?)),
            expect: &[
                "expected `attn_mask` to be `None`, 2-D or 3-D",
                "found 1-D",
                "[4]",
            ],
        },
        Case {
            name: "attn_mask 4-D",
            run: || batched_with(attn_mask(td(&[N, H, L, S], DType::U8)?)),
            expect: &[
                "expected `attn_mask` to be `None`, 2-D or 3-D",
                "found 4-D",
                "[2, 2, 3, 4]",
            ],
        },
        Case {
            name: "unbatched attn_mask 4-D",
            run: || unbatched_with(attn_mask(td(&[1, H, L, S], DType::U8)?)),
            expect: &["For unbatched (2-D) `query`", "`attn_mask`", "found 4-D"],
        },
    ]
}
