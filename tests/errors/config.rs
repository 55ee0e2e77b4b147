//! Configuration: invalid `MultiheadAttentionConfig`s.

#[allow(unused_imports)]
use super::*;

pub fn cases() -> Vec<Case> {
    vec![
        // ---- Configuration -------------------------------------------------------------
        Case {
            name: "config: embed_dim 0",
            run: || module(MultiheadAttentionConfig::new(0, 2)).map(|_| ()),
            expect: &[
                "embed_dim and num_heads must be greater than 0",
                "embed_dim=0",
            ],
        },
        Case {
            name: "config: num_heads 0",
            run: || module(MultiheadAttentionConfig::new(8, 0)).map(|_| ()),
            expect: &[
                "embed_dim and num_heads must be greater than 0",
                "num_heads=0",
            ],
        },
        Case {
            name: "config: embed_dim not divisible by num_heads",
            run: || module(MultiheadAttentionConfig::new(8, 3)).map(|_| ()),
            expect: &[
                "embed_dim must be divisible by num_heads",
                "embed_dim=8",
                "num_heads=3",
            ],
        },
        Case {
            name: "config: num_heads > embed_dim",
            run: || module(MultiheadAttentionConfig::new(2, 4)).map(|_| ()),
            expect: &[
                "embed_dim must be divisible by num_heads",
                "embed_dim=2",
                "num_heads=4",
            ],
        },
        Case {
            name: "config: kdim 0",
            run: || module(MultiheadAttentionConfig::new(E, H).with_kdim(0)).map(|_| ()),
            expect: &["kdim must be greater than 0", "kdim=0"],
        },
        Case {
            name: "config: vdim 0",
            run: || module(MultiheadAttentionConfig::new(E, H).with_vdim(0)).map(|_| ()),
            expect: &["vdim must be greater than 0", "vdim=0"],
        },
        Case {
            name: "config: dropout 1.5",
            run: || module(MultiheadAttentionConfig::new(E, H).with_dropout(1.5)).map(|_| ()),
            expect: &[
                "dropout probability has to be between 0 and 1",
                "but got 1.5",
            ],
        },
        Case {
            name: "config: dropout -0.1",
            run: || module(MultiheadAttentionConfig::new(E, H).with_dropout(-0.1)).map(|_| ()),
            expect: &[
                "dropout probability has to be between 0 and 1",
                "but got -0.1",
            ],
        },
        Case {
            name: "config: dropout NaN",
            run: || module(MultiheadAttentionConfig::new(E, H).with_dropout(f64::NAN)).map(|_| ()),
            expect: &[
                "dropout probability has to be between 0 and 1",
                "but got NaN",
            ],
        },
        Case {
            name: "config: validate() alone, dropout 1.5",
            run: || {
                MultiheadAttentionConfig::new(E, H)
                    .with_dropout(1.5)
                    .validate()
            },
            expect: &["dropout probability has to be between 0 and 1", "1.5"],
        },
    ]
}
