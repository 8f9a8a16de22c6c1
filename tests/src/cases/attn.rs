//! flash_attn_ext: head dims 64, 128 and 80; GQA ratios 1, 3 and 4; 1, 7 and 32 queries;
//! 1, 113 and 512 keys; f16 and f32 k/v; with and without masks, softcap and ALiBi. Large cases
//! at model shapes (Llama-8B: 8 KV heads of 128 with 4 query heads each; SmolLM2-135M: 3 of 64
//! with 3 each): decoding over 768 to 16384 keys, and a 512-token prompt under a causal mask.
//! Decoding one or two tokens over 512 to 1024 keys with few heads, where the keys are cut into
//! splits (wgpu's split decode), some under a mask that hides a run of keys longer than a split.
//! The newer architectures' shapes: head sizes 256 and 96, GQA 8, logit softcap, and
//! sliding-window masks. Block-sparse masks (`paged`), as a KV cache shared by sequences in
//! pages gives: whole key tiles hidden from some query rows, which the kernels skip.

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
        self.build(Masking::Random)
    }

    /// The case with a causal mask, as a prompt sees it: query i (of nb, the last nb of the kv
    /// positions) attends to keys 0 ..= kv - nb + i. `mask` gives the mask's type (f16 when
    /// unset); it is made in the graph (diag_mask_inf of random values, then a cast), so the
    /// case also times those two small ops.
    pub(super) fn causal_case(self) -> Case {
        self.build(Masking::Causal)
    }

    /// The case with a random mask (of type `mask`, f16 when unset) that also hides keys
    /// `from .. to` of every query: a split of the keys that lies inside them has no key left.
    pub(super) fn span_case(self, from: usize, to: usize) -> Case {
        self.build(Masking::Span(from, to))
    }

    /// The case under a sliding-window causal mask (of type `mask`, f16 when unset): query i
    /// sees the `window` keys up to its own position, as in [`FlashAttn::causal_case`].
    pub(super) fn window_case(self, window: usize) -> Case {
        self.build(Masking::Window(window))
    }

    /// The case under `masking`.
    fn build(self, masking: Masking) -> Case {
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
        let mask = match masking {
            Masking::Random => mask,
            _ => Some(mask.unwrap_or(DType::F16)),
        };
        let kind = match masking {
            Masking::Random => String::new(),
            Masking::Causal => "-causal".into(),
            Masking::Span(from, to) => format!("-hiding{from}..{to}"),
            Masking::Window(w) => format!("-window{w}"),
        };
        let params = format!(
            "hsk={hsk},hsv={hsv},nh={nh},nr={nr},kv={kv},nb={nb},batch={batch},mask={}{kind},max_bias={max_bias},logit_softcap={softcap},type_KV={type_kv}",
            mask.map_or("none", |t| t.name()),
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
                let m = match (mask, masking) {
                    (Some(t), Masking::Causal) => {
                        let m = g.leaf(DType::F32, &[kv, nb, 1, 1])?;
                        let m = g.diag_mask_inf(m, n_past)?;
                        Some(g.cast(m, t)?)
                    }
                    (Some(t), Masking::Span(from, to)) => {
                        Some(g.input(t, &[kv, nb, 1, 1], Init::MaskSpan(0.2, from, to))?)
                    }
                    (Some(t), Masking::Window(window)) => {
                        Some(g.input(t, &[kv, nb, 1, 1], Init::Window { n_past, window })?)
                    }
                    (Some(t), Masking::Random) => {
                        Some(g.input(t, &[kv, nb, 1, 1], Init::Mask(0.2))?)
                    }
                    (None, _) => None,
                };
                g.flash_attn_ext(q, k, v, m, 1.0 / (hsk as f32).sqrt(), max_bias, softcap)
            },
        )
        .with_flops(flops)
    }
}

/// How a case masks the keys.
#[derive(Clone, Copy)]
enum Masking {
    /// A random mask (`Init::Mask`), or none.
    Random,
    /// A causal mask over the last queries.
    Causal,
    /// A random mask that also hides keys `from .. to` (`Init::MaskSpan`).
    Span(usize, usize),
    /// A sliding window of this many keys ending at each query's position (`Init::Window`).
    Window(usize),
}

