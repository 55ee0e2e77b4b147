//! Masks: wrong shapes and dtypes.

#[allow(unused_imports)]
use super::*;

pub fn cases() -> Vec<Case> {
    vec![
        // ---- Mask shapes ---------------------------------------------------------------
        Case {
            name: "unbatched 3-D attn_mask (1, L, S) instead of (H, L, S)",
            run: || unbatched_with(attn_mask(td(&[1, L, S], DType::U8)?)),
            expect: &[
                "3D attn_mask is [1, 3, 4]",
                "should be [2, 3, 4]",
                "(num_heads, L, S)",
            ],
        },
        Case {
            name: "2-D attn_mask wrong S",
            run: || batched_with(attn_mask(td(&[L, S + 1], DType::U8)?)),
            expect: &[
                "The shape of the 2D attn_mask is [3, 5], but should be [3, 4]",
                "(L, S)",
            ],
        },
        Case {
            name: "2-D attn_mask with L and S swapped",
            run: || batched_with(attn_mask(td(&[S, L], DType::U8)?)),
            expect: &["The shape of the 2D attn_mask is [4, 3], but should be [3, 4]"],
        },
        Case {
            name: "unbatched 2-D attn_mask wrong shape",
            run: || unbatched_with(attn_mask(td(&[L, L], DType::F32)?)),
            expect: &["2D attn_mask is [3, 3], but should be [3, 4]"],
        },
        Case {
            name: "3-D attn_mask wrong first dim (H instead of N*H)",
            run: || batched_with(attn_mask(td(&[H, L, S], DType::U8)?)),
            expect: &[
                "The shape of the 3D attn_mask is [2, 3, 4], but should be [4, 3, 4]",
                "(N*num_heads, L, S)",
            ],
        },
        Case {
            name: "3-D attn_mask wrong first dim, batch_first",
            run: || {
                let m = module(MultiheadAttentionConfig::new(E, H).with_batch_first(true))?;
                let opts = attn_mask(td(&[N * H + 1, L, S], DType::U8)?);
                call(&m, &t(&[N, L, E])?, &t(&[N, S, E])?, &t(&[N, S, E])?, &opts)
            },
            expect: &["3D attn_mask is [5, 3, 4], but should be [4, 3, 4]"],
        },
        Case {
            name: "batched key_padding_mask wrong S",
            run: || batched_with(kpm(td(&[N, S + 1], DType::U8)?)),
            expect: &[
                "Expected key_padding_mask shape [2, 4]",
                "(N, S)",
                "but got [2, 5]",
            ],
        },
        Case {
            name: "batched key_padding_mask (S, N) instead of (N, S)",
            run: || batched_with(kpm(td(&[S, N], DType::U8)?)),
            expect: &[
                "Expected key_padding_mask shape [2, 4]",
                "(N, S)",
                "but got [4, 2]",
            ],
        },
        Case {
            name: "unbatched key_padding_mask wrong S",
            run: || unbatched_with(kpm(td(&[S + 1], DType::U8)?)),
            expect: &["Expected key_padding_mask shape [4]", "(S)", "but got [5]"],
        },
        // ---- Mask dtypes ---------------------------------------------------------------
        Case {
            name: "attn_mask i64",
            run: || batched_with(attn_mask(td(&[L, S], DType::I64)?)),
            expect: &["floating types of attn_mask are supported", "I64"],
        },
        Case {
            name: "attn_mask u32",
            run: || batched_with(attn_mask(td(&[L, S], DType::U32)?)),
            expect: &["floating types of attn_mask are supported", "U32"],
        },
        Case {
            name: "key_padding_mask i64",
            run: || batched_with(kpm(td(&[N, S], DType::I64)?)),
            expect: &["floating types of key_padding_mask are supported", "I64"],
        },
        Case {
            name: "key_padding_mask u32",
            run: || batched_with(kpm(td(&[N, S], DType::U32)?)),
            expect: &["floating types of key_padding_mask are supported", "U32"],
        },
        Case {
            name: "float attn_mask f64 with f32 query",
            run: || batched_with(attn_mask(td(&[L, S], DType::F64)?)),
            expect: &["float attn_mask has dtype F64 but query has F32"],
        },
        Case {
            name: "float attn_mask f16 with f32 query",
            run: || batched_with(attn_mask(td(&[L, S], DType::F16)?)),
            expect: &["float attn_mask has dtype F16 but query has F32"],
        },
        Case {
            name: "float key_padding_mask f64 with f32 query",
            run: || batched_with(kpm(td(&[N, S], DType::F64)?)),
            expect: &["float key_padding_mask has dtype F64 but query has F32"],
        },
    ]
}
