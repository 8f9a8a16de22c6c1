//! The ops gpt-oss adds: flash_attn_ext with attention sinks (one logit per query head in each
//! row's soft-max, no value) and the clamped SwiGLU (swiglu_oai).
//!
//! The sink cases cover what each backend's attention paths see: decoding one or two tokens
//! over short and long caches (GPU kernels split the keys, so the sink must enter once, not
//! once per split), prompts of 7 to 40 rows (tiled and tensor-core kernels), f16 and f32 K/V,
//! GQA ratios 1, 4 and 8, no mask, a causal mask and gpt-oss's sliding window, a softcap, and
//! sinks small beside the scores, large beside them (the sink takes most of the weight) and
//! far below them (no effect). The SwiGLU cases put values on both sides of the clamps.

use tessera_core::DType;

use crate::case::{Case, Tolerance};
use crate::init::Init;

/// How a sink case masks the keys.
#[derive(Clone, Copy)]
enum Masking {
    None,
    Causal,
    Window(usize),
}

/// One flash_attn_ext case with sinks.
#[derive(Clone, Copy)]
struct Sinks {
    /// Head size of q, k and v.
    hs: usize,
    /// KV heads.
    nh: usize,
    /// Query heads per KV head.
    nr: usize,
    /// Keys.
    kv: usize,
    /// Queries.
    nb: usize,
    type_kv: DType,
    masking: Masking,
    softcap: f32,
    /// The range the sinks are drawn from.
    sinks: (f32, f32),
}

impl Sinks {
    fn case(self) -> Case {
        let Sinks {
            hs,
            nh,
            nr,
            kv,
            nb,
            type_kv,
            masking,
            softcap,
            sinks,
        } = self;
        let mask = match masking {
            Masking::None => "none".to_string(),
            Masking::Causal => "causal".into(),
            Masking::Window(w) => format!("window{w}"),
        };
        let params = format!(
            "hs={hs},nh={nh},nr={nr},kv={kv},nb={nb},type_KV={type_kv},mask={mask},logit_softcap={softcap},sinks=[{},{})",
            sinks.0, sinks.1
        );
        let heads = nh * nr;
        let flops = 4.0 * (nb * kv * hs * heads) as f64;
        let mut types = vec![DType::F32, type_kv];
        if !matches!(masking, Masking::None) {
            types.push(DType::F16);
        }
        let n_past = kv.saturating_sub(nb);
        Case::new(
            "FLASH_ATTN_EXT",
            params,
            &types,
            Tolerance::MATMUL,
            move |g| {
                let q = g.leaf(DType::F32, &[hs, nb, heads, 1])?;
                let k = g.leaf(type_kv, &[hs, kv, nh, 1])?;
                let v = g.leaf(type_kv, &[hs, kv, nh, 1])?;
                let m = match masking {
                    Masking::None => None,
                    Masking::Causal => {
                        let m = g.leaf(DType::F32, &[kv, nb, 1, 1])?;
                        let m = g.diag_mask_inf(m, n_past)?;
                        Some(g.cast(m, DType::F16)?)
                    }
                    Masking::Window(window) => Some(g.input(
                        DType::F16,
                        &[kv, nb, 1, 1],
                        Init::Window { n_past, window },
                    )?),
                };
                let s = g.input(DType::F32, &[heads], Init::Uniform(sinks.0, sinks.1))?;
                let scale = 1.0 / (hs as f32).sqrt();
                g.flash_attn_ext_sinks(q, k, v, m, s, scale, 0.0, softcap)
            },
        )
        .with_flops(flops)
    }
}

/// One swiglu_oai case: gate and up of shape `ne`, uniform in [-range, range).
fn swiglu_oai(ne: [usize; 3], range: f32, alpha: f32, limit: f32) -> Case {
    Case::new(
        "SWIGLU_OAI",
        format!(
            "ne=[{},{},{}],range={range},alpha={alpha},limit={limit}",
            ne[0], ne[1], ne[2]
        ),
        &[DType::F32],
        Tolerance::DEFAULT,
        move |g| {
            let gate = g.input(DType::F32, &ne, Init::Uniform(-range, range))?;
            let up = g.input(DType::F32, &ne, Init::Uniform(-range, range))?;
            g.swiglu_oai(gate, up, alpha, limit)
        },
    )
}

/// Every case of the family.
pub(super) fn cases(v: &mut Vec<Case>) {
    let base = Sinks {
        hs: 64,
        nh: 2,
        nr: 4,
        kv: 113,
        nb: 1,
        type_kv: DType::F16,
        masking: Masking::Causal,
        softcap: 0.0,
        sinks: (-2.0, 2.0),
    };
    // Every shape at small sinks, f16 and f32 K/V.
    for (i, (nr, kv, nb)) in [
        (1, 1, 1),
        (4, 113, 1),
        (4, 113, 2),
        (8, 300, 1),
        (1, 113, 7),
        (4, 90, 20),
        (8, 48, 40),
    ]
    .into_iter()
    .enumerate()
    {
        for type_kv in [DType::F16, DType::F32] {
            let masking = match i % 3 {
                0 => Masking::Causal,
                1 => Masking::Window(64),
                _ => Masking::None,
            };
            v.push(
                Sinks {
                    nr,
                    kv,
                    nb,
                    type_kv,
                    masking,
                    ..base
                }
                .case(),
            );
        }
    }
    // Sinks that dominate the scores, and sinks far below them.
    v.push(
        Sinks {
            sinks: (3.0, 6.0),
            ..base
        }
        .case(),
    );
    v.push(
        Sinks {
            sinks: (3.0, 6.0),
            nb: 24,
            kv: 64,
            ..base
        }
        .case(),
    );
    v.push(
        Sinks {
            sinks: (-30.0, -20.0),
            ..base
        }
        .case(),
    );
    // A softcap, and head size 128.
    v.push(
        Sinks {
            softcap: 30.0,
            ..base
        }
        .case(),
    );
    v.push(
        Sinks {
            hs: 128,
            nb: 7,
            ..base
        }
        .case(),
    );
    // Decoding over long caches (GPU kernels split the keys): gpt-oss's shape (8 query heads a
    // KV head of 64) under its 128-key window and over the whole cache, and 1000 keys.
    let decode = Sinks {
        nr: 8,
        kv: 700,
        ..base
    };
    v.push(decode.case());
    v.push(
        Sinks {
            masking: Masking::Window(128),
            ..decode
        }
        .case(),
    );
    v.push(
        Sinks {
            kv: 1000,
            nb: 2,
            masking: Masking::None,
            ..decode
        }
        .case(),
    );
    // A prompt at gpt-oss's head shape.
    v.push(
        Sinks {
            nh: 2,
            nr: 8,
            kv: 256,
            nb: 256,
            masking: Masking::Window(128),
            ..base
        }
        .case()
        .large(),
    );

    for (ne, range, alpha, limit) in [
        ([64, 4, 1], 10.0, 1.702, 7.0),
        ([37, 3, 2], 10.0, 1.702, 7.0),
        ([2880, 1, 1], 12.0, 1.702, 7.0),
        ([128, 9, 1], 3.0, 1.0, 2.0),
    ] {
        v.push(swiglu_oai(ne, range, alpha, limit));
    }
}
