//! Fused kernels: op sequences of a Llama block replaced by one kernel each, when the
//! intermediate results are read by nothing else.
//!
//! - `rms_norm(x) * w` (the mul right after the norm): one pass per row (norm.cu), which also
//!   quantizes the result for the mat-vec products when they read it next.
//! - `swiglu(W_gate x, W_up x)` for one token with quantized weights: both mat-vecs and the
//!   activation in one kernel that quantizes x once (mmvq.cu), and quantizes its result for
//!   the down projection that reads it next.
//! - `glu(mul_mat_id(W_gate, x, ids), mul_mat_id(W_up, x, ids))` (a MoE layer's experts) with
//!   quantized experts of one type: both mat-vecs of each selected expert and the activation
//!   in one kernel (mmvq_id_glu in mmvq.cu, moe.rs).
//! - `r + W x` (a residual add right after a mul_mat that runs as mat-vec kernels): the
//!   mat-vec kernel adds `r` as it stores (mmvq.cu).
//! - two or three mul_mats of one token by the same vector (Q, K and V), with quantized
//!   weights of one type: one mat-vec launch over the stacked rows (mmvq.cu); followed by the
//!   rope of Q and K and the KV-cache stores below (adjacent-pair rope, F16 caches), those too
//!   (mmvq_multi_rope: the products are never stored).
//! - `set_rows(cache, reshape(rope(k)), idx)`: the rotated K written straight into the F16 (or
//!   F32) KV cache (rope.cu); with the rope of Q before it and the set_rows of V after it, all
//!   four in one kernel; with the RMS norms of Q's and K's heads before the ropes, those too
//!   (qk_norm_rope_kv: a warp a head).
//! - `rms_norm(all_reduce(x) + r) * w` of one row in a part graph of a meta device: the peer
//!   all-reduce kernel adds the residual and applies the next block's norm (comm.rs,
//!   allreduce.cu); without the norm, `all_reduce(x) + r` alone.
//! - `W reshape(flash_attn_ext(..))` for a token, W quantized: attention writes its result
//!   quantized too (attention.cuh), so the mat-vec (the o projection) quantizes nothing.
//! - a MoE router's soft_max, top_k, get_rows and normalization of the selected weights: one
//!   warp a token (moe.rs, moe.cu); the weighted sum of the experts' outputs over the slots,
//!   with the residual add after it: one launch (moe.rs, moe.cu).
//!
//! Each result is the unfused ops' result up to float rounding; the GPU tests check both ways.

use tessera_core::dtype::DType;
use tessera_core::fusion::{
    AttnMulMat, GluMulMats, Group, MulMatAdd, MulMats, QkNorms, RmsNormMul, RmsNormMulAdd, RopeKv,
    RopeSetRows, WINDOW,
};
use tessera_core::{GluOp, Graph, Op, Result, RopeMode, TensorId};

use super::matmul::{
    has_mmvq, mmt, mmt_fits, mmvq, mmvq_aligned, mmvq_fits, mmvq_launch, quantize_q8,
};
use super::rope::{factors_arg, rope_params, set_rotation};
use super::{params, Encoder, COUNTER_BYTES};

/// Runs the group the fusion matcher offers at a node as fused kernels, where they take it:
/// `Ok(true)` when it was encoded, `Ok(false)` when this backend declines it (the matcher then
/// offers the next candidate, and the nodes run one by one when none is taken).
pub(super) fn take(enc: &mut Encoder, nodes: &[TensorId], group: &Group) -> Result<bool> {
    match group {
        Group::RmsNormMul(m) => rms_norm_mul(enc, nodes, m),
        Group::RmsNormMulAdd(m) => rms_norm_mul_add(enc, m),
        Group::GluMulMats(m) => glu_mul_mats(enc, nodes, m),
        Group::GluMulMatIds(m) => super::moe::glu_mul_mat_ids(enc, m),
        Group::MulMatAdd(m) => mul_mat_add(enc, m),
        Group::MulMats(m) => mul_mats(enc, m),
        Group::AllReduceAdd(m) => super::comm::all_reduce_add(enc, nodes, m),
        Group::RopeKv(m) => rope_kv(enc, m),
        Group::AttnMulMat(m) => attn_q8(enc, nodes, m),
        Group::RopeSetRows(m) => rope_set_rows(enc, m),
        Group::MoeRouter(m) => super::moe::moe_router(enc, m),
        Group::MoeWeightedSum(m) => super::moe::moe_weighted_sum(enc, m),
    }
}

