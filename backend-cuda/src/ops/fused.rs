//! Fused kernels: op sequences of a Llama block replaced by one kernel each, when the
//! intermediate results are read by nothing else.
//!
//! - `rms_norm(x) * w` (the mul right after the norm): one pass per row (norm.cu), which also
//!   quantizes the result for the mat-vec products when they read it next.
//! - `swiglu(W_gate x, W_up x)` for one token with quantized weights: both mat-vecs and the
//!   activation in one kernel that quantizes x once (mmvq.cu), and quantizes its result for
//!   the down projection that reads it next.
//! - `r + W x` (a residual add right after a mul_mat that runs as mat-vec kernels): the
//!   mat-vec kernel adds `r` as it stores (mmvq.cu).
//! - two or three mul_mats of one token by the same vector (Q, K and V), with quantized
//!   weights of one type: one mat-vec launch over the stacked rows (mmvq.cu); followed by the
//!   rope of Q and K and the KV-cache stores below (adjacent-pair rope, F16 caches), those too
//!   (mmvq_multi_rope: the products are never stored).
//! - `set_rows(cache, reshape(rope(k)), idx)`: the rotated K written straight into the F16 (or
//!   F32) KV cache (rope.cu); with the rope of Q before it and the set_rows of V after it, all
//!   four in one kernel.
//! - `rms_norm(all_reduce(x) + r) * w` of one row in a part graph of a meta device: the peer
//!   all-reduce kernel adds the residual and applies the next block's norm (comm.rs,
//!   allreduce.cu); without the norm, `all_reduce(x) + r` alone.
//! - `W reshape(flash_attn_ext(..))` for a token, W quantized: attention writes its result
//!   quantized too (attention.cuh), so the mat-vec (the o projection) quantizes nothing.
//!
//! Each result is the unfused ops' result up to float rounding; the GPU tests check both ways.

use tessera_core::dtype::DType;
use tessera_core::{BinaryOp, GluOp, Graph, Op, Result, RopeMode, RopeParams, TensorId};

use super::matmul::{has_mmvq, mmvq, mmvq_aligned, mmvq_fits, mmvq_launch, quantize_q8};
use super::rope::{rope_params, theta_scale};
use super::{params, Encoder, COUNTER_BYTES};

/// Tries every fusion at `nodes[i]`; returns how many nodes were consumed (0: none applied).
pub(super) fn try_fuse(enc: &mut Encoder, nodes: &[TensorId], i: usize) -> Result<usize> {
    let n = rms_norm_mul(enc, nodes, i)?;
    if n > 0 {
        return Ok(n);
    }
    let n = gate_up_swiglu(enc, nodes, i)?;
    if n > 0 {
        return Ok(n);
    }
    let n = mmvq_add(enc, nodes, i)?;
    if n > 0 {
        return Ok(n);
    }
    let n = mmvq_multi(enc, nodes, i)?;
    if n > 0 {
        return Ok(n);
    }
    let n = super::comm::all_reduce_add_norm(enc, nodes, i)?;
    if n > 0 {
        return Ok(n);
    }
    let n = super::comm::all_reduce_add(enc, nodes, i)?;
    if n > 0 {
        return Ok(n);
    }
    let n = rope_kv(enc, nodes, i)?;
    if n > 0 {
        return Ok(n);
    }
    let n = attn_q8(enc, nodes, i)?;
    if n > 0 {
        return Ok(n);
    }
    rope_set_rows(enc, nodes, i)
}

