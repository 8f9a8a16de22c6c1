//! All-reduce nodes: the peer kernel of the group the backend joined (kernels/allreduce.cu,
//! launched by [`crate::comm::peer`]).

use std::sync::Arc;

use tessera_core::dtype::DType;
use tessera_core::{BinaryOp, Op, Result, TensorId};

use super::Encoder;
use crate::comm::peer::{NormTail, PeerGroup};

/// src0 summed over the group's ranks, in place.
pub(super) fn all_reduce(enc: &mut Encoder, id: TensorId) -> Result<()> {
    let Some((group, rank)) = enc.group.clone() else {
        return Err(enc.unsupported(id, "this stream has joined no all-reduce group"));
    };
    let count = enc.graph.get(id).nelements();
    if count > group.max_elements() {
        return Err(enc.unsupported(
            id,
            &format!(
                "{count} elements are more than the group's {} scratch elements",
                group.max_elements()
            ),
        ));
    }
    let d = enc.arg(id)?;
    enc.q8 = None;
    let sent = enc.present.take() == Some(enc.graph.get(id).src[0]);
    let cmd = group.command(rank, d.ptr, d.ptr, 0, count, sent)?;
    enc.cmds.push(cmd);
    Ok(())
}

/// An all-reduce node followed by the addition of its sum to another tensor (a residual
/// connection): one kernel writes the sum plus the residual straight into the addition's
/// result. Applies when the summed tensor has no other reader, so its memory need not hold
/// the sum. Returns the nodes consumed (0: the pattern is not here).
pub(super) fn all_reduce_add(enc: &mut Encoder, nodes: &[TensorId], i: usize) -> Result<usize> {
    let Some(m) = add_after(enc, nodes, i) else {
        return Ok(0);
    };
    let (out, input, residual) = (enc.arg(m.add)?, enc.arg(m.x)?, enc.arg(m.res)?);
    enc.q8 = None;
    let sent = enc.present.take() == Some(m.x);
    let cmd = m
        .group
        .command(m.rank, out.ptr, input.ptr, residual.ptr, m.count, sent)?;
    enc.cmds.push(cmd);
    Ok(2)
}

/// [`all_reduce_add`] of one row followed by `rms_norm(sum) * w` (the next Llama block's
/// norm, read by nothing else): one kernel does all four nodes, and quantizes the normed row
/// when quantized mat-vecs read it next. Returns the nodes consumed (0: the pattern is not
/// here, or the group's kernel does not take this row).
pub(super) fn all_reduce_add_norm(
    enc: &mut Encoder,
    nodes: &[TensorId],
    i: usize,
) -> Result<usize> {
    let Some(m) = add_after(enc, nodes, i) else {
        return Ok(0);
    };
    let g = enc.graph;
    let (Some(&norm), Some(&mul)) = (nodes.get(i + 2), nodes.get(i + 3)) else {
        return Ok(0);
    };
    let (tn, tm) = (g.get(norm), g.get(mul));
    let Op::RmsNorm { eps } = tn.op else {
        return Ok(0);
    };
    let w = tm.src[1];
    let tw = g.get(w);
    let fits = tn.src[0] == m.add
        && enc.single_use(norm)
        && tm.op == Op::Binary(BinaryOp::Mul)
        && tm.src[0] == norm
        && tm.dtype == DType::F32
        && tm.is_contiguous()
        && tm.ne == tn.ne
        && tn.ne[1..] == [1, 1, 1]
        && tw.dtype == DType::F32
        && tw.is_contiguous()
        && tw.ne == [tn.ne[0], 1, 1, 1];
    if !fits {
        return Ok(0);
    }
    let q8 = if super::fused::feeds_mmvq(enc, nodes, i + 4, mul)? {
        let blocks = tm.nelements() / 32;
        Some((enc.scratch(blocks * 32), enc.scratch(blocks * 8)))
    } else {
        None
    };
    let tail = NormTail {
        weight: enc.arg(w)?.ptr,
        out: enc.arg(mul)?.ptr,
        q8,
        eps,
    };
    let t = [enc.arg(m.add)?.ptr, enc.arg(m.x)?.ptr, enc.arg(m.res)?.ptr];
    let sent = enc.present == Some(m.x);
    let Some(cmd) = m.group.norm_command(m.rank, t, m.count, &tail, sent)? else {
        return Ok(0);
    };
    enc.present = None;
    enc.cmds.push(cmd);
    enc.q8 = q8.map(|q| (mul, q));
    Ok(4)
}

/// An all-reduce node at `nodes[i]` whose sum is added to a residual right after it.
struct ReduceAdd {
    group: Arc<PeerGroup>,
    rank: usize,
    /// The summed tensor (summed in place by the all-reduce node).
    x: TensorId,
    /// The addition and its other operand.
    add: TensorId,
    res: TensorId,
    count: usize,
}

/// The all-reduce-then-add pattern at `nodes[i]`, where the summed tensor is read by the two
/// nodes alone, both operands and the result are flat f32 of one shape, and the group's kernel
/// takes that many elements.
fn add_after(enc: &Encoder, nodes: &[TensorId], i: usize) -> Option<ReduceAdd> {
    let g = enc.graph;
    let ar = nodes[i];
    let t = g.get(ar);
    if t.op != Op::AllReduce {
        return None;
    }
    let (group, rank) = enc.group.clone()?;
    let add = *nodes.get(i + 1)?;
    let ta = g.get(add);
    let x = t.src[0];
    if ta.op != Op::Binary(BinaryOp::Add) || !ta.src.contains(&x) || ta.src[0] == ta.src[1] {
        return None;
    }
    // x is read by the all-reduce node and the addition only; nothing reads the node itself.
    if enc.use_count(x) != 2 || enc.use_count(ar) != 0 {
        return None;
    }
    let res = if ta.src[0] == x { ta.src[1] } else { ta.src[0] };
    let flat =
        |u: &tessera_core::Tensor| u.dtype == DType::F32 && u.is_contiguous() && u.ne == t.ne;
    let count = t.nelements();
    if !flat(ta) || !flat(g.get(res)) || count > group.max_elements() {
        return None;
    }
    Some(ReduceAdd {
        group,
        rank,
        x,
        add,
        res,
        count,
    })
}
