//! soft_max with mask, scale and ALiBi (`soft_max.wgsl`), and fused attention
//! (`flash_attn.wgsl`): one key per invocation (`main`), groups of invocations per key for a
//! few query rows (`decode`, split over the keys and merged by `decode_combine` where there
//! are few rows and heads), and cooperative matrices for prompts (`prefill`).

use tessera_core::{DType, Graph, TensorId};

use super::{aligned, per_row, Bind, Node, Params, PlanOut};
use crate::context::Gpu;
use crate::keys::{Attn, FlashAttnDecodeKey, FlashAttnKey, FlashAttnPrefillKey, Key, SoftMaxKey};
use crate::shader::Variant;

/// Head sizes flash attention is built for (the next one at or above D and DV is used).
const FA_DMAX: [u32; 4] = [64, 128, 192, 256];
/// Invocations (keys per step) of flash attention: the larger from this many keys on.
const FA_WG: [u32; 2] = [64, 256];
/// Query rows up to which flash attention runs its `decode` entry point (where k and v allow:
/// see [`fa_decode_layout`]): 32 groups of 8 invocations per row and head, each group taking
/// its own share of the keys, rather than one key per invocation.
const FA_DECODE_MAX_Q: usize = 8;
/// Query rows per workgroup of the cooperative-matrix prompt attention (`prefill`, FQ in the
/// shader), and the largest head size it takes (its staged q, k and v tiles are DMAX wide).
const FA_PREFILL_Q: usize = 64;
const FA_PREFILL_DMAX: u32 = 128;
/// Invocations per key in flash attention's `decode` (G in `shaders/flash_attn.wgsl`): its
/// subgroup operations need subgroups of at least this many.
const FA_DECODE_G: u32 = 8;
/// Workgroups the split flash attention decode aims for (about two per core of a large GPU):
/// fewer query rows and heads than this cut their keys into splits ([`fa_splits`]), since a
/// few dozen workgroups leave most of a large GPU idle.
const FA_SPLIT_GROUPS: usize = 256;
/// Fewest keys per split of the split flash attention decode: splits pay where they hold a
/// few hundred keys each (below, the merge costs more than the spread gains).
const FA_SPLIT_MIN_KEYS: usize = 256;

/// ALiBi parameters (ggml's): m0, m1 and n_head_log2 for `heads` heads.
fn alibi(p: &mut Params, max_bias: f32, heads: usize) {
    p.f[1] = max_bias;
    if max_bias > 0.0 {
        let n_log2 = 1u32 << (heads.max(1) as f32).log2().floor() as u32;
        p.f[2] = 2f32.powf(-max_bias / n_log2 as f32);
        p.f[3] = 2f32.powf(-max_bias / 2.0 / n_log2 as f32);
        p.u[2] = n_log2;
    }
}

/// soft_max of each row, with an optional mask (src1).
pub(super) fn soft_max(
    n: &Node,
    mut p: Params,
    scale: f32,
    max_bias: f32,
) -> Result<Vec<PlanOut>, String> {
    let t = n.t;
    let mask = n.srcs.get(1).map(|m| m.dtype);
    if mask.is_some_and(|m| !matches!(m, DType::F32 | DType::F16)) {
        return Err("mask type".into());
    }
    p.f[0] = scale;
    alibi(&mut p, max_bias, t.ne[2]);
    p.u[0] = t.nrows() as u32;
    p.u[1] = u32::from(mask.is_some());
    if mask.is_none() {
        p.desc[2] = [1, 1, 1, 1, 0, 0, 0, 0];
    }
    let bind = vec![n.id, t.src[0], t.src.get(1).copied().unwrap_or(n.id)];
    let key = Key::SoftMax(SoftMaxKey {
        mask: mask.unwrap_or(DType::F32),
    });
    Ok(per_row(key, bind, p, t.nrows()))
}

