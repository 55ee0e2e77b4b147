//! Loading parameters: missing, extra and misshapen tensors.

#[allow(unused_imports)]
use super::*;

pub fn cases() -> Vec<Case> {
    vec![
        // ---- Loading parameters --------------------------------------------------------
        Case {
            name: "VarBuilder: in_proj_weight wrong shape",
            run: || {
                let cfg = MultiheadAttentionConfig::new(E, H);
                let mut sd = state_dict(&cfg)?;
                sd.insert("in_proj_weight".into(), t(&[E, E])?);
                load(cfg, sd).map(|_| ())
            },
            expect: &[
                "shape mismatch for in_proj_weight",
                "expected: [24, 8]",
                "got: [8, 8]",
            ],
        },
        Case {
            name: "VarBuilder: in_proj_weight missing",
            run: || {
                let cfg = MultiheadAttentionConfig::new(E, H);
                let mut sd = state_dict(&cfg)?;
                sd.remove("in_proj_weight");
                load(cfg, sd).map(|_| ())
            },
            expect: &["cannot find tensor in_proj_weight"],
        },
        Case {
            name: "VarBuilder: in_proj_weight missing under a prefix",
            run: || {
                let cfg = MultiheadAttentionConfig::new(E, H);
                let sd: HashMap<String, Tensor> = state_dict(&cfg)?
                    .into_iter()
                    .filter(|(k, _)| k != "in_proj_weight")
                    .map(|(k, v)| (format!("attn.{k}"), v))
                    .collect();
                let vb = VarBuilder::from_tensors(sd, DType::F32, &dev());
                MultiheadAttention::new(cfg, vb.pp("attn")).map(|_| ())
            },
            expect: &["cannot find tensor attn.in_proj_weight"],
        },
        Case {
            name: "VarBuilder: bias_k missing with add_bias_kv",
            run: || {
                let cfg = MultiheadAttentionConfig::new(E, H).with_add_bias_kv(true);
                let mut sd = state_dict(&cfg)?;
                sd.remove("bias_k");
                load(cfg, sd).map(|_| ())
            },
            expect: &["cannot find tensor bias_k"],
        },
        Case {
            name: "VarBuilder: bias_v wrong shape",
            run: || {
                let cfg = MultiheadAttentionConfig::new(E, H).with_add_bias_kv(true);
                let mut sd = state_dict(&cfg)?;
                sd.insert("bias_v".into(), t(&[E])?);
                load(cfg, sd).map(|_| ())
            },
            expect: &[
                "shape mismatch for bias_v",
                "expected: [1, 1, 8]",
                "got: [8]",
            ],
        },
        Case {
            name: "VarBuilder: k_proj_weight wrong shape (separate weights)",
            run: || {
                let cfg = MultiheadAttentionConfig::new(E, H).with_kdim(5);
                let mut sd = state_dict(&cfg)?;
                sd.insert("k_proj_weight".into(), t(&[E, E])?);
                load(cfg, sd).map(|_| ())
            },
            expect: &[
                "shape mismatch for k_proj_weight",
                "expected: [8, 5]",
                "got: [8, 8]",
            ],
        },
        Case {
            name: "VarBuilder: packed checkpoint loaded as separate weights",
            run: || {
                let sd = state_dict(&MultiheadAttentionConfig::new(E, H))?;
                load(MultiheadAttentionConfig::new(E, H).with_vdim(5), sd).map(|_| ())
            },
            expect: &["cannot find tensor q_proj_weight"],
        },
        Case {
            name: "VarBuilder: out_proj.bias missing",
            run: || {
                let cfg = MultiheadAttentionConfig::new(E, H);
                let mut sd = state_dict(&cfg)?;
                sd.remove("out_proj.bias");
                load(cfg, sd).map(|_| ())
            },
            expect: &["cannot find tensor out_proj.bias"],
        },
    ]
}
