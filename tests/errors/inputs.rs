//! Inputs: wrong dtypes, feature sizes and lengths.

#[allow(unused_imports)]
use super::*;

pub fn cases() -> Vec<Case> {
    vec![
        // ---- Input dtypes --------------------------------------------------------------
        Case {
            name: "query i64",
            run: || {
                let m = default_module()?;
                let x = td(&[L, N, E], DType::I64)?;
                call(&m, &x, &x, &x, &AttentionOptions::new())
            },
            expect: &["query must be a floating tensor", "I64"],
        },
        Case {
            name: "query u8",
            run: || {
                let m = default_module()?;
                let x = td(&[L, N, E], DType::U8)?;
                call(&m, &x, &x, &x, &AttentionOptions::new())
            },
            expect: &["query must be a floating tensor", "U8"],
        },
        Case {
            name: "query f64 with f32 module",
            run: || {
                let m = default_module()?;
                let x = td(&[L, N, E], DType::F64)?;
                call(&m, &x, &x, &x, &AttentionOptions::new())
            },
            expect: &["query has dtype F64 but the module's parameters are F32"],
        },
        Case {
            name: "key dtype differs from query",
            run: || {
                let m = default_module()?;
                let k = td(&[S, N, E], DType::F64)?;
                call(
                    &m,
                    &t(&[L, N, E])?,
                    &k,
                    &t(&[S, N, E])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &["key has dtype F64 but query has F32"],
        },
        Case {
            name: "value dtype differs from query",
            run: || {
                let m = default_module()?;
                let v = td(&[S, N, E], DType::BF16)?;
                call(
                    &m,
                    &t(&[L, N, E])?,
                    &t(&[S, N, E])?,
                    &v,
                    &AttentionOptions::new(),
                )
            },
            expect: &["value has dtype BF16 but query has F32"],
        },
        // ---- Feature sizes and lengths -------------------------------------------------
        Case {
            name: "query last dim != embed_dim",
            run: || {
                let m = default_module()?;
                let x = t(&[L, N, 6])?;
                call(&m, &x, &x, &x, &AttentionOptions::new())
            },
            expect: &[
                "was expecting embedding dimension of 8, but got 6",
                "[3, 2, 6]",
            ],
        },
        Case {
            name: "unbatched query last dim != embed_dim",
            run: || {
                let m = default_module()?;
                call(
                    &m,
                    &t(&[L, 6])?,
                    &t(&[S, E])?,
                    &t(&[S, E])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &[
                "was expecting embedding dimension of 8, but got 6",
                "[3, 6]",
            ],
        },
        Case {
            name: "key last dim != kdim (packed weights)",
            run: || {
                let m = default_module()?;
                call(
                    &m,
                    &t(&[L, N, E])?,
                    &t(&[S, N, 6])?,
                    &t(&[S, N, E])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &["expecting key feature size kdim=8, but got 6", "[4, 2, 6]"],
        },
        Case {
            name: "key last dim != kdim (separate weights)",
            run: || {
                let m = module(MultiheadAttentionConfig::new(E, H).with_kdim(5))?;
                call(
                    &m,
                    &t(&[L, N, E])?,
                    &t(&[S, N, 6])?,
                    &t(&[S, N, E])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &["expecting key feature size kdim=5, but got 6", "[4, 2, 6]"],
        },
        Case {
            name: "key with embed_dim features when kdim differs",
            run: || {
                let m = module(MultiheadAttentionConfig::new(E, H).with_kdim(5))?;
                let x = t(&[L, N, E])?;
                call(&m, &x, &x, &x, &AttentionOptions::new())
            },
            expect: &["expecting key feature size kdim=5, but got 8"],
        },
        Case {
            name: "value last dim != vdim (separate weights)",
            run: || {
                let m = module(MultiheadAttentionConfig::new(E, H).with_vdim(5))?;
                call(
                    &m,
                    &t(&[L, N, E])?,
                    &t(&[S, N, E])?,
                    &t(&[S, N, 6])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &[
                "expecting value feature size vdim=5, but got 6",
                "[4, 2, 6]",
            ],
        },
        Case {
            name: "value last dim != vdim (packed weights)",
            run: || {
                let m = default_module()?;
                call(
                    &m,
                    &t(&[L, N, E])?,
                    &t(&[S, N, E])?,
                    &t(&[S, N, 4])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &["expecting value feature size vdim=8, but got 4"],
        },
        Case {
            name: "key and value lengths differ",
            run: || {
                let m = default_module()?;
                call(
                    &m,
                    &t(&[L, N, E])?,
                    &t(&[S, N, E])?,
                    &t(&[S + 1, N, E])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &["key's sequence and batch dims [4, 2] do not match value's [5, 2]"],
        },
        Case {
            name: "unbatched key and value lengths differ",
            run: || {
                let m = default_module()?;
                call(
                    &m,
                    &t(&[L, E])?,
                    &t(&[S, E])?,
                    &t(&[S + 1, E])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &["key's sequence and batch dims [4] do not match value's [5]"],
        },
        Case {
            name: "key and value batch differ",
            run: || {
                let m = default_module()?;
                call(
                    &m,
                    &t(&[L, N, E])?,
                    &t(&[S, N, E])?,
                    &t(&[S, N + 1, E])?,
                    &AttentionOptions::new(),
                )
            },
            expect: &["key's sequence and batch dims [4, 2] do not match value's [4, 3]"],
        },
        Case {
            name: "query/key batch differ (seq-first)",
            run: || {
                let m = default_module()?;
                let kv = t(&[S, N + 1, E])?;
                call(&m, &t(&[L, N, E])?, &kv, &kv, &AttentionOptions::new())
            },
            expect: &[
                "query batch size 2 does not match key batch size 3",
                "[3, 2, 8]",
                "[4, 3, 8]",
                "batch_first=false",
            ],
        },
        Case {
            name: "query/key batch differ (batch_first)",
            run: || {
                let m = module(MultiheadAttentionConfig::new(E, H).with_batch_first(true))?;
                let kv = t(&[N + 1, S, E])?;
                call(&m, &t(&[N, L, E])?, &kv, &kv, &AttentionOptions::new())
            },
            expect: &[
                "query batch size 2 does not match key batch size 3",
                "[2, 3, 8]",
                "[3, 4, 8]",
                "batch_first=true",
            ],
        },
    ]
}