/// Flash attention of q (src0) over k and v (src1, src2) with an optional mask (src3) and,
/// where `sinks`, the sinks (the last source, bound as binding 5); `sbc`: its scale, max_bias
/// and logit_softcap.
pub(super) fn flash_attn(
    n: &Node,
    mut p: Params,
    sbc: [f32; 3],
    sinks: bool,
) -> Result<Vec<PlanOut>, String> {
    let (gpu, graph, id, t) = (n.gpu, n.graph, n.id, n.t);
    let [scale, max_bias, logit_softcap] = sbc;
    let (q, k, v) = (n.srcs[0], n.srcs[1], n.srcs[2]);
    let n_src = t.src.len() - usize::from(sinks);
    let mask = (n_src > 3).then(|| n.srcs[3].dtype);
    let need = q.ne[0].max(v.ne[0]) as u32;
    let Some(&dmax) = FA_DMAX.iter().find(|&&d| d >= need) else {
        return Err(format!(
            "head size {need} (at most {})",
            FA_DMAX[FA_DMAX.len() - 1]
        ));
    };
    if !matches!(k.dtype, DType::F32 | DType::F16) || !matches!(v.dtype, DType::F32 | DType::F16) {
        return Err(format!("k and v types {} and {}", k.dtype, v.dtype));
    }
    if mask.is_some_and(|m| !matches!(m, DType::F32 | DType::F16)) {
        return Err("mask type".into());
    }
    let attn = Attn {
        k: k.dtype,
        v: v.dtype,
        mask: mask.unwrap_or(DType::F32),
        dmax,
        sinks,
    };
    let groups = q.ne[1] * q.ne[2] * q.ne[3];
    p.f[0] = scale;
    alibi(&mut p, max_bias, q.ne[2]);
    p.g[0] = logit_softcap;
    p.u[0] = groups as u32;
    p.u[1] = u32::from(mask.is_some());
    p.u[3] = (q.ne[2] / k.ne[2]) as u32;
    p.h[2] = (q.ne[3] / k.ne[3]) as u32;
    if mask.is_none() {
        p.desc[4] = [1, 1, 1, 1, 0, 0, 0, 0];
    }
    let mut bind = [
        id,
        t.src[0],
        t.src[1],
        t.src[2],
        if n_src > 3 { t.src[3] } else { id },
    ]
    .map(Bind::whole)
    .to_vec();
    if sinks {
        bind.push(Bind::whole(t.src[n_src]));
    }
    let one = |key: Key, params: Params, groups: usize| {
        Ok(vec![PlanOut {
            variant: Variant::new(key),
            bind: bind.clone(),
            params,
            groups,
            groups_3d: None,
        }])
    };
    let decode = q.ne[1] <= FA_DECODE_MAX_Q
        && fa_decode_layout(gpu, graph, t.src[1])
        && fa_decode_layout(gpu, graph, t.src[2]);
    if decode {
        let mut key = FlashAttnDecodeKey {
            attn,
            subgroups: gpu.subgroups && gpu.subgroup_min >= FA_DECODE_G,
            wide: [t.src[1], t.src[2]].map(|id| fa_decode_wide(gpu, graph, id)),
            split: false,
        };
        let nkv = k.ne[1];
        let mut splits = fa_splits(groups, nkv);
        // Each split's maximum, sum and output (DV f32), in one binding.
        let scratch_bytes = groups * splits * (v.ne[0] + 2) * 4;
        if scratch_bytes > n.usable {
            splits = 1;
        }
        let per = nkv.div_ceil(splits).max(1);
        p.h[0] = splits as u32;
        p.h[1] = per as u32;
        if splits == 1 {
            return one(Key::FlashAttnDecode(key), p, groups);
        }
        // The splits' partial results go to the scratch, then one workgroup per row and head
        // merges them into dst.
        key.split = true;
        let scratch = Bind::scratch(id, scratch_bytes);
        let mut split = p;
        split.u[0] = (groups * splits) as u32;
        let mut first = bind;
        first[0] = scratch;
        return Ok(vec![
            PlanOut {
                variant: Variant::new(Key::FlashAttnDecode(key)),
                bind: first,
                params: split,
                groups: groups * splits,
                groups_3d: None,
            },
            PlanOut {
                variant: Variant::new(Key::FlashAttnCombine(dmax)),
                bind: vec![Bind::whole(id), scratch],
                params: p,
                groups,
                groups_3d: None,
            },
        ]);
    }
    // The cooperative-matrix prefill takes no sinks (`main` does).
    if gpu.coop
        && !sinks
        && dmax <= FA_PREFILL_DMAX
        && fa_prefill_fits(gpu.limits.max_compute_workgroup_storage_size, dmax)
        && q.ne[0].is_multiple_of(16)
        && v.ne[0].is_multiple_of(16)
    {
        // One workgroup per FA_PREFILL_Q query rows of each head.
        let blocks = q.ne[1].div_ceil(FA_PREFILL_Q) * q.ne[2] * q.ne[3];
        p.u[0] = blocks as u32;
        let wide = fa_decode_wide(gpu, graph, t.src[1]) && fa_decode_wide(gpu, graph, t.src[2]);
        return one(prefill_key(attn, wide), p, blocks);
    }
    let wg = if k.ne[1] >= FA_WG[1] as usize {
        FA_WG[1]
    } else {
        FA_WG[0]
    };
    one(Key::FlashAttn(FlashAttnKey { attn, wg }), p, groups)
}