/// flash_attn_ext whose result, through a reshape, is read next by a quantized mat-vec (the o
/// projection of a token): the attention kernel that writes the result also writes it as q8_1
/// blocks where its path can (see attention.cuh), and the mat-vec takes them.
fn attn_q8(enc: &mut Encoder, nodes: &[TensorId], m: &AttnMulMat) -> Result<bool> {
    let g = enc.graph;
    let (a, ta) = (m.attn, g.get(m.attn));
    let Op::FlashAttnExt {
        scale,
        max_bias,
        logit_softcap,
        ..
    } = ta.op
    else {
        return Ok(false);
    };
    if !super::supports(g, a) {
        return Ok(false);
    }
    // The reshape keeps the result's flat order, so its q8_1 blocks are the result's 32-value
    // runs: each within one head when dv is a multiple of 32.
    let fits =
        ta.dtype == DType::F32 && ta.is_contiguous() && g.get(ta.src[2]).ne[0].is_multiple_of(32);
    if !fits || !feeds_mmvq(enc, nodes, m.last + 1, m.reshape)? {
        return Ok(false);
    }
    let q8 = super::attention::flash_attn(enc, a, scale, max_bias, logit_softcap, true)?;
    if let Some(q8) = q8 {
        enc.q8 = Some((m.reshape, q8));
    }
    Ok(true)
}

/// `rms_norm(x) * w` in one pass per row (norm.cu), which also quantizes the result for the
/// mat-vec products when they read it next.
fn rms_norm_mul(enc: &mut Encoder, nodes: &[TensorId], n: &RmsNormMul) -> Result<bool> {
    let g = enc.graph;
    let (tr, tm) = (g.get(n.norm), g.get(n.mul));
    if g.get(n.w).dtype != DType::F32 || tm.dtype != DType::F32 || tm.ne != tr.ne {
        return Ok(false);
    }
    let mut p = params(enc.arg(n.mul)?, &[enc.arg(n.x)?, enc.arg(n.w)?]);
    p.f[0] = n.eps;
    let rows = (tr.nrows() as u64).min(i32::MAX as u64) as u32;
    let q8 = if feeds_mmvq(enc, nodes, n.last + 1, n.mul)? {
        let blocks = tr.nelements() / 32;
        Some((enc.scratch(blocks * 32), enc.scratch(blocks * 8)))
    } else {
        None
    };
    if let Some((qs, ds)) = q8 {
        p.aux[..2].copy_from_slice(&[qs, ds]);
    }
    let (name, threads) = match norm_vec_threads(&p) {
        Some(t) => ("rms_norm_mul_vec_f32", t),
        None => ("rms_norm_mul_f32", super::norm::row_block(tr.ne[0] as i64)),
    };
    enc.launch("norm", name, [rows, 1, 1], [threads, 1, 1], 0, p)?;
    if let Some(q) = q8 {
        enc.q8 = Some((n.mul, q));
    }
    Ok(true)
}

/// `rms_norm(x) * w + r` with rows rms_norm_mul_vec_f32 takes (a post-norm joining the
/// residual, as Gemma's blocks end each branch): one kernel instead of three.
fn rms_norm_mul_add(enc: &mut Encoder, n: &RmsNormMulAdd) -> Result<bool> {
    let g = enc.graph;
    let m = &n.norm;
    let (tr, tm, ta, tres) = (g.get(m.norm), g.get(m.mul), g.get(n.add), g.get(n.residual));
    let f32s = [
        g.get(m.w).dtype,
        tm.dtype,
        ta.dtype,
        tres.dtype,
        g.get(m.x).dtype,
    ];
    if f32s.iter().any(|&t| t != DType::F32) || tm.ne != tr.ne || ta.ne != tr.ne || tres.ne != tr.ne
    {
        return Ok(false);
    }
    let mut p = params(
        enc.arg(n.add)?,
        &[enc.arg(m.x)?, enc.arg(m.w)?, enc.arg(n.residual)?],
    );
    p.f[0] = m.eps;
    let Some(threads) = norm_vec_threads(&p).filter(|_| rows_of_16(&p.t[3])) else {
        return Ok(false);
    };
    let rows = (tr.nrows() as u64).min(i32::MAX as u64) as u32;
    enc.launch(
        "norm",
        "rms_norm_mul_add_vec_f32",
        [rows, 1, 1],
        [threads, 1, 1],
        0,
        p,
    )?;
    Ok(true)
}

