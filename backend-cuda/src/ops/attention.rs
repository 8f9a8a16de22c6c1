//! flash_attn_ext: kernels/attention_prompt.cu (many query rows), attention_decode.cu (a few)
//! and attention_merge.cu (merging split partials), with attention.cuh's shared parameters.

use tessera_core::dtype::DType;
use tessera_core::{Op, Result, TensorId};

use super::norm::alibi;
use super::{params, Encoder, COUNTER_BYTES};
use crate::cmd::{KParams, TArg};

/// Keys per shared-memory tile (KTILE in attention_prompt.cu).
const KTILE: usize = 32;
/// Most query rows per KV head of the decoding kernel (VEC_ROWS in attention_decode.cu).
const VEC_ROWS: usize = 4;
/// Most keys per split of the decoding kernel.
const VEC_KEYS: usize = 1024;
/// Threads per block of the decoding kernel.
const VEC_THREADS: usize = 256;
/// Keys per split below which the decoding kernel does not split further.
const VEC_MIN_KEYS: usize = 256;
/// Most query rows per KV head of the f16 decoding kernel (fattn_dec).
const DEC_ROWS: usize = 8;
/// Threads per block of fattn_dec and fattn_mma.
const DEC_THREADS: u32 = 128;
/// Blocks of fattn_dec per SM the splits aim at: two waves of two resident blocks.
const DEC_PER_SM: usize = 4;
/// Fewest keys per split of fattn_dec.
const DEC_MIN_KEYS: usize = 32;
/// Most splits of fattn_dec that merge as one thread-block cluster (the portable cluster size).
const DEC_CLUSTER_MAX: usize = 8;
/// Query rows per block of fattn_mma (MMA_BQ in attention_prompt.cu).
const MMA_BQ: usize = 64;
/// Keys per tile of fattn_mma (MMA_BK in attention_prompt.cu).
const MMA_BK: usize = 64;

