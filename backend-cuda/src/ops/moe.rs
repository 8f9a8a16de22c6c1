//! The mixture-of-experts ops: mul_mat_id, add_id, argsort and top_k (kernels/moe.cu).
//!
//! mul_mat_id runs one of three ways:
//! - grouped by expert ([`grouped_fits`]: a batch of many tokens, experts of a type with a
//!   tensor-core mat-mat): `mmid_bucket` sorts the (slot, token) pairs by expert on the GPU
//!   and writes a table of column tiles, then `mmq_id` (kernels/mmvq.cu) multiplies each
//!   expert's weights by a tile of its pairs' rows at a time, reading the weights once per
//!   tile rather than once per pair. Launch sizes depend only on the shapes, so the step stays
//!   capturable in a CUDA graph, and nothing is read back to the host;
//! - one quantized mat-vec per (slot, token) pair (`mmvq_id`), for the types with a mat-vec
//!   kernel;
//! - one warp per result (`mul_mat_id_<w>_<b>`), for the rest.
//!
//! Two fusion groups of a MoE layer run here as one launch each: the router's selection
//! ([`MoeRouter`]: soft_max, top_k, get_rows and the weights' normalization, `moe_router`, a
//! warp a token) and the weighted sum of the experts' outputs with the residual add after it
//! ([`MoeWeightedSum`]: mul and the adds of the slots, `moe_weighted_sum`).

use tessera_core::dtype::DType;
use tessera_core::fusion::{GluMulMatIds, MoeRouter, MoeWeightedSum};
use tessera_core::{GluOp, Op, Result, Tensor, TensorId};

use super::{matmul, params, Encoder};
use crate::cmd::{KParams, TArg};

/// Warps (results) per block of mul_mat_id.
const MMID_WARPS: u32 = 4;

/// Longest row argsort and top_k sort in one block's shared memory.
const MAX_SORT: usize = 4096;

/// The fewest (slot, token) pairs per expert held, on average, from which mul_mat_id runs
/// grouped by expert: the mat-vec per pair reads an expert's weights once per pair, the
/// grouped mat-mat once per tile of up to [`MMID_TILE`] pairs, plus a bucketing launch and a
/// tile's fixed setup; from a few pairs an expert the grouped path reads several times fewer
/// bytes (a prompt of 64 tokens of a 128-expert, 8-used model has 4 on average).
const MMID_GROUPED_MIN: usize = 4;

/// Pairs of one tile of the grouped mat-mat (`mmq_id_<type>_4`: 4 column tiles of 8).
const MMID_TILE: usize = 32;

/// The most experts the grouping takes: `mmid_bucket` keeps three counters an expert in one
/// block's shared memory (24 KiB at this count).
const MMID_BUCKETS_MAX: usize = 2048;

/// Entries of the grouped mat-mat's tile table for `pairs` pairs over `experts` experts held:
/// one per [`MMID_TILE`] pairs, plus at most one partly filled tile per bucket that has pairs
/// (each expert's and the bucket of experts not held).
fn mmid_tiles(pairs: usize, experts: usize) -> usize {
    pairs.div_ceil(MMID_TILE) + (experts + 1).min(pairs)
}

/// Whether a mul_mat_id of experts of type `wt` (at `aa`: [k, m, experts]) over `pairs`
/// (slot, token) pairs runs grouped by expert ([`mul_mat_id_grouped`]): a type with a
/// tensor-core mat-mat ([`matmul::has_mmq`], sm_80 and later) in rows aligned as it reads
/// them, at least [`MMID_GROUPED_MIN`] pairs per expert on average, at most
/// [`MMID_BUCKETS_MAX`] experts, and a tile table that fits the grid.
fn grouped_fits(enc: &Encoder, wt: DType, aa: &TArg, pairs: usize) -> bool {
    let experts = aa.ne[2] as usize;
    matmul::has_mmq(wt)
        && matmul::mmvq_aligned(wt, aa)
        && enc.dev.cc.0 >= 8
        && aa.ne[3] == 1
        && experts <= MMID_BUCKETS_MAX
        && pairs >= MMID_GROUPED_MIN * experts.max(1)
        && mmid_tiles(pairs, experts) <= 65535
}