/// Whether the `prefill` attention's workgroup memory at head size `dmax` fits `wg_mem` bytes:
/// f16 tiles of FA_PREFILL_Q q rows and 32 k/v rows of dmax + 8 values, the f32 scores and f16
/// probabilities of a step (rows of 32 and 40 values), and two f32 per invocation.
fn fa_prefill_fits(wg_mem: u32, dmax: u32) -> bool {
    let q = FA_PREFILL_Q as u32;
    let bytes = (q + 32) * (dmax + 8) * 2 + q * 32 * 4 + q * 40 * 2 + 2 * 256 * 4;
    bytes <= wg_mem
}

/// The flash attention `prefill` key (cooperative matrices, see `shaders/flash_attn.wgsl`):
/// f16 k and v whose rows are 16-byte aligned whole chunks (`wide`: [`fa_decode_wide`] of
/// both) are staged 8 values a load (PKV16), which keeps the staging off the critical path.
fn prefill_key(attn: Attn, wide: bool) -> Key {
    Key::FlashAttnPrefill(FlashAttnPrefillKey {
        attn,
        kv16: wide && attn.k == DType::F16 && attn.v == DType::F16,
    })
}

/// Splits of the keys of each of `groups` query rows and heads of flash attention's decode over
/// `nkv` keys: enough to make [`FA_SPLIT_GROUPS`] workgroups, with at least
/// [`FA_SPLIT_MIN_KEYS`] keys each (1: the single pass); then cut to the splits that splits
/// of that many keys (rounded up) make, so that none is empty.
fn fa_splits(groups: usize, nkv: usize) -> usize {
    let nkv = nkv.max(1);
    let want = FA_SPLIT_GROUPS
        .div_ceil(groups.max(1))
        .min(nkv / FA_SPLIT_MIN_KEYS)
        .clamp(1, nkv);
    nkv.div_ceil(nkv.div_ceil(want))
}

/// Whether flash attention's `decode` entry point can read tensor `id` (k or v) as it does:
/// rows of contiguous values, an even count of them, starting at 4-byte aligned offsets (a
/// pair of f16 per word).
fn fa_decode_layout(gpu: &Gpu, graph: &Graph, id: TensorId) -> bool {
    let t = graph.get(id);
    t.nb[0] == t.dtype.type_size()
        && t.ne[0] >= 2
        && t.ne[0].is_multiple_of(2)
        && aligned(gpu, graph, id, 0, 4)
}

