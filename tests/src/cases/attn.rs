//! flash_attn_ext: head dims 64, 128 and 80; GQA ratios 1, 3 and 4; 1, 7 and 32 queries;
//! 1, 113 and 512 keys; f16 and f32 k/v; with and without masks, softcap and ALiBi. Large cases
//! at model shapes (Llama-8B: 8 KV heads of 128 with 4 query heads each; SmolLM2-135M: 3 of 64
//! with 3 each): decoding over 768 to 16384 keys, and a 512-token prompt under a causal mask.

use tessera_core::DType;

use crate::case::{Case, Tolerance};
use crate::init::Init;

/// One flash_attn_ext case's parameters (ggml's names).
#[derive(Clone, Copy)]
pub(super) struct FlashAttn {
    /// Head dim of q and k.
    pub hsk: usize,
    /// Head dim of v.
    pub hsv: usize,
    /// kv heads.
    pub nh: usize,
    /// Query heads per kv head.
    pub nr: usize,
    /// Keys.
    pub kv: usize,
    /// Queries.
    pub nb: usize,
    /// Batch (dim 3).
    pub batch: usize,
    pub mask: Option<DType>,
    pub max_bias: f32,
    pub softcap: f32,
    pub type_kv: DType,
}

impl FlashAttn {
    pub(super) fn case(self) -> Case {
        self.build(false)
    }

    /// The case with a causal mask, as a prompt sees it: query i (of nb, the last nb of the kv
    /// positions) attends to keys 0 ..= kv - nb + i. `mask` gives the mask's type (f16 when
    /// unset); it is made in the graph (diag_mask_inf of random values, then a cast), so the
    /// case also times those two small ops.
    pub(super) fn causal_case(self) -> Case {
        self.build(true)
    }

    fn build(self, causal: bool) -> Case {
        let FlashAttn {
            hsk,
            hsv,
            nh,
            nr,
            kv,
            nb,
            batch,
            mask,
            max_bias,
            softcap,
            type_kv,
        } = self;
        let mask = if causal {
            Some(mask.unwrap_or(DType::F16))
        } else {
            mask
        };
        let params = format!(
            "hsk={hsk},hsv={hsv},nh={nh},nr={nr},kv={kv},nb={nb},batch={batch},mask={}{},max_bias={max_bias},logit_softcap={softcap},type_KV={type_kv}",
            mask.map_or("none", |t| t.name()),
            if causal { "-causal" } else { "" }
        );
        let heads = nh * nr;
        let flops = 2.0 * (nb * kv * (hsk + hsv) * heads * batch) as f64;
        let mut types = vec![DType::F32, type_kv];
        types.extend(mask);
        let n_past = kv.saturating_sub(nb);
        Case::new(
            "FLASH_ATTN_EXT",
            params,
            &types,
            Tolerance::MATMUL,
            move |g| {
                let q = g.leaf(DType::F32, &[hsk, nb, heads, batch])?;
                let k = g.leaf(type_kv, &[hsk, kv, nh, batch])?;
                let v = g.leaf(type_kv, &[hsv, kv, nh, batch])?;
                let m = match mask {
                    Some(t) if causal => {
                        let m = g.leaf(DType::F32, &[kv, nb, 1, 1])?;
                        let m = g.diag_mask_inf(m, n_past)?;
                        Some(g.cast(m, t)?)
                    }
                    Some(t) => Some(g.input(t, &[kv, nb, 1, 1], Init::Mask(0.2))?),
                    None => None,
                };
                g.flash_attn_ext(q, k, v, m, 1.0 / (hsk as f32).sqrt(), max_bias, softcap)
            },
        )
        .with_flops(flops)
    }
}

/// Every flash_attn_ext case: the full grid of head dims, GQA ratios, query and key counts,
/// with the other options varied across it, then the large model-shaped cases.
pub(super) fn cases(v: &mut Vec<Case>) {
    let mut i = 0usize;
    for hs in [64, 128, 80] {
        for nr in [1, 3, 4] {
            for nb in [1, 7, 32] {
                for kv in [1, 113, 512] {
                    let mask = match (i + i / 3 + i / 9) % 3 {
                        0 => None,
                        1 => Some(DType::F16),
                        _ => Some(DType::F32),
                    };
                    let c = FlashAttn {
                        hsk: hs,
                        hsv: hs,
                        nh: 2,
                        nr,
                        kv,
                        nb,
                        batch: 1,
                        mask,
                        max_bias: if mask.is_some() && i % 4 == 1 {
                            8.0
                        } else {
                            0.0
                        },
                        softcap: if i % 5 == 2 { 50.0 } else { 0.0 },
                        type_kv: if i.is_multiple_of(2) {
                            DType::F16
                        } else {
                            DType::F32
                        },
                    }
                    .case();
                    v.push(if nb == 32 && kv == 512 { c.large() } else { c });
                    i += 1;
                }
            }
        }
    }
    // Batched, and a v head size other than k's.
    for (hsk, hsv, batch) in [(64, 64, 2), (128, 64, 1)] {
        for type_kv in [DType::F16, DType::F32] {
            let base = FlashAttn {
                hsk,
                hsv,
                nh: 2,
                nr: 2,
                kv: 113,
                nb: 7,
                batch,
                mask: Some(DType::F16),
                max_bias: 0.0,
                softcap: 0.0,
                type_kv,
            };
            v.push(base.case());
        }
    }
    // Model shapes: decoding one token (f16 K/V from the cache, f16 mask) and a causal prompt.
    let model = |hs: usize, nh: usize, nr: usize, kv: usize, nb: usize| FlashAttn {
        hsk: hs,
        hsv: hs,
        nh,
        nr,
        kv,
        nb,
        batch: 1,
        mask: Some(DType::F16),
        max_bias: 0.0,
        softcap: 0.0,
        type_kv: DType::F16,
    };
    for kv in [768, 4096, 16384] {
        v.push(model(128, 8, 4, kv, 1).case().large());
    }
    v.push(model(64, 3, 3, 768, 1).case().large());
    // Decoding kernels' other shapes, with splits: two tokens of four heads a KV head (8 rows),
    // and two sequences (a batch).
    v.push(model(64, 2, 4, 600, 2).case());
    v.push(
        FlashAttn {
            batch: 2,
            ..model(128, 2, 2, 700, 1)
        }
        .case(),
    );
    v.push(model(128, 8, 4, 512, 512).causal_case().large());
    v.push(model(64, 3, 3, 512, 512).causal_case().large());
}