/// Whether a tensor's rows are contiguous f32s starting at 16-byte boundaries.
fn rows_of_16(a: &crate::cmd::TArg) -> bool {
    a.nb[0] == 4 && a.ptr.is_multiple_of(16) && a.nb[1..].iter().all(|&b| b % 16 == 0)
}

/// Values of a row each thread of rms_norm_mul_vec_f32 holds, four at a time (NORM_VEC in
/// norm.cu).
const NORM_VEC: u64 = 4;

/// Threads per block for rms_norm_mul_vec_f32 when its rows suit it (see norm.cu): `p` holds
/// dst, src and weight.
fn norm_vec_threads(p: &crate::cmd::KParams) -> Option<u32> {
    let [d, s, w] = [p.t[0], p.t[1], p.t[2]];
    let n = s.ne[0];
    let n4 = (n / 4).max(1) as u64;
    let threads = n4.div_ceil(NORM_VEC).div_ceil(32) * 32;
    let fits = n % 4 == 0
        && threads <= 1024
        && rows_of_16(&d)
        && rows_of_16(&s)
        && w.nb[0] == 4
        && w.ptr.is_multiple_of(16)
        && w.ne == [n, 1, 1, 1];
    fits.then_some(threads as u32)
}

/// Whether the next node that runs (from `nodes[j]`, past leaves and views) is a mul_mat of
/// quantized weights by `x` (F32, rows of a multiple of 32 values) that runs as mat-vec kernels,
/// which then take `x` quantized by the node that makes it.
pub(super) fn feeds_mmvq(enc: &Encoder, nodes: &[TensorId], j: usize, x: TensorId) -> Result<bool> {
    let g = enc.graph;
    let tx = g.get(x);
    if tx.dtype != DType::F32 || !tx.ne[0].is_multiple_of(32) || !tx.is_contiguous() {
        return Ok(false);
    }
    let Some((_, n)) = next_running(g, nodes, j) else {
        return Ok(false);
    };
    let t = g.get(n);
    if t.op != Op::MulMat || t.src[1] != x {
        return Ok(false);
    }
    let w = g.get(t.src[0]);
    Ok(w.dtype.is_quantized() && mmvq_fits(enc, w, tx, &enc.arg(t.src[0])?))
}