/// Fused attention of q, k, v with an optional mask. With `q8` (the result contiguous, its head
/// dim dv a multiple of 32) the kernel that writes the result also writes it as q8_1 blocks
/// where its path can (see attention.cuh): their (int8 values, (d, d * sum) pairs) addresses in
/// scratch are returned then.
pub(super) fn flash_attn(
    enc: &mut Encoder,
    id: TensorId,
    scale: f32,
    max_bias: f32,
    softcap: f32,
    q8: bool,
) -> Result<Option<(u64, u64)>> {
    let t = enc.graph.get(id);
    let (q, k, v) = (t.src[0], t.src[1], t.src[2]);
    let (tq, tk, tv) = (enc.graph.get(q), enc.graph.get(k), enc.graph.get(v));
    let sinks = matches!(t.op, Op::FlashAttnExt { sinks: true, .. });
    let n_src = t.src.len() - usize::from(sinks);
    let mask = (n_src > 3).then(|| t.src[3]);
    let (qa, ka, va, da) = (enc.arg(q)?, enc.arg(k)?, enc.arg(v)?, enc.arg(id)?);
    let (ma, mask_type) = match mask {
        Some(m) => (
            enc.arg(m)?,
            if enc.graph.get(m).dtype == DType::F16 {
                2
            } else {
                1
            },
        ),
        None => (TArg::default(), 0),
    };
    let (d, dv) = (tq.ne[0], tv.ne[0]);
    let (heads, kv_heads) = (tq.ne[2], tk.ne[2]);
    let gqa = heads / kv_heads;
    let rows = tq.ne[1] * gqa;
    let rpw = if rows <= 4 {
        1
    } else if rows <= 8 {
        2
    } else {
        4
    };
    let qt = 4 * rpw;
    let tiles = rows.div_ceil(qt);
    let base_blocks = tiles * kv_heads * tq.ne[3];
    let nkv = tk.ne[1];
    // Split the keys when there are too few blocks to fill the GPU, keeping >= 4 tiles each.
    let target = 2 * enc.dev.sm_count as usize;
    let nsplit = if base_blocks >= target {
        1
    } else {
        target
            .div_ceil(base_blocks)
            .min(nkv.div_ceil(4 * KTILE))
            .clamp(1, 256)
    };
    let mut p = params(da, &[qa, ka, va, ma]);
    if sinks {
        p.t[5] = enc.arg(t.src[n_src])?;
    }
    p.f[0] = if softcap != 0.0 {
        scale / softcap
    } else {
        scale
    };
    p.f[1] = softcap;
    let (m0, m1, nl) = alibi(max_bias, heads);
    p.f[2] = m0;
    p.f[3] = m1;
    p.i[0] = nl;
    p.i[1] = i32::from(max_bias > 0.0);
    p.i[2] = nsplit as i32;
    p.i[4] = mask_type;
    // Rows aligned to four elements: K and V tiles load four elements at a time.
    let es = |t: DType| if t == DType::F16 { 2i64 } else { 4 };
    let vec4 = |a: &TArg, t: DType| {
        a.nb[0] == es(t)
            && a.ptr.is_multiple_of(4 * es(t) as u64)
            && a.nb[1..].iter().all(|&s| s % (4 * es(t)) == 0)
    };
    p.i[5] = i32::from(vec4(&ka, tk.dtype) && vec4(&va, tv.dtype));
    let rows_total = rows * kv_heads * tq.ne[3];
    // q8_1 blocks of the result wanted: their count.
    let q8 = if q8 { t.nelements() / 32 } else { 0 };
    // f16 K and V with rows on 16 bytes: the f16 kernels (fattn_dec, fattn_mma).
    let row16 = |a: &TArg| {
        a.nb[0] == 2 && a.ptr.is_multiple_of(16) && a.nb[1..].iter().all(|&s| s % 16 == 0)
    };
    let f16_kv = tk.dtype == DType::F16 && tv.dtype == DType::F16 && row16(&ka) && row16(&va);
    if mask_type != 0 {
        let es = if mask_type == 2 { 2 } else { 4 };
        // Pairs of mask values load together (fattn_mma); f16 rows of 16 bytes are scanned 8
        // at a time (fattn_mma, fattn_dec).
        let aligned = |n: i64| {
            ma.nb[0] == es
                && ma.ptr.is_multiple_of(n as u64)
                && ma.nb[1..].iter().all(|&s| s % n == 0)
        };
        p.i[6] = i32::from(aligned(2 * es));
        p.i[7] = i32::from(mask_type == 2 && aligned(16) && nkv.is_multiple_of(8));
    }
    if f16_kv && d == dv && rows <= DEC_ROWS && matches!(d, 64 | 128 | 256) {
        return flash_attn_dec(enc, p, d, rows, base_blocks, nkv, rows_total, q8);
    }
    if f16_kv && d == dv && matches!(d, 64 | 128) {
        return flash_attn_mma(enc, p, d, rows, kv_heads * tq.ne[3], nkv, [rows_total, q8]);
    }
    if rows <= VEC_ROWS && p.i[5] == 1 && (8..=256).contains(&dv) && dv.is_power_of_two() {
        return flash_attn_vec(
            enc,
            p,
            [tk.dtype, tv.dtype],
            [d, dv],
            base_blocks,
            nkv,
            [rows_total, q8],
        );
    }
    if nsplit > 1 {
        p.aux[0] = enc.scratch(rows_total * nsplit * (dv + 2) * 4);
    }
    let smem = 4 * (qt * d + KTILE * (d + 4) + KTILE * dv + qt * KTILE);
    let name = format!("fattn_{}_{}_{rpw}", tk.dtype.name(), tv.dtype.name());
    let grid = [tiles as u32, (kv_heads * tq.ne[3]) as u32, nsplit as u32];
    enc.launch("attention_prompt", &name, grid, [128, 1, 1], smem as u32, p)?;
    combine(enc, p, nsplit, [rows_total, q8])
}