/// mul_mat_id grouped by expert: `b` (tensor `b_id`, of type `bt`) quantized to 8-bit blocks,
/// the pairs bucketed by expert (`mmid_bucket`, one block), then one `mmq_id` launch over
/// (row tiles of 128, the tile table's entries).
#[allow(clippy::too_many_arguments)]
fn mul_mat_id_grouped(
    enc: &mut Encoder,
    d: TArg,
    a: TArg,
    wt: DType,
    b_id: TensorId,
    b: TArg,
    bt: DType,
    ids: TArg,
    first: usize,
) -> Result<()> {
    let (qs, ds) = matmul::quantize_q8(enc, b_id, b, bt)?;
    let (pairs, experts) = ((d.ne[1] * d.ne[2]) as usize, a.ne[2] as usize);
    let tiles = mmid_tiles(pairs, experts);
    let list = enc.scratch(pairs * 8);
    let table = enc.scratch(tiles * 12);
    let mut p = params(TArg::default(), &[ids]);
    p.aux[..2].copy_from_slice(&[list, table]);
    p.i[..5].copy_from_slice(&[
        first as i32,
        experts as i32,
        MMID_TILE as i32,
        tiles as i32,
        b.ne[1] as i32,
    ]);
    let smem = (3 * (experts + 1) * 4) as u32;
    enc.launch("moe", "mmid_bucket", [1, 1, 1], [1024, 1, 1], smem, p)?;
    let mut p = params(d, &[a]);
    p.aux.copy_from_slice(&[qs, ds, table, list]);
    let smem = matmul::mmq_smem(wt, MMID_TILE / 8);
    enc.launch(
        "mmvq",
        &format!("mmq_id_{}_{}", wt.name(), MMID_TILE / 8),
        [(a.ne[1] as u32).div_ceil(128), tiles as u32, 1],
        [128, 1, 1],
        smem,
        p,
    )
}

/// Whether mul_mat_id of experts `a` by rows `b` runs here: kernels/moe.cu has an entry point
/// for the float types and every classic quantized type ([`DType::QUANTIZED`]), and the types
/// with a mat-vec kernel (the i-quants and MXFP4 among them) run as `mmvq_id`.
pub(super) fn mul_mat_id_supported(a: &Tensor, b: &Tensor) -> bool {
    let w = matches!(a.dtype, DType::F32 | DType::F16 | DType::BF16)
        || ((DType::QUANTIZED.contains(&a.dtype) || matmul::has_mmvq(a.dtype))
            && a.rows_contiguous());
    w && matches!(b.dtype, DType::F32 | DType::F16)
}

/// Launches a mul_mat_id mat-vec kernel (`mmvq_id` or `mmvq_id_glu`) over `slots` (slot,
/// token) pairs of `blocks` blocks each, in launches of at most 65535 pairs (the grid's y),
/// each told its first pair in i[2].
fn launch_id(
    enc: &mut Encoder,
    name: &str,
    mut p: KParams,
    blocks: u32,
    threads: u32,
    slots: usize,
) -> Result<()> {
    for first in (0..slots).step_by(65535) {
        p.i[2] = first as i32;
        let n = (slots - first).min(65535) as u32;
        enc.launch("mmvq", name, [blocks, n, 1], [threads, 1, 1], 0, p)?;
    }
    Ok(())
}

/// Whether argsort or top_k of a row of `n` values runs here.
pub(super) fn sort_supported(n: usize) -> bool {
    n <= MAX_SORT
}

/// The expert mat-mul: grouped by expert for long batches ([`grouped_fits`]), else as a
/// mat-vec per selected expert and token over 8-bit quantized rows (`mmvq_id` in
/// kernels/mmvq.cu) where the experts' type has a mat-vec kernel, else one warp per result.
pub(super) fn mul_mat_id(enc: &mut Encoder, id: TensorId, first: usize) -> Result<()> {
    let t = enc.graph.get(id);
    let (a, b, ids) = (t.src[0], t.src[1], t.src[2]);
    let (wt, bt) = (enc.graph.get(a).dtype, enc.graph.get(b).dtype);
    let d = enc.arg(id)?;
    let (aa, ba) = (enc.arg(a)?, enc.arg(b)?);
    if grouped_fits(enc, wt, &aa, (d.ne[1] * d.ne[2]) as usize) {
        let ia = enc.arg(ids)?;
        return mul_mat_id_grouped(enc, d, aa, wt, b, ba, bt, ia, first);
    }
    if matmul::has_mmvq(wt) && matmul::mmvq_aligned(wt, &aa) {
        let (qs, ds) = matmul::quantize_q8(enc, b, ba, bt)?;
        let mut p = params(d, &[aa, enc.arg(ids)?]);
        p.aux[..2].copy_from_slice(&[qs, ds]);
        p.i[0] = first as i32;
        p.i[1] = ba.ne[1] as i32;
        let (blocks, threads) = matmul::mmvq_launch(&mut p, aa.ne[1] as u64, false);
        let name = format!("mmvq_id_{}", wt.name());
        return launch_id(enc, &name, p, blocks, threads, (d.ne[1] * d.ne[2]) as usize);
    }
    if wt.is_quantized() && !DType::QUANTIZED.contains(&wt) {
        return Err(enc.unsupported(id, "experts of this type need rows aligned for mmvq_id"));
    }
    let mut p = params(d, &[aa, ba, enc.arg(ids)?]);
    p.i[0] = first as i32;
    let name = format!("mul_mat_id_{}_{}", wt.name(), bt.name());
    let grid = [
        (d.ne[0] as u64).div_ceil(u64::from(MMID_WARPS)) as u32,
        d.ne[1] as u32,
        d.ne[2] as u32,
    ];
    enc.launch("moe", &name, grid, [32 * MMID_WARPS, 1, 1], 0, p)
}