/// `swiglu(W_gate x, W_up x)` (or geglu) for one token with quantized weights: both mat-vecs and the
/// activation in one kernel that quantizes x once (mmvq.cu), and quantizes its result for the
/// down projection that reads it next.
fn glu_mul_mats(enc: &mut Encoder, nodes: &[TensorId], m: &GluMulMats) -> Result<bool> {
    let g = enc.graph;
    let s = m.glu;
    let ts = g.get(s);
    let (tg, tu) = (g.get(m.gate), g.get(m.up));
    let (wg, wu, x) = (g.get(tg.src[0]), g.get(tu.src[0]), g.get(m.x));
    let one_token = x.ne[1] == 1 && x.ne[2] == 1 && x.ne[3] == 1 && wg.ne[2] == 1 && wg.ne[3] == 1;
    if !one_token
        || wg.dtype != wu.dtype
        || wg.ne != wu.ne
        || !has_mmvq(wg.dtype)
        || ts.dtype != DType::F32
    {
        return Ok(false);
    }
    let (ga, ua) = (enc.arg(tg.src[0])?, enc.arg(tu.src[0])?);
    if !mmvq_aligned(wg.dtype, &ga) || !mmvq_aligned(wu.dtype, &ua) {
        return Ok(false);
    }
    let xa = enc.arg(m.x)?;
    let q8 = quantize_q8(enc, m.x, xa, x.dtype)?;
    let mut p = params(enc.arg(s)?, &[ga, ua]);
    p.aux[..2].copy_from_slice(&[q8.0, q8.1]);
    p.i[6] = i32::from(m.op == GluOp::Geglu);
    let rows = wg.ne[1] as u64;
    let read_only = enc.is_read_only_leaf(tg.src[0]) && enc.is_read_only_leaf(tu.src[0]);
    let (blocks, threads) = mmvq_launch(&mut p, rows, read_only);
    // The result quantized too, for the down projection that reads it next (its quantize
    // kernel is then skipped); the kernel counts finished rows per 32-row block with the
    // backend's block counters.
    let counters = (rows / 32) as usize <= COUNTER_BYTES / 4 && enc.counters != 0;
    let q8_out = if rows.is_multiple_of(32) && counters && feeds_mmvq(enc, nodes, m.last + 1, s)? {
        // x's blocks may sit in scratch from an earlier node: the new ones go past them.
        let x_end = (q8.1 - enc.scratch_base) as usize + (x.ne[0] / 32) * 8;
        let align = crate::memory::ALIGNMENT;
        enc.node_scratch = enc.node_scratch.max(x_end.div_ceil(align) * align);
        let n = rows as usize / 32;
        let out = (enc.scratch(n * 32), enc.scratch(n * 8));
        p.aux[2] = out.0;
        p.aux[3] = out.1;
        p.t[3].ptr = enc.counters;
        Some(out)
    } else {
        None
    };
    enc.launch(
        "mmvq",
        &format!("mmvq_glu_{}", wg.dtype.name()),
        [blocks, 1, 1],
        [threads, 1, 1],
        0,
        p,
    )?;
    if let Some(out) = q8_out {
        enc.q8 = Some((s, out));
    }
    Ok(true)
}

/// `r + W x` (a residual add right after a mul_mat that runs as mat-vec kernels or as the direct
/// mat-mat of 2 to 32 columns): the kernel adds `r` as it stores (mmvq.cu).
fn mul_mat_add(enc: &mut Encoder, m: &MulMatAdd) -> Result<bool> {
    let g = enc.graph;
    let (tm, ta) = (g.get(m.mul_mat), g.get(m.add));
    let (tw, tx, tr) = (g.get(tm.src[0]), g.get(tm.src[1]), g.get(m.residual));
    if !tw.dtype.is_quantized()
        || tm.dtype != DType::F32
        || ta.dtype != DType::F32
        || tr.dtype != DType::F32
        || tr.ne != tm.ne
        || ta.ne != tm.ne
    {
        return Ok(false);
    }
    let wa = enc.arg(tm.src[0])?;
    let (xa, ra, da) = (enc.arg(tm.src[1])?, enc.arg(m.residual)?, enc.arg(m.add)?);
    if let Some(geom) = mmt_fits(enc, tw, tx, &wa) {
        mmt(enc, tm.src[0], tm.src[1], xa, tx.dtype, da, Some(ra), geom)?;
        // As below: nothing quantized is reused past the add.
        enc.q8_tiles = None;
        return Ok(true);
    }
    if !mmvq_fits(enc, tw, tx, &wa) {
        return Ok(false);
    }
    let q8 = quantize_q8(enc, tm.src[1], xa, tx.dtype)?;
    mmvq(enc, tm.src[0], da, q8, tx.ne[1], Some(ra), None)?;
    // The add's result may sit where a quantized tensor was: nothing is reused past here.
    enc.q8 = None;
    Ok(true)
}