/// The decoding kernel (fattn_vec): `p` as for fattn (split count set here), `types` of K and
/// V, `dims` (d, dv), `blocks` without splitting, `nkv` keys, `rows` (query rows in all, q8_1
/// blocks of the result wanted: see [`combine`]).
fn flash_attn_vec(
    enc: &mut Encoder,
    mut p: KParams,
    types: [DType; 2],
    dims: [usize; 2],
    blocks: usize,
    nkv: usize,
    rows: [usize; 2],
) -> Result<Option<(u64, u64)>> {
    let rows_total = rows[0];
    let [d, dv] = dims;
    // Enough splits to fill the GPU twice over, none shorter than VEC_MIN_KEYS keys, none
    // longer than VEC_KEYS.
    let fill = (2 * enc.dev.sm_count as usize).div_ceil(blocks.max(1));
    let nsplit = fill
        .min(nkv.div_ceil(VEC_MIN_KEYS))
        .max(nkv.div_ceil(VEC_KEYS))
        .clamp(1, 256);
    let per_split = nkv.div_ceil(nsplit);
    p.i[2] = nsplit as i32;
    if nsplit > 1 {
        p.aux[0] = enc.scratch(rows_total * nsplit * (dv + 2) * 4);
    }
    let smem =
        4 * (VEC_ROWS * d + VEC_ROWS * per_split + 2 * VEC_ROWS + VEC_THREADS / 32 * VEC_ROWS * dv);
    let name = format!("fattn_vec_{}_{}", types[0].name(), types[1].name());
    let grid = [1, blocks as u32, nsplit as u32];
    enc.launch(
        "attention_decode",
        &name,
        grid,
        [VEC_THREADS as u32, 1, 1],
        smem as u32,
        p,
    )?;
    combine(enc, p, nsplit, rows)
}

/// The f16 decoding kernel (fattn_dec): `p` as for fattn (split count set here), head dim `d`
/// (d == dv), `rows` query rows per KV head (at most DEC_ROWS), `blocks` without splitting,
/// `nkv` keys, `rows_total` query rows in all, `q8` blocks of the result wanted (0: none),
/// which every way through fattn_dec writes. Split, the splits are merged by the kernel's last
/// block per KV head (one launch) when the backend has block counters and fuses kernels, else
/// by fattn_combine.
#[allow(clippy::too_many_arguments)]
fn flash_attn_dec(
    enc: &mut Encoder,
    mut p: KParams,
    d: usize,
    rows: usize,
    blocks: usize,
    nkv: usize,
    rows_total: usize,
    q8: usize,
) -> Result<Option<(u64, u64)>> {
    // Short splits, so that even a short cache fills the GPU, but no more than a few blocks
    // per SM: a long cache is streamed by each block in turn, its next keys loading while it
    // works on the last.
    let nsplit = nkv
        .div_ceil(DEC_MIN_KEYS)
        .min((DEC_PER_SM * enc.dev.sm_count as usize).div_ceil(blocks.max(1)))
        .clamp(1, 256);
    // The kernel gives each split whole chunks of its key loop (DEC_PASSES passes of 4 warps
    // over 32 * 8 / d keys each): as many splits as that leaves non-empty.
    let chunk = 8192 / d;
    let nsplit = nkv
        .div_ceil(nkv.div_ceil(nsplit).next_multiple_of(chunk))
        .max(1);
    p.i[2] = nsplit as i32;
    // Up to 8 splits of a KV head run as one thread-block cluster and merge through
    // distributed shared memory where the device launches clusters; else split, the last
    // block of each KV head merges the splits in the same launch (a counter per block row of
    // the grid), unless there are no counters for it or fusion is off (which keeps the
    // separate fattn_combine to compare with).
    let cluster = enc.fuse && (2..=DEC_CLUSTER_MAX).contains(&nsplit) && enc.clusters();
    let merge =
        cluster || (enc.fuse && nsplit > 1 && enc.counters != 0 && blocks <= COUNTER_BYTES / 4);
    if cluster {
        p.i[3] = 1;
    } else if nsplit > 1 {
        p.aux[0] = enc.scratch(rows_total * nsplit * (d + 2) * 4);
        if merge {
            p.aux[3] = enc.counters;
        }
    }
    let out = q8_out(enc, &mut p, q8);
    let name = format!("fattn_dec{d}_{}", if rows <= 4 { 4 } else { 8 });
    let dims = [[1, blocks as u32, nsplit as u32], [DEC_THREADS, 1, 1]];
    let cluster_size = if cluster { nsplit as u32 } else { 0 };
    enc.launch_clusters("attention_decode", &name, dims, 0, cluster_size, p)?;
    if !merge {
        combine(enc, p, nsplit, [rows_total, 0])?;
    }
    Ok(out)
}