/// The experts' gate and up mul_mat_ids and their glu (a MoE layer's) in one launch
/// (`mmvq_id_glu` in kernels/mmvq.cu: both mat-vecs of each selected expert's rows, the rows
/// quantized once, act(gate) * up stored): where both experts are of one type, shape and layout
/// with a mat-vec kernel. `Ok(false)` where this backend declines the group, and for a batch
/// that [`mul_mat_id`] runs grouped by expert (its gate and up then run so, the glu alone).
pub(super) fn glu_mul_mat_ids(enc: &mut Encoder, m: &GluMulMatIds) -> Result<bool> {
    let g = enc.graph;
    let (tg, tu, ts) = (g.get(m.gate), g.get(m.up), g.get(m.glu));
    let Op::MulMatId { first } = tg.op else {
        return Ok(false);
    };
    let (wg, wu, x) = (g.get(tg.src[0]), g.get(tu.src[0]), g.get(m.x));
    let fits = tu.op == tg.op
        && wg.dtype == wu.dtype
        && wg.ne == wu.ne
        && wg.nb == wu.nb
        && matmul::has_mmvq(wg.dtype)
        && wg.rows_contiguous()
        && matches!(x.dtype, DType::F32 | DType::F16)
        && ts.dtype == DType::F32
        && ts.ne == tg.ne;
    if !fits {
        return Ok(false);
    }
    let (ga, ua) = (enc.arg(tg.src[0])?, enc.arg(tu.src[0])?);
    if !matmul::mmvq_aligned(wg.dtype, &ga)
        || !matmul::mmvq_aligned(wu.dtype, &ua)
        || grouped_fits(enc, wg.dtype, &ga, tg.ne[1] * tg.ne[2])
    {
        return Ok(false);
    }
    let (d, xa) = (enc.arg(m.glu)?, enc.arg(m.x)?);
    let (qs, ds) = matmul::quantize_q8(enc, m.x, xa, x.dtype)?;
    let mut p = params(d, &[ga, enc.arg(m.ids)?, ua]);
    p.aux[..2].copy_from_slice(&[qs, ds]);
    p.i[0] = first as i32;
    p.i[1] = xa.ne[1] as i32;
    p.i[6] = i32::from(m.op == GluOp::Geglu);
    let (blocks, threads) = matmul::mmvq_launch(&mut p, ga.ne[1] as u64, false);
    let name = format!("mmvq_id_glu_{}", wg.dtype.name());
    launch_id(enc, &name, p, blocks, threads, (d.ne[1] * d.ne[2]) as usize)?;
    Ok(true)
}

/// a plus the bias row of each expert.
pub(super) fn add_id(enc: &mut Encoder, id: TensorId) -> Result<()> {
    let t = enc.graph.get(id);
    let d = enc.arg(id)?;
    let p = params(
        d,
        &[enc.arg(t.src[0])?, enc.arg(t.src[1])?, enc.arg(t.src[2])?],
    );
    enc.launch_elems("moe", "add_id_f32", d.ne, p)
}

/// argsort (`descending` as asked) or top_k (descending): one block sorts each row.
pub(super) fn sort(enc: &mut Encoder, id: TensorId, descending: bool) -> Result<()> {
    let t = enc.graph.get(id);
    let s = enc.arg(t.src[0])?;
    let mut p = params(enc.arg(id)?, &[s]);
    let n2 = (s.ne[0].max(1) as u32).next_power_of_two();
    p.i[0] = i32::from(descending);
    p.i[1] = n2 as i32;
    let rows = (s.ne[1] * s.ne[2] * s.ne[3]).clamp(1, i64::from(u32::MAX)) as u32;
    let block = n2.clamp(32, 1024);
    enc.launch("moe", "sort_f32", [rows, 1, 1], [block, 1, 1], n2 * 8, p)
}

/// The most experts a token `moe_router` selects among (32 a lane of its warp).
const ROUTER_MAX_EXPERTS: usize = 1024;