/// Whether mul_mat `m` is one token by quantized weights, unbatched, with a contiguous result
/// that the mat-vec kernels take: its weights when so.
fn one_token_mmvq(enc: &Encoder, m: TensorId) -> Result<Option<TensorId>> {
    let g = enc.graph;
    let tm = g.get(m);
    if tm.op != Op::MulMat || !tm.is_contiguous() || tm.dtype != DType::F32 {
        return Ok(None);
    }
    let (tw, tx) = (g.get(tm.src[0]), g.get(tm.src[1]));
    let one = tx.ne[1] == 1 && tx.ne[2] == 1 && tx.ne[3] == 1 && tw.ne[2] == 1 && tw.ne[3] == 1;
    if !one || !tw.dtype.is_quantized() || !mmvq_fits(enc, tw, tx, &enc.arg(tm.src[0])?) {
        return Ok(None);
    }
    Ok(Some(tm.src[0]))
}

/// Two or three mul_mats of one token by the same vector (Q, K and V), with quantized weights
/// of one type and row length: one mat-vec launch over the stacked rows (mmvq.cu); with the
/// rope of Q and K and the KV-cache stores after them, those too (mmvq_multi_rope: the
/// products are never stored).
fn mul_mats(enc: &mut Encoder, m: &MulMats) -> Result<bool> {
    let g = enc.graph;
    let mut weights = Vec::with_capacity(m.mats.len());
    for &n in &m.mats {
        match one_token_mmvq(enc, n)? {
            Some(w) => weights.push(w),
            None => return Ok(false),
        }
    }
    let (qt, k) = (g.get(weights[0]).dtype, g.get(weights[0]).ne[0]);
    if weights
        .iter()
        .any(|&w| g.get(w).dtype != qt || g.get(w).ne[0] != k)
    {
        return Ok(false);
    }
    if let Some(r) = &m.rope_kv {
        // The mat-vec rotates each product's pairs as it makes them: a norm over a head's
        // whole row cannot come first there.
        if r.norms.is_some() || !rope_kv_fits(enc, r) || !rope_follows_qkv(enc, r, &m.mats) {
            return Ok(false);
        }
    }
    let x = m.x;
    let tx = g.get(x);
    let xa = enc.arg(x)?;
    let q8 = quantize_q8(enc, x, xa, tx.dtype)?;
    let mut p = params(
        enc.arg(m.mats[0])?,
        &[enc.arg(weights[0])?, enc.arg(weights[1])?],
    );
    p.t[4] = enc.arg(m.mats[1])?;
    p.aux[0] = q8.0;
    p.aux[1] = q8.1;
    let mut rows = 0;
    for (j, (&n, &w)) in m.mats.iter().zip(&weights).enumerate() {
        if j == 2 {
            p.t[3] = enc.arg(w)?;
            p.aux[2] = enc.arg(n)?.ptr;
        }
        let r = g.get(w).ne[1];
        p.i[j] = r as i32;
        rows += r;
    }
    if let Some(r) = &m.rope_kv {
        // The Q, K and V products are read by the rope and set_rows alone: the kernel writes
        // the rotated Q and the caches instead (see mmvq.cu).
        let q = r.q.expect("rope_kv_fits checked the rope of Q");
        let (tq, tsk) = (g.get(q), g.get(r.set_k));
        p.t[0] = enc.arg(q)?;
        p.t[4] = enc.arg(r.set_k)?;
        p.t[5] = enc.arg(r.set_v)?;
        p.t[6] = enc.arg(tq.src[1])?;
        p.t[7] = enc.arg(tsk.src[2])?;
        p.aux[2] = 0;
        p.i[4] = r.params.n_dims as i32;
        p.i[5] = i32::from(g.get(tsk.src[2]).dtype == DType::I64);
        p.i[6] = tq.ne[0] as i32;
        let factors = r.factors.map(|f| enc.arg(f)).transpose()?;
        set_rotation(&mut p, &r.params, factors);
    }
    let read_only = weights.iter().all(|&w| enc.is_read_only_leaf(w));
    let (blocks, threads) = mmvq_launch(&mut p, rows as u64, read_only);
    let kernel = if m.rope_kv.is_some() {
        "mmvq_multi_rope"
    } else {
        "mmvq_multi"
    };
    enc.launch(
        "mmvq",
        &format!("{kernel}_{}", qt.name()),
        [blocks, 1, 1],
        [threads, 1, 1],
        0,
        p,
    )?;
    Ok(true)
}