/// flash_attn_ext whose result, through a reshape, is read next by a quantized mat-vec (the o
/// projection of a token): the attention kernel that writes the result also writes it as q8_1
/// blocks where its path can (see attention.cuh), and the mat-vec takes them.
fn attn_q8(enc: &mut Encoder, nodes: &[TensorId], i: usize) -> Result<usize> {
    let g = enc.graph;
    let a = nodes[i];
    let ta = g.get(a);
    let Op::FlashAttnExt {
        scale,
        max_bias,
        logit_softcap,
    } = ta.op
    else {
        return Ok(0);
    };
    let Some((_, m)) = next_running(g, nodes, i + 1) else {
        return Ok(0);
    };
    let tm = g.get(m);
    if tm.op != Op::MulMat || !super::supports(g, a) {
        return Ok(0);
    }
    let x = tm.src[1];
    let tx = g.get(x);
    // The reshape keeps the result's flat order, so its q8_1 blocks are the result's 32-value
    // runs: each within one head when dv is a multiple of 32.
    let fits = tx.op == Op::Reshape
        && tx.src[0] == a
        && ta.dtype == DType::F32
        && ta.is_contiguous()
        && g.get(ta.src[2]).ne[0].is_multiple_of(32);
    if !fits || !feeds_mmvq(enc, nodes, i + 1, x)? {
        return Ok(0);
    }
    let q8 = super::attention::flash_attn(enc, a, scale, max_bias, logit_softcap, true)?;
    if let Some(q8) = q8 {
        enc.q8 = Some((x, q8));
    }
    Ok(1)
}

fn rms_norm_mul(enc: &mut Encoder, nodes: &[TensorId], i: usize) -> Result<usize> {
    let g = enc.graph;
    let r = nodes[i];
    let tr = g.get(r);
    let Op::RmsNorm { eps } = tr.op else {
        return Ok(0);
    };
    let Some(&m) = nodes.get(i + 1) else {
        return Ok(0);
    };
    let tm = g.get(m);
    if tm.op != Op::Binary(BinaryOp::Mul) || tm.src[0] != r || !enc.single_use(r) {
        return Ok(0);
    }
    let w = tm.src[1];
    if g.get(w).dtype != DType::F32 || tm.dtype != DType::F32 || tm.ne != tr.ne {
        return Ok(0);
    }
    let mut p = params(enc.arg(m)?, &[enc.arg(tr.src[0])?, enc.arg(w)?]);
    p.f[0] = eps;
    let rows = (tr.nrows() as u64).min(i32::MAX as u64) as u32;
    let q8 = if feeds_mmvq(enc, nodes, i + 2, m)? {
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
        enc.q8 = Some((m, q));
    }
    Ok(2)
}

/// Values of a row each thread of rms_norm_mul_vec_f32 holds, four at a time (NORM_VEC in
/// norm.cu).
const NORM_VEC: u64 = 4;

/// Threads per block for rms_norm_mul_vec_f32 when its rows suit it (see norm.cu): `p` holds
/// dst, src and weight.
fn norm_vec_threads(p: &crate::cmd::KParams) -> Option<u32> {
    let [d, s, w] = [p.t[0], p.t[1], p.t[2]];
    let n = s.ne[0];
    let rows_of_16 = |a: &crate::cmd::TArg| {
        a.nb[0] == 4 && a.ptr.is_multiple_of(16) && a.nb[1..].iter().all(|&b| b % 16 == 0)
    };
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
    Ok(w.dtype.is_quantized() && mmvq_fits(w, tx, &enc.arg(t.src[0])?))
}

