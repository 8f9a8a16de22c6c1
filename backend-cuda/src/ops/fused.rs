//! Fused kernels: op sequences of a Llama block replaced by one kernel each, when the
//! intermediate results are read by nothing else.
//!
//! - `rms_norm(x) * w` (the mul right after the norm): one pass per row (norm.cu).
//! - `swiglu(W_gate x, W_up x)` for one token with quantized weights: both mat-vecs and the
//!   activation in one kernel that quantizes x once (mmvq.cu).
//! - `set_rows(cache, reshape(rope(k)), idx)`: the rotated K written straight into the F16 (or
//!   F32) KV cache (rope.cu).
//!
//! Each result is the unfused ops' result up to float rounding; the GPU tests check both ways.

use tessera_core::dtype::DType;
use tessera_core::{BinaryOp, GluOp, Op, Result, TensorId};

use super::matmul::{has_mmvq, mmvq_aligned, quantize_q8};
use super::rope::rope_params;
use super::{params, Encoder};

/// How many graph nodes read each tensor (outputs count as an extra reader).
pub(super) fn use_counts(g: &tessera_core::Graph) -> Vec<u32> {
    let mut uses = vec![0u32; g.len()];
    for id in g.ids() {
        let t = g.get(id);
        for &s in &t.src {
            uses[s.index()] += 1;
        }
        if t.flags.output {
            uses[id.index()] += 1;
        }
    }
    uses
}

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
    rope_set_rows(enc, nodes, i)
}

fn rms_norm_mul(enc: &mut Encoder, nodes: &[TensorId], i: usize) -> Result<usize> {
    let g = enc.graph;
    let r = nodes[i];
    let tr = g.get(r);
    let Op::RmsNorm { eps } = tr.op else { return Ok(0) };
    let Some(&m) = nodes.get(i + 1) else { return Ok(0) };
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
    enc.launch("norm", "rms_norm_mul_f32", [rows, 1, 1], [super::norm::row_block(tr.ne[0] as i64), 1, 1], 0, p)?;
    Ok(2)
}

fn gate_up_swiglu(enc: &mut Encoder, nodes: &[TensorId], i: usize) -> Result<usize> {
    let g = enc.graph;
    let (Some(&a), Some(&b), Some(&s)) = (nodes.get(i), nodes.get(i + 1), nodes.get(i + 2)) else { return Ok(0) };
    let ts = g.get(s);
    if ts.op != (Op::Glu { op: GluOp::Swiglu, swapped: false }) || ts.src.len() != 2 {
        return Ok(0);
    }
    let (gate, up) = (ts.src[0], ts.src[1]);
    if !((gate == a && up == b) || (gate == b && up == a)) {
        return Ok(0);
    }
    let (tg, tu) = (g.get(gate), g.get(up));
    if tg.op != Op::MulMat || tu.op != Op::MulMat || !enc.single_use(gate) || !enc.single_use(up) || tg.src[1] != tu.src[1] {
        return Ok(0);
    }
    let (wg, wu, x) = (g.get(tg.src[0]), g.get(tu.src[0]), g.get(tg.src[1]));
    let one_token = x.ne[1] == 1 && x.ne[2] == 1 && x.ne[3] == 1 && wg.ne[2] == 1 && wg.ne[3] == 1;
    if !one_token || wg.dtype != wu.dtype || wg.ne != wu.ne || !has_mmvq(wg.dtype) || ts.dtype != DType::F32 {
        return Ok(0);
    }
    let (ga, ua) = (enc.arg(tg.src[0])?, enc.arg(tu.src[0])?);
    if !mmvq_aligned(wg.dtype, &ga) || !mmvq_aligned(wu.dtype, &ua) {
        return Ok(0);
    }
    let xa = enc.arg(tg.src[1])?;
    let q8 = quantize_q8(enc, xa, x.dtype)?;
    let mut p = params(enc.arg(s)?, &[ga, ua]);
    p.aux = [q8.0, q8.1];
    let grid = (wg.ne[1] as u64).div_ceil(4) as u32;
    enc.launch("mmvq", &format!("mmvq_glu_{}", wg.dtype.name()), [grid, 1, 1], [128, 1, 1], 0, p)?;
    Ok(3)
}

fn rope_set_rows(enc: &mut Encoder, nodes: &[TensorId], i: usize) -> Result<usize> {
    let g = enc.graph;
    let k = nodes[i];
    let tk = g.get(k);
    let Op::Rope(rp) = tk.op else { return Ok(0) };
    if tk.dtype != DType::F32 || tk.ne[3] != 1 || !enc.single_use(k) {
        return Ok(0);
    }
    // Optionally one reshape of the rotated K, then the set_rows.
    let mut j = i + 1;
    let mut rows_src = k;
    if let Some(&v) = nodes.get(j) {
        let tv = g.get(v);
        if matches!(tv.op, Op::Reshape) && tv.src[0] == k {
            if !enc.single_use(v) || tv.ne != [tk.ne[0] * tk.ne[1], tk.ne[2], 1, 1] {
                return Ok(0);
            }
            rows_src = v;
            j += 1;
        }
    }
    let Some(&s) = nodes.get(j) else { return Ok(0) };
    let ts = g.get(s);
    if ts.op != Op::SetRows || ts.src[1] != rows_src {
        return Ok(0);
    }
    let (cache, idx) = (g.get(ts.src[0]), g.get(ts.src[2]));
    let fits = matches!(cache.dtype, DType::F16 | DType::F32)
        && cache.ne[0] == tk.ne[0] * tk.ne[1]
        && cache.ne[2] == 1
        && cache.ne[3] == 1
        && idx.ne[0] == tk.ne[2]
        && idx.nelements() == idx.ne[0];
    if !fits {
        return Ok(0);
    }
    let p0 = rope_params(enc.arg(s)?, enc.arg(tk.src[0])?, enc.arg(tk.src[1])?, &rp);
    let mut p = p0;
    p.t[3] = enc.arg(ts.src[2])?;
    let name = format!("rope_set_rows_{}_{}", cache.dtype.name(), idx.dtype.name());
    enc.launch_elems("rope", &name, [tk.ne[0] as i64 / 2, tk.ne[1] as i64, tk.ne[2] as i64, 1], p)?;
    Ok(j - i + 1)
}