/// The f16 tensor-core kernel (fattn_mma): `p` as for fattn (mask alignment flags set, split
/// count set here), head dim `d` (d == dv), `rows` query rows per KV head, `heads_b` KV heads
/// times batches, `nkv` keys, `totals` (query rows in all, q8_1 blocks of the result wanted:
/// see [`combine`]).
fn flash_attn_mma(
    enc: &mut Encoder,
    mut p: KParams,
    d: usize,
    rows: usize,
    heads_b: usize,
    nkv: usize,
    totals: [usize; 2],
) -> Result<Option<(u64, u64)>> {
    let rows_total = totals[0];
    let tiles = rows.div_ceil(MMA_BQ);
    let blocks = tiles * heads_b;
    let sm = enc.dev.sm_count as usize;
    // Split the keys only when the query tiles leave most SMs idle and the keys are many
    // (merging the splits costs a launch), keeping >= 4 tiles each.
    let nsplit = if 2 * blocks >= sm || nkv < 16 * MMA_BK {
        1
    } else {
        (sm / blocks).min(nkv / (4 * MMA_BK)).clamp(1, 256)
    };
    p.i[2] = nsplit as i32;
    if nsplit > 1 {
        p.aux[0] = enc.scratch(rows_total * nsplit * (d + 2) * 4);
    }
    // Q, two K and two V tiles, two mask tiles (f16 halves, rows padded by 8).
    let smem = 2 * ((MMA_BQ + 4 * MMA_BK) * (d + 8) + 2 * MMA_BQ * (MMA_BK + 8));
    let cap = if p.f[1] != 0.0 { "_cap" } else { "" };
    let name = format!("fattn_mma{d}{cap}");
    let grid = [tiles as u32, heads_b as u32, nsplit as u32];
    enc.launch(
        "attention_prompt",
        &name,
        grid,
        [DEC_THREADS, 1, 1],
        smem as u32,
        p,
    )?;
    combine(enc, p, nsplit, totals)
}

/// Merges the splits' partials (fattn_combine) when there is more than one split: `rows` are
/// the query rows in all and the q8_1 blocks of the result wanted (0: none), which the merge
/// writes too; their addresses are returned when written.
fn combine(
    enc: &mut Encoder,
    mut p: KParams,
    nsplit: usize,
    rows: [usize; 2],
) -> Result<Option<(u64, u64)>> {
    if nsplit <= 1 {
        return Ok(None);
    }
    let out = q8_out(enc, &mut p, rows[1]);
    enc.launch(
        "attention_merge",
        "fattn_combine",
        [rows[0] as u32, 1, 1],
        [256, 1, 1],
        0,
        p,
    )?;
    Ok(out)
}

/// Scratch for `blocks` q8_1 blocks of the result (none when 0), set as aux[1] (int8 values)
/// and aux[2] ((d, d * sum) pairs) of `p`.
fn q8_out(enc: &mut Encoder, p: &mut KParams, blocks: usize) -> Option<(u64, u64)> {
    if blocks == 0 {
        return None;
    }
    let out = (enc.scratch(blocks * 32), enc.scratch(blocks * 8));
    p.aux[1] = out.0;
    p.aux[2] = out.1;
    Some(out)
}