fn gate_up_swiglu(enc: &mut Encoder, nodes: &[TensorId], i: usize) -> Result<usize> {
    let g = enc.graph;
    let (Some(&a), Some(&b), Some(&s)) = (nodes.get(i), nodes.get(i + 1), nodes.get(i + 2)) else {
        return Ok(0);
    };
    let ts = g.get(s);
    if ts.op
        != (Op::Glu {
            op: GluOp::Swiglu,
            swapped: false,
        })
        || ts.src.len() != 2
    {
        return Ok(0);
    }
    let (gate, up) = (ts.src[0], ts.src[1]);
    if !((gate == a && up == b) || (gate == b && up == a)) {
        return Ok(0);
    }
    let (tg, tu) = (g.get(gate), g.get(up));
    if tg.op != Op::MulMat
        || tu.op != Op::MulMat
        || !enc.single_use(gate)
        || !enc.single_use(up)
        || tg.src[1] != tu.src[1]
    {
        return Ok(0);
    }
    let (wg, wu, x) = (g.get(tg.src[0]), g.get(tu.src[0]), g.get(tg.src[1]));
    let one_token = x.ne[1] == 1 && x.ne[2] == 1 && x.ne[3] == 1 && wg.ne[2] == 1 && wg.ne[3] == 1;
    if !one_token
        || wg.dtype != wu.dtype
        || wg.ne != wu.ne
        || !has_mmvq(wg.dtype)
        || ts.dtype != DType::F32
    {
        return Ok(0);
    }
    let (ga, ua) = (enc.arg(tg.src[0])?, enc.arg(tu.src[0])?);
    if !mmvq_aligned(wg.dtype, &ga) || !mmvq_aligned(wu.dtype, &ua) {
        return Ok(0);
    }
    let xa = enc.arg(tg.src[1])?;
    let q8 = quantize_q8(enc, tg.src[1], xa, x.dtype)?;
    let mut p = params(enc.arg(s)?, &[ga, ua]);
    p.aux[..2].copy_from_slice(&[q8.0, q8.1]);
    let m = wg.ne[1] as u64;
    let read_only = enc.is_read_only_leaf(tg.src[0]) && enc.is_read_only_leaf(tu.src[0]);
    let (blocks, threads) = mmvq_launch(&mut p, m, read_only);
    // The result quantized too, for the down projection that reads it next (its quantize
    // kernel is then skipped); the kernel counts finished rows per 32-row block with the
    // backend's block counters.
    let counters = (m / 32) as usize <= COUNTER_BYTES / 4 && enc.counters != 0;
    let q8_out = if m.is_multiple_of(32) && counters && feeds_mmvq(enc, nodes, i + 3, s)? {
        // x's blocks may sit in scratch from an earlier node: the new ones go past them.
        let x_end = (q8.1 - enc.scratch_base) as usize + (x.ne[0] / 32) * 8;
        let align = crate::memory::ALIGNMENT;
        enc.node_scratch = enc.node_scratch.max(x_end.div_ceil(align) * align);
        let n = m as usize / 32;
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
    Ok(3)
}

fn mmvq_add(enc: &mut Encoder, nodes: &[TensorId], i: usize) -> Result<usize> {
    let g = enc.graph;
    let (Some(&m), Some(&a)) = (nodes.get(i), nodes.get(i + 1)) else {
        return Ok(0);
    };
    let (tm, ta) = (g.get(m), g.get(a));
    if tm.op != Op::MulMat
        || ta.op != Op::Binary(BinaryOp::Add)
        || ta.src.len() != 2
        || !enc.single_use(m)
    {
        return Ok(0);
    }
    let r = if ta.src[1] == m { ta.src[0] } else { ta.src[1] };
    if r == m || (ta.src[0] != m && ta.src[1] != m) {
        return Ok(0);
    }
    let (tw, tx, tr) = (g.get(tm.src[0]), g.get(tm.src[1]), g.get(r));
    if !tw.dtype.is_quantized()
        || tm.dtype != DType::F32
        || ta.dtype != DType::F32
        || tr.dtype != DType::F32
        || tr.ne != tm.ne
        || ta.ne != tm.ne
    {
        return Ok(0);
    }
    let wa = enc.arg(tm.src[0])?;
    if !mmvq_fits(tw, tx, &wa) {
        return Ok(0);
    }
    let (xa, ra, da) = (enc.arg(tm.src[1])?, enc.arg(r)?, enc.arg(a)?);
    let q8 = quantize_q8(enc, tm.src[1], xa, tx.dtype)?;
    mmvq(enc, tm.src[0], da, q8, tx.ne[1], Some(ra), None)?;
    // The add's result may sit where a quantized tensor was: nothing is reused past here.
    enc.q8 = None;
    Ok(2)
}

/// Whether mul_mat `m` is one token by quantized weights, unbatched, with a contiguous result:
/// its (weights, vector) when so.
fn one_token_mmvq(enc: &Encoder, m: TensorId) -> Result<Option<(TensorId, TensorId)>> {
    let g = enc.graph;
    let tm = g.get(m);
    if tm.op != Op::MulMat || !tm.is_contiguous() || tm.dtype != DType::F32 {
        return Ok(None);
    }
    let (tw, tx) = (g.get(tm.src[0]), g.get(tm.src[1]));
    let one = tx.ne[1] == 1 && tx.ne[2] == 1 && tx.ne[3] == 1 && tw.ne[2] == 1 && tw.ne[3] == 1;
    if !one || !tw.dtype.is_quantized() || !mmvq_fits(tw, tx, &enc.arg(tm.src[0])?) {
        return Ok(None);
    }
    Ok(Some((tm.src[0], tm.src[1])))
}

fn mmvq_multi(enc: &mut Encoder, nodes: &[TensorId], i: usize) -> Result<usize> {
    let g = enc.graph;
    let Some((w0, x)) = one_token_mmvq(enc, nodes[i])? else {
        return Ok(0);
    };
    let (qt, k) = (g.get(w0).dtype, g.get(w0).ne[0]);
    // Following mul_mats by the same vector, past views and leaves (which run nothing).
    let mut found = vec![(nodes[i], w0)];
    let mut end = i + 1;
    for (j, &n) in nodes.iter().enumerate().skip(i + 1).take(8) {
        let t = g.get(n);
        if matches!(t.op, Op::None) || t.op.is_view() {
            continue;
        }
        match one_token_mmvq(enc, n)? {
            Some((w, xn)) if xn == x && g.get(w).dtype == qt && g.get(w).ne[0] == k => {
                found.push((n, w));
                end = j + 1;
                if found.len() == 3 {
                    break;
                }
            }
            _ => break,
        }
    }
    if found.len() < 2 {
        return Ok(0);
    }
    let rope = match next_running(g, nodes, end) {
        Some((j, _)) if found.len() == 3 => match_rope_kv(enc, nodes, j)
            .filter(|m| rope_follows_qkv(enc, m, [found[0].0, found[1].0, found[2].0])),
        _ => None,
    };
    let tx = g.get(x);
    let xa = enc.arg(x)?;
    let q8 = quantize_q8(enc, x, xa, tx.dtype)?;
    let mut p = params(
        enc.arg(found[0].0)?,
        &[enc.arg(found[0].1)?, enc.arg(found[1].1)?],
    );
    p.t[4] = enc.arg(found[1].0)?;
    p.aux[0] = q8.0;
    p.aux[1] = q8.1;
    let mut rows = 0;
    for (j, &(m, w)) in found.iter().enumerate() {
        if j == 2 {
            p.t[3] = enc.arg(w)?;
            p.aux[2] = enc.arg(m)?.ptr;
        }
        let r = g.get(w).ne[1];
        p.i[j] = r as i32;
        rows += r;
    }
    if let Some(m) = &rope {
        // The Q, K and V products are read by the rope and set_rows alone: the kernel writes
        // the rotated Q and the caches instead (see mmvq.cu).
        let (tq, tsk) = (g.get(m.q), g.get(m.sk));
        p.t[0] = enc.arg(m.q)?;
        p.t[4] = enc.arg(m.sk)?;
        p.t[5] = enc.arg(m.sv)?;
        p.t[6] = enc.arg(tq.src[1])?;
        p.t[7] = enc.arg(tsk.src[2])?;
        p.aux[2] = 0;
        p.i[4] = m.rp.n_dims as i32;
        p.i[5] = i32::from(g.get(tsk.src[2]).dtype == DType::I64);
        p.i[6] = tq.ne[0] as i32;
        p.f[0] = m.rp.freq_scale;
        p.f[1] = theta_scale(&m.rp);
    }
    let read_only = found.iter().all(|&(_, w)| enc.is_read_only_leaf(w));
    let (blocks, threads) = mmvq_launch(&mut p, rows as u64, read_only);
    let kernel = if rope.is_some() {
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
    Ok(rope.map_or(end, |m| m.last + 1) - i)
}

/// Whether the rope_kv step `m` takes the Q, K and V products `qkv` of one token (each read by
/// it alone, straight or through a reshape) in the form mmvq_multi_rope handles: adjacent
/// pairs, F16 caches, I32 positions, a contiguous rotated Q.
fn rope_follows_qkv(enc: &Encoder, m: &RopeKv, qkv: [TensorId; 3]) -> bool {
    let g = enc.graph;
    // `t` is `of`, or a reshape of it, and nothing else reads `of` (or the reshape).
    let takes = |t: TensorId, of: TensorId| {
        enc.single_use(of)
            && (t == of
                || (g.get(t).op == Op::Reshape && g.get(t).src[0] == of && enc.single_use(t)))
    };
    let (tq, tk, tsk, tsv) = (g.get(m.q), g.get(m.k), g.get(m.sk), g.get(m.sv));
    m.rp.mode == RopeMode::Normal
        && takes(tq.src[0], qkv[0])
        && takes(tk.src[0], qkv[1])
        && takes(tsv.src[1], qkv[2])
        && tq.is_contiguous()
        && tq.ne[2] == 1
        && tk.ne[0] == tq.ne[0]
        && g.get(tq.src[1]).dtype == DType::I32
        && matches!(g.get(tsk.src[2]).dtype, DType::I32 | DType::I64)
        && g.get(tsk.src[0]).dtype == DType::F16
        && g.get(qkv[0]).ne[0] == tq.ne[0] * tq.ne[1]
        && g.get(qkv[1]).ne[0] == tk.ne[0] * tk.ne[1]
}

/// The next node from `nodes[j]` on (looking at most 8 ahead) that runs a kernel, with its
/// index.
fn next_running(g: &Graph, nodes: &[TensorId], j: usize) -> Option<(usize, TensorId)> {
    g.next_computed(nodes, j, 8)
}

/// Whether set_rows node `s` stores the rotated K `k` (F32 `[hd, heads, tokens]`, read by
/// nothing else) into a cache the rope kernels can write: its source is the only reader of
/// `k`, a reshape to `[hd * heads, tokens]`; the cache is F16 or F32 `[hd * heads, rows]`.
fn stores_rotated_k(enc: &Encoder, s: TensorId, k: TensorId) -> bool {
    let g = enc.graph;
    let (ts, tk) = (g.get(s), g.get(k));
    if ts.op != Op::SetRows || tk.dtype != DType::F32 || tk.ne[3] != 1 || !enc.single_use(k) {
        return false;
    }
    let (rows, cache, idx) = (g.get(ts.src[1]), g.get(ts.src[0]), g.get(ts.src[2]));
    matches!(rows.op, Op::Reshape)
        && rows.src[0] == k
        && enc.single_use(ts.src[1])
        && rows.ne == [tk.ne[0] * tk.ne[1], tk.ne[2], 1, 1]
        && matches!(cache.dtype, DType::F16 | DType::F32)
        && cache.ne[0] == rows.ne[0]
        && cache.ne[2] == 1
        && cache.ne[3] == 1
        && idx.ne[0] == tk.ne[2]
        && idx.nelements() == idx.ne[0]
}

/// `set_rows(cache, reshape(rope(k)), idx)`: one rope_set_rows launch.
fn rope_set_rows(enc: &mut Encoder, nodes: &[TensorId], i: usize) -> Result<usize> {
    let g = enc.graph;
    let k = nodes[i];
    let tk = g.get(k);
    let Op::Rope(rp) = tk.op else { return Ok(0) };
    let Some((j, s)) = next_running(g, nodes, i + 1) else {
        return Ok(0);
    };
    if !stores_rotated_k(enc, s, k) {
        return Ok(0);
    }
    let ts = g.get(s);
    let (cache, idx) = (g.get(ts.src[0]), g.get(ts.src[2]));
    let mut p = rope_params(enc.arg(s)?, enc.arg(tk.src[0])?, enc.arg(tk.src[1])?, &rp);
    p.t[3] = enc.arg(ts.src[2])?;
    let name = format!("rope_set_rows_{}_{}", cache.dtype.name(), idx.dtype.name());
    enc.launch_elems(
        "rope",
        &name,
        [tk.ne[0] as i64 / 2, tk.ne[1] as i64, tk.ne[2] as i64, 1],
        p,
    )?;
    Ok(j - i + 1)
}

/// A Llama block's step between its projections and attention: `rope(q)`, `rope(k)`, then
/// `set_rows` of the rotated K and of V into their caches at the same rows, as [`match_rope_kv`]
/// finds it.
struct RopeKv {
    /// The rope of Q (its result is what attention reads).
    q: TensorId,
    /// The rope of K.
    k: TensorId,
    /// The set_rows of the rotated K (its result: the K cache).
    sk: TensorId,
    /// The set_rows of V (its result: the V cache).
    sv: TensorId,
    /// The rope's parameters.
    rp: RopeParams,
    /// The index of the last of the four nodes.
    last: usize,
}

/// The rope_kv step starting at `nodes[i]`, if it is one the rope kernels can run.
fn match_rope_kv(enc: &Encoder, nodes: &[TensorId], i: usize) -> Option<RopeKv> {
    let g = enc.graph;
    let q = nodes[i];
    let tq = g.get(q);
    let Op::Rope(rp) = tq.op else { return None };
    let (jk, k) = next_running(g, nodes, i + 1)?;
    let (jsk, sk) = next_running(g, nodes, jk + 1)?;
    let (jsv, sv) = next_running(g, nodes, jsk + 1)?;
    let (tk, tsk, tsv) = (g.get(k), g.get(sk), g.get(sv));
    if tk.op != tq.op
        || tk.src.len() != 2
        || tq.src.len() != 2
        || tk.src[1] != tq.src[1]
        || !stores_rotated_k(enc, sk, k)
        || tsv.op != Op::SetRows
        || tsv.src[2] != tsk.src[2]
    {
        return None;
    }
    let (v, kc, vc) = (g.get(tsv.src[1]), g.get(tsk.src[0]), g.get(tsv.src[0]));
    let tokens = tk.ne[2];
    let fits = tq.dtype == DType::F32
        && tq.ne[0] == tk.ne[0]
        && tq.ne[2] == tokens
        && tq.ne[3] == 1
        && v.dtype == DType::F32
        && v.ne == [vc.ne[0], tokens, 1, 1]
        && vc.dtype == kc.dtype
        && vc.ne[1] == kc.ne[1]
        && vc.ne[2] == 1
        && vc.ne[3] == 1;
    fits.then_some(RopeKv {
        q,
        k,
        sk,
        sv,
        rp,
        last: jsv,
    })
}

/// `rope(q)`, `rope(k)`, then `set_rows` of the rotated K and of V into their caches at the
/// same rows (a Llama block between its projections and attention): one rope_kv launch.
fn rope_kv(enc: &mut Encoder, nodes: &[TensorId], i: usize) -> Result<usize> {
    let Some(m) = match_rope_kv(enc, nodes, i) else {
        return Ok(0);
    };
    let g = enc.graph;
    let (tq, tk, tsk, tsv) = (g.get(m.q), g.get(m.k), g.get(m.sk), g.get(m.sv));
    let (v, kc) = (g.get(tsv.src[1]), g.get(tsk.src[0]));
    let tokens = tk.ne[2];
    let idx = g.get(tsk.src[2]);
    let name = format!("rope_kv_{}_{}", kc.dtype.name(), idx.dtype.name());
    let mut p = rope_params(
        enc.arg(m.sk)?,
        enc.arg(tk.src[0])?,
        enc.arg(tk.src[1])?,
        &m.rp,
    );
    p.t[3] = enc.arg(tsk.src[2])?;
    p.t[4] = enc.arg(tq.src[0])?;
    p.t[5] = enc.arg(m.q)?;
    p.t[6] = enc.arg(tsv.src[1])?;
    p.t[7] = enc.arg(m.sv)?;
    let threads = (tq.ne[1] + tk.ne[1]) * (tk.ne[0] / 2) + v.ne[0].div_ceil(2);
    enc.launch(
        "rope",
        &name,
        [
            (threads as u64).div_ceil(256).clamp(1, 65535) as u32,
            (tokens as u64).clamp(1, 65535) as u32,
            1,
        ],
        [256, 1, 1],
        0,
        p,
    )?;
    Ok(m.last - i + 1)
}