/// flash_attn_ext under a block-sparse mask ([`Init::Pages`]): q `[hs, nq, nh * nr, batch]`,
/// k and v `[hs, kv, nh, 1]` (of `types[1]`: f16 as a KV cache, or f32) shared by every batch,
/// the mask (of `types[0]`) `[kv, nq, 1, batch]` of `seqs` sequences in pages of `page` keys,
/// each run of `run` consecutive query rows one sequence's tokens. With one query per batch
/// this is a batched decoding step whose tokens are each their own batch.
#[allow(clippy::too_many_arguments)]
fn paged(
    hs: usize,
    [nh, nr]: [usize; 2],
    [nq, batch]: [usize; 2],
    kv: usize,
    page: usize,
    seqs: usize,
    run: usize,
    [mask_type, type_kv]: [DType; 2],
) -> Case {
    let params = format!(
        "hsk={hs},hsv={hs},nh={nh},nr={nr},kv={kv},nb={nq},batch={batch},mask={}-pages{page}x{seqs}-run{run},max_bias=0,logit_softcap=0,type_KV={type_kv},kv_batch=1",
        mask_type.name()
    );
    let flops = 2.0 * (nq * kv * 2 * hs * nh * nr * batch) as f64;
    Case::new(
        "FLASH_ATTN_EXT",
        params,
        &[DType::F32, type_kv, mask_type],
        Tolerance::MATMUL,
        move |g| {
            let q = g.leaf(DType::F32, &[hs, nq, nh * nr, batch])?;
            let k = g.leaf(type_kv, &[hs, kv, nh, 1])?;
            let v = g.leaf(type_kv, &[hs, kv, nh, 1])?;
            let init = Init::Pages { page, seqs, run };
            let m = g.input(mask_type, &[kv, nq, 1, batch], init)?;
            g.flash_attn_ext(q, k, v, Some(m), 1.0 / (hs as f32).sqrt(), 0.0, 0.0)
        },
    )
    .with_flops(flops)
}