/// Whether the rope_kv step `r` after the Q, K and V products `qkv` of one token is in the form
/// mmvq_multi_rope handles: adjacent pairs, F16 caches, I32 positions, a contiguous rotated Q.
fn rope_follows_qkv(enc: &Encoder, r: &RopeKv, qkv: &[TensorId]) -> bool {
    let g = enc.graph;
    let Some(q) = r.q else { return false };
    let (tq, tk, tsk) = (g.get(q), g.get(r.k), g.get(r.set_k));
    r.params.mode == RopeMode::Normal
        && tq.is_contiguous()
        && tq.ne[2] == 1
        && tk.ne[0] == tq.ne[0]
        && g.get(tq.src[1]).dtype == DType::I32
        && matches!(g.get(tsk.src[2]).dtype, DType::I32 | DType::I64)
        && g.get(tsk.src[0]).dtype == DType::F16
        && g.get(qkv[0]).ne[0] == tq.ne[0] * tq.ne[1]
        && g.get(qkv[1]).ne[0] == tk.ne[0] * tk.ne[1]
}

/// The next node from `nodes[j]` on that runs a kernel, with its index.
fn next_running(g: &Graph, nodes: &[TensorId], j: usize) -> Option<(usize, TensorId)> {
    g.next_computed(nodes, j, WINDOW)
}

/// Whether set_rows node `s` stores the rotated K `k` (F32 `[hd, heads, tokens]`, through a
/// reshape to `[hd * heads, tokens]`) into a cache the rope kernels can write: F16 or F32
/// `[hd * heads, rows]`, one row index a token.
fn rotated_k_fits(enc: &Encoder, s: TensorId, k: TensorId) -> bool {
    let g = enc.graph;
    let (ts, tk) = (g.get(s), g.get(k));
    let (rows, cache, idx) = (g.get(ts.src[1]), g.get(ts.src[0]), g.get(ts.src[2]));
    tk.dtype == DType::F32
        && tk.ne[3] == 1
        && rows.ne == [tk.ne[0] * tk.ne[1], tk.ne[2], 1, 1]
        && matches!(cache.dtype, DType::F16 | DType::F32)
        && cache.ne[0] == rows.ne[0]
        && cache.ne[2] == 1
        && cache.ne[3] == 1
        && idx.ne[0] == tk.ne[2]
        && idx.nelements() == idx.ne[0]
}

/// `set_rows(cache, reshape(rope(k)), idx)`: one rope_set_rows launch.
fn rope_set_rows(enc: &mut Encoder, m: &RopeSetRows) -> Result<bool> {
    let g = enc.graph;
    let (k, s) = (m.rope, m.set);
    let tk = g.get(k);
    let Op::Rope(rp) = tk.op else {
        return Ok(false);
    };
    if !rotated_k_fits(enc, s, k) {
        return Ok(false);
    }
    let ts = g.get(s);
    let (cache, idx) = (g.get(ts.src[0]), g.get(ts.src[2]));
    let factors = factors_arg(enc, k)?;
    let mut p = rope_params(
        enc.arg(s)?,
        enc.arg(tk.src[0])?,
        enc.arg(tk.src[1])?,
        &rp,
        factors,
    );
    p.t[3] = enc.arg(ts.src[2])?;
    let name = format!("rope_set_rows_{}_{}", cache.dtype.name(), idx.dtype.name());
    enc.launch_elems(
        "rope",
        &name,
        [tk.ne[0] as i64 / 2, tk.ne[1] as i64, tk.ne[2] as i64, 1],
        p,
    )?;
    Ok(true)
}