/// Tokens of one `moe_router` block (`ROUTER_WARPS` in moe.cu).
const ROUTER_WARPS: usize = 4;

/// The bytes tensor argument `a` of elements of `size` bytes spans: [first, end).
fn span(a: &TArg, size: usize) -> (u64, u64) {
    let last: i64 = (0..4).map(|k| (a.ne[k].max(1) - 1) * a.nb[k]).sum();
    (a.ptr, a.ptr + last as u64 + size as u64)
}

/// Whether f32 or i32 tensors `a` and `b` share no byte.
fn apart(a: &TArg, b: &TArg) -> bool {
    let ((a0, a1), (b0, b1)) = (span(a, 4), span(b, 4));
    a1 <= b0 || b1 <= a0
}

/// The router's selection ([`MoeRouter`]) in one `moe_router` launch: f32 scores of at most
/// [`ROUTER_MAX_EXPERTS`] experts a token, at most 32 selected. `Ok(false)` where it declines:
/// other types or shapes, or results that overlap the scores when several tokens run (their
/// warps would read scores another has overwritten; one token's warp reads all before it
/// writes).
pub(super) fn moe_router(enc: &mut Encoder, r: &MoeRouter) -> Result<bool> {
    let g = enc.graph;
    let Some((n_expert, n)) = r.f32_rows(g) else {
        return Ok(false);
    };
    if n_expert > ROUTER_MAX_EXPERTS || r.n_used > 32 || n > 65535 * ROUTER_WARPS {
        return Ok(false);
    }
    let tw = g.get(r.weights);
    let (la, ka, mut wa) = (enc.arg(r.logits)?, enc.arg(r.top_k)?, enc.arg(r.weights)?);
    // The weights as [n_used, n]: the get_rows's [1, n_used, n] or the div's [n_used, n].
    if tw.ne[0] == 1 && tw.ne[1] == r.n_used {
        wa.ne = [r.n_used as i64, n as i64, 1, 1];
        wa.nb = [wa.nb[1], wa.nb[2], wa.nb[3], wa.nb[3]];
    }
    if n > 1 && !(apart(&wa, &la) && apart(&ka, &la)) {
        return Ok(false);
    }
    let mut p = params(wa, &[la, ka]);
    let (modes, consts) = r.kernel_settings();
    p.i[..2].copy_from_slice(&modes.map(|m| m as i32));
    p.f[..4].copy_from_slice(&consts);
    let blocks = n.div_ceil(ROUTER_WARPS) as u32;
    let smem = (ROUTER_WARPS * n_expert * 4) as u32;
    let threads = (32 * ROUTER_WARPS) as u32;
    enc.launch(
        "moe",
        "moe_router",
        [blocks, 1, 1],
        [threads, 1, 1],
        smem,
        p,
    )?;
    Ok(true)
}

/// The weighted sum of the experts' outputs and the residual add after it, where there is one
/// ([`MoeWeightedSum`]), in one `moe_weighted_sum` launch: all f32. `Ok(false)` where the
/// result overlaps what the kernel reads (other than the residual exactly in place).
pub(super) fn moe_weighted_sum(enc: &mut Encoder, s: &MoeWeightedSum) -> Result<bool> {
    let g = enc.graph;
    let (td, tw, to) = (g.get(s.down), g.get(s.weights), g.get(s.out));
    let n = td.ne[2];
    let f32s = td.dtype == DType::F32 && tw.dtype == DType::F32 && to.dtype == DType::F32;
    let res = s.residual.map(|(_, r)| g.get(r));
    let res_fits = res.is_none_or(|t| t.dtype == DType::F32 && t.ne == to.ne);
    if !f32s || !res_fits || to.ne != [td.ne[0], n, 1, 1] || n > 65535 {
        return Ok(false);
    }
    let (oa, da, wa) = (enc.arg(s.out)?, enc.arg(s.down)?, enc.arg(s.weights)?);
    let ra = match s.residual {
        Some((_, r)) => Some(enc.arg(r)?),
        None => None,
    };
    let res_ok = ra.is_none_or(|r| apart(&oa, &r) || (r.ptr == oa.ptr && r.nb == oa.nb));
    if !apart(&oa, &da) || !apart(&oa, &wa) || !res_ok {
        return Ok(false);
    }
    let mut p = params(oa, &[da, wa, ra.unwrap_or(oa)]);
    p.i[0] = i32::from(ra.is_some());
    let d = td.ne[0] as u32;
    let threads = d.next_power_of_two().clamp(32, 256);
    let grid = [d.div_ceil(threads), n as u32, 1];
    enc.launch("moe", "moe_weighted_sum", grid, [threads, 1, 1], 0, p)?;
    Ok(true)
}