/// Whether flash attention's `decode` can read the rows of tensor `id` (k or v, in its decode
/// layout) as whole 16-byte chunks: rows of a multiple of 16 bytes at 16-byte aligned offsets.
fn fa_decode_wide(gpu: &Gpu, graph: &Graph, id: TensorId) -> bool {
    let t = graph.get(id);
    (t.ne[0] * t.nb[0]).is_multiple_of(16) && aligned(gpu, graph, id, 0, 16)
}

/// Every soft_max key the plans can ask for.
#[cfg(test)]
pub(super) fn soft_max_variants() -> Vec<Key> {
    [DType::F32, DType::F16]
        .map(|mask| Key::SoftMax(SoftMaxKey { mask }))
        .to_vec()
}

/// Every flash attention key the plans can ask for (`decode` with subgroups on or off).
#[cfg(test)]
pub(super) fn variants(subgroups: bool) -> Vec<Key> {
    let mut v: Vec<Key> = FA_DMAX.map(Key::FlashAttnCombine).to_vec();
    for k in [DType::F32, DType::F16] {
        for val in [DType::F32, DType::F16] {
            for mask in [DType::F32, DType::F16] {
                for dmax in FA_DMAX {
                    let attn = Attn {
                        k,
                        v: val,
                        mask,
                        dmax,
                        sinks: false,
                    };
                    for wg in FA_WG {
                        v.push(Key::FlashAttn(FlashAttnKey { attn, wg }));
                    }
                    if dmax <= FA_PREFILL_DMAX {
                        v.push(prefill_key(attn, false));
                        v.push(prefill_key(attn, true));
                    }
                    for wide in [[false, false], [true, true], [true, false]] {
                        for split in [true, false] {
                            v.push(Key::FlashAttnDecode(FlashAttnDecodeKey {
                                attn,
                                subgroups,
                                wide,
                                split,
                            }));
                        }
                    }
                }
            }
        }
    }
    // With sinks: f16 masks, k and v of one type.
    for kv in [DType::F32, DType::F16] {
        for dmax in FA_DMAX {
            let attn = Attn {
                k: kv,
                v: kv,
                mask: DType::F16,
                dmax,
                sinks: true,
            };
            for wg in FA_WG {
                v.push(Key::FlashAttn(FlashAttnKey { attn, wg }));
            }
            for wide in [[false, false], [true, true]] {
                for split in [true, false] {
                    v.push(Key::FlashAttnDecode(FlashAttnDecodeKey {
                        attn,
                        subgroups,
                        wide,
                        split,
                    }));
                }
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Flash attention's decode splits: enough for FA_SPLIT_GROUPS workgroups with at least
    /// FA_SPLIT_MIN_KEYS keys each, never an empty split.
    #[test]
    fn fa_split_counts() {
        // The 8B's 32 heads of one token: one pass over 256 keys, 2 splits over 512, 4 over
        // 1,024, 8 of 512 keys over 4,096.
        assert_eq!(fa_splits(32, 256), 1);
        assert_eq!(fa_splits(32, 512), 2);
        assert_eq!(fa_splits(32, 1024), 4);
        assert_eq!(fa_splits(32, 4096), 8);
        // Short caches and many rows and heads keep the single pass.
        assert_eq!(fa_splits(32, 40), 1);
        assert_eq!(fa_splits(256, 4096), 1);
        assert_eq!(fa_splits(8, 1000), 3);
        for nkv in 1..3000 {
            for groups in [1, 3, 8, 32] {
                let s = fa_splits(groups, nkv);
                let per = nkv.div_ceil(s);
                assert!(
                    s >= 1 && (s - 1) * per < nkv && s * per >= nkv,
                    "{nkv} {groups}"
                );
            }
        }
    }

    /// The prefill attention fits the 48 KiB of NVIDIA's Vulkan driver at head size 128, and
    /// only head size 64 fits 32 KiB.
    #[test]
    fn fa_prefill_memory() {
        assert!(fa_prefill_fits(49152, 128));
        assert!(!fa_prefill_fits(32768, 128));
        assert!(fa_prefill_fits(32768, 64));
    }
}
