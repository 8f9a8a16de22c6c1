//! The mixture-of-experts ops: mul_mat_id, add_id, argsort and top_k (kernels/moe.cu).

use tessera_core::dtype::DType;
use tessera_core::fusion::GluMulMatIds;
use tessera_core::{GluOp, Op, Result, Tensor, TensorId};

use super::{matmul, params, Encoder};
use crate::cmd::KParams;

/// Warps (results) per block of mul_mat_id.
const MMID_WARPS: u32 = 4;

/// Longest row argsort and top_k sort in one block's shared memory.
const MAX_SORT: usize = 4096;

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

/// The expert mat-mul: as a mat-vec per selected expert and token over 8-bit quantized rows
/// (`mmvq_id` in kernels/mmvq.cu) where the experts' type has a mat-vec kernel, else one warp
/// per result.
pub(super) fn mul_mat_id(enc: &mut Encoder, id: TensorId, first: usize) -> Result<()> {
    let t = enc.graph.get(id);
    let (a, b, ids) = (t.src[0], t.src[1], t.src[2]);
    let (wt, bt) = (enc.graph.get(a).dtype, enc.graph.get(b).dtype);
    let d = enc.arg(id)?;
    let (aa, ba) = (enc.arg(a)?, enc.arg(b)?);
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
/// with a mat-vec kernel. `Ok(false)` where this backend declines the group.
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
    if !matmul::mmvq_aligned(wg.dtype, &ga) || !matmul::mmvq_aligned(wu.dtype, &ua) {
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