/// Every flash_attn_ext case: the full grid of head dims, GQA ratios, query and key counts,
/// with the other options varied across it, then the large model-shaped cases.
pub(super) fn cases(v: &mut Vec<Case>) {
    // Batched decoding over a shared paged cache: 16 tokens (each its own batch) of 4 sequences
    // in pages of 256 and of 64 keys over 8 KV heads of 4 query heads (the Llama-8B shape) and
    // over one KV head of 4 (head size 64); a last page shorter than the others.
    let (f16, f32) = (DType::F16, DType::F32);
    v.push(paged(128, [8, 4], [1, 16], 2048, 256, 4, 1, [f16, f16]));
    v.push(paged(64, [1, 4], [1, 16], 1000, 64, 5, 1, [f32, f16]));
    // Prompt chunks of several sequences in one batch: runs of 64 and of 16 query rows (a
    // tensor-core tile of one sequence, and four sequences in a tile).
    v.push(paged(64, [2, 1], [192, 1], 1024, 64, 3, 64, [f16, f16]));
    v.push(paged(128, [2, 4], [64, 1], 960, 128, 4, 16, [f16, f16]));
    // f32 K and V (the other kernels): two rows of a KV head per token, and a head size of 80
    // with runs of 16 query rows.
    v.push(paged(64, [2, 2], [1, 8], 512, 64, 3, 1, [f16, f32]));
    v.push(paged(80, [1, 2], [48, 1], 384, 32, 3, 16, [f16, f32]));
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
    // Batched, and a v head size other than k's: 7 query rows (decoding kernels) and 40
    // (prompt kernels).
    for (hsk, hsv, batch, nb) in [
        (64, 64, 2, 7),
        (128, 64, 1, 7),
        (64, 64, 2, 40),
        (128, 64, 1, 40),
    ] {
        for type_kv in [DType::F16, DType::F32] {
            let base = FlashAttn {
                hsk,
                hsv,
                nh: 2,
                nr: 2,
                kv: 113,
                nb,
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
    // Head size 36: f16 rows of 72 bytes, not whole 16-byte chunks (wgpu's decode then reads
    // them word by word), in one pass and in splits.
    v.push(model(36, 2, 4, 300, 1).case());
    v.push(model(36, 2, 4, 1000, 1).span_case(5, 600));
    v.push(
        FlashAttn {
            batch: 2,
            ..model(128, 2, 2, 700, 1)
        }
        .case(),
    );
    // Split decoding at sizes a software device runs quickly: 2 KV heads of 4 query heads, one
    // or two tokens, head dims 64 and 128, f16 and f32 K/V. With wgpu's default split (8 or 16
    // rows and heads over 512 to 1024 keys: 2 to 4 splits of 256 keys) and with 3 splits, the
    // hidden keys hold whole splits.
    let split = |hs: usize, kv: usize, nb: usize, type_kv: DType, mask: Option<DType>| FlashAttn {
        hsk: hs,
        hsv: hs,
        nh: 2,
        nr: 4,
        kv,
        nb,
        batch: 1,
        mask,
        max_bias: 0.0,
        softcap: 0.0,
        type_kv,
    };
    v.push(split(128, 1024, 1, DType::F16, Some(DType::F16)).span_case(300, 1000));
    v.push(split(64, 512, 2, DType::F32, Some(DType::F32)).span_case(200, 512));
    v.push(split(64, 1024, 1, DType::F16, Some(DType::F32)).span_case(1, 700));
    v.push(
        FlashAttn {
            max_bias: 8.0,
            softcap: 50.0,
            ..split(128, 700, 2, DType::F32, Some(DType::F16))
        }
        .case(),
    );
    v.push(split(64, 1000, 1, DType::F16, None).case());
    v.push(model(128, 8, 4, 512, 512).causal_case().large());
    v.push(model(64, 3, 3, 512, 512).causal_case().large());
    gpu_paths(v);
    architectures(v);
}

/// The attention shapes of the newer architectures, decoding (one token over a longer cache,
/// which GPU kernels split) and a short prompt: Gemma 3 (head size 256, four query heads a KV
/// head, sliding-window layers), Gemma 2 (head size 256, logit softcap 50, sliding window),
/// Phi 3 (head size 96, no GQA) and GQA ratio 8 (Llama 3 70B's, Qwen's).
fn architectures(v: &mut Vec<Case>) {
    let arch = |hs: usize, nh: usize, nr: usize, kv: usize, nb: usize| FlashAttn {
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
    // Gemma 3: the window hides keys at the start of long caches and (for a prompt) after
    // each query's position.
    v.push(arch(256, 1, 4, 700, 1).window_case(512));
    v.push(arch(256, 1, 4, 48, 40).window_case(16));
    v.push(arch(256, 1, 4, 300, 2).causal_case());
    // Gemma 2: softcap on window and global layers.
    let gemma2 = |kv, nb| FlashAttn {
        softcap: 50.0,
        ..arch(256, 2, 2, kv, nb)
    };
    v.push(gemma2(600, 1).window_case(256));
    v.push(gemma2(40, 40).window_case(24));
    v.push(gemma2(300, 1).causal_case());
    // Phi 3: head size 96, f16 and f32 K/V.
    v.push(arch(96, 4, 1, 500, 1).causal_case());
    v.push(arch(96, 4, 1, 40, 40).causal_case());
    v.push(
        FlashAttn {
            type_kv: DType::F32,
            ..arch(96, 2, 1, 90, 7)
        }
        .causal_case(),
    );
    // GQA 8.
    v.push(arch(128, 1, 8, 800, 1).causal_case());
    v.push(arch(128, 2, 8, 30, 24).causal_case());
    v.push(arch(64, 1, 8, 200, 2).window_case(100));
}

/// Shapes that take each of the CUDA backend's attention kernels in turn (see
/// backend-cuda/src/ops/attention.rs): f16 decoding of one token with splits merged in a
/// thread-block cluster, and with more splits than a cluster holds (merged by the last block);
/// the generic tiled kernel (f32 K/V, many rows, a batch); the tensor-core prompt kernel (f16,
/// 60 rows a KV head, ALiBi); a v head size other than k's with a softcap; and head size 256.
fn gpu_paths(v: &mut Vec<Case>) {
    // Decoding: one token of 8 heads over 2 KV heads, 300 keys of f16.
    let dec = FlashAttn {
        hsk: 64,
        hsv: 64,
        nh: 2,
        nr: 4,
        kv: 300,
        nb: 1,
        batch: 1,
        mask: Some(DType::F16),
        max_bias: 0.0,
        softcap: 0.0,
        type_kv: DType::F16,
    };
    v.push(dec.causal_case());
    // More splits than a cluster holds: 1000 keys, head size 128, no mask.
    let long = FlashAttn {
        hsk: 128,
        hsv: 128,
        nh: 8,
        kv: 1000,
        mask: None,
        ..dec
    };
    v.push(long.case());
    // The generic kernel: f32 K/V, 37 rows of 4 heads, a batch of 2.
    let generic = FlashAttn {
        nh: 4,
        nr: 1,
        kv: 90,
        nb: 37,
        batch: 2,
        mask: Some(DType::F32),
        type_kv: DType::F32,
        ..dec
    };
    v.push(generic.causal_case());
    // Tensor cores: 20 rows of 3 heads a KV head, ALiBi.
    let mma = FlashAttn {
        hsk: 128,
        hsv: 128,
        nr: 3,
        kv: 70,
        nb: 20,
        max_bias: 4.0,
        ..dec
    };
    v.push(mma.causal_case());
    // v's head size other than k's, a softcap, f32 K/V under an f16 mask.
    let softcap = FlashAttn {
        hsk: 80,
        nh: 1,
        nr: 3,
        kv: 50,
        nb: 5,
        softcap: 30.0,
        type_kv: DType::F32,
        ..dec
    };
    v.push(softcap.causal_case());
    // Head size 256.
    let wide = FlashAttn {
        hsk: 256,
        hsv: 256,
        nh: 1,
        nr: 2,
        kv: 40,
        nb: 3,
        ..dec
    };
    v.push(wide.causal_case());
}