/// Whether the rope_kv step `r` is one the rope kernels can run: with the rope of Q, the
/// rotated K stored as [`rotated_k_fits`] says, V F32 `[kv row, tokens]` into a cache of K's
/// type and rows.
fn rope_kv_fits(enc: &Encoder, r: &RopeKv) -> bool {
    let g = enc.graph;
    let Some(q) = r.q else { return false };
    let (tq, tk, tsk, tsv) = (g.get(q), g.get(r.k), g.get(r.set_k), g.get(r.set_v));
    if !rotated_k_fits(enc, r.set_k, r.k) {
        return false;
    }
    let (v, kc, vc) = (g.get(tsv.src[1]), g.get(tsk.src[0]), g.get(tsv.src[0]));
    let tokens = tk.ne[2];
    tq.dtype == DType::F32
        && tq.ne[0] == tk.ne[0]
        && tq.ne[2] == tokens
        && tq.ne[3] == 1
        && v.dtype == DType::F32
        && v.ne == [vc.ne[0], tokens, 1, 1]
        && vc.dtype == kc.dtype
        && vc.ne[1] == kc.ne[1]
        && vc.ne[2] == 1
        && vc.ne[3] == 1
        && r.norms.is_none_or(|n| qk_norms_fit(enc, &n, tk.ne[0]))
}

/// Whether the Q/K norms `n` before a rope_kv step are ones qk_norm_rope_kv computes: over
/// whole F32 heads of `hd` dimensions, by contiguous F32 weights of one head's width.
fn qk_norms_fit(enc: &Encoder, n: &QkNorms, hd: usize) -> bool {
    let g = enc.graph;
    [n.q, n.k].iter().all(|m| {
        let (x, w) = (g.get(m.x), g.get(m.w));
        x.dtype == DType::F32
            && x.ne[0] == hd
            && w.dtype == DType::F32
            && w.ne == [hd, 1, 1, 1]
            && w.is_contiguous()
    })
}

/// `rope(q)`, `rope(k)`, then `set_rows` of the rotated K and of V into their caches at the
/// same rows (a Llama block between its projections and attention): one rope_kv launch.
fn rope_kv(enc: &mut Encoder, r: &RopeKv) -> Result<bool> {
    if !rope_kv_fits(enc, r) {
        return Ok(false);
    }
    let g = enc.graph;
    let q = r.q.expect("rope_kv_fits checked the rope of Q");
    let (tq, tk, tsk, tsv) = (g.get(q), g.get(r.k), g.get(r.set_k), g.get(r.set_v));
    let (v, kc) = (g.get(tsv.src[1]), g.get(tsk.src[0]));
    let tokens = tk.ne[2];
    let idx = g.get(tsk.src[2]);
    let kind = if r.norms.is_some() {
        "qk_norm_rope_kv"
    } else {
        "rope_kv"
    };
    let name = format!("{kind}_{}_{}", kc.dtype.name(), idx.dtype.name());
    // With the norms, the kernel reads the un-normed heads and normalizes them itself.
    let (q_in, k_in) = match &r.norms {
        Some(n) => (n.q.x, n.k.x),
        None => (tq.src[0], tk.src[0]),
    };
    let mut p = rope_params(
        enc.arg(r.set_k)?,
        enc.arg(k_in)?,
        enc.arg(tk.src[1])?,
        &r.params,
        r.factors.map(|f| enc.arg(f)).transpose()?,
    );
    p.t[3] = enc.arg(tsk.src[2])?;
    p.t[4] = enc.arg(q_in)?;
    p.t[5] = enc.arg(q)?;
    p.t[6] = enc.arg(tsv.src[1])?;
    p.t[7] = enc.arg(r.set_v)?;
    let tokens = (tokens as u64).clamp(1, 65535) as u32;
    let Some(n) = &r.norms else {
        let threads = (tq.ne[1] + tk.ne[1]) * (tk.ne[0] / 2) + v.ne[0].div_ceil(2);
        let blocks = (threads as u64).div_ceil(256).clamp(1, 65535) as u32;
        enc.launch("rope", &name, [blocks, tokens, 1], [256, 1, 1], 0, p)?;
        return Ok(true);
    };
    p.aux[0] = enc.arg(n.q.w)?.ptr;
    p.aux[1] = enc.arg(n.k.w)?.ptr;
    p.f[6] = n.q.eps;
    // A warp a head, four to a block; then blocks of 128 threads copying V.
    let blocks = (tq.ne[1] + tk.ne[1]).div_ceil(4) + v.ne[0].div_ceil(128);
    if blocks > 65535 {
        return Ok(false);
    }
    enc.launch("rope", &name, [blocks as u32, tokens, 1], [128, 1, 1], 0, p)?;
    Ok(true)
}
