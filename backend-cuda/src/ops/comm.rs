//! All-reduce nodes: the peer kernel of the group the backend joined (kernels/allreduce.cu,
//! launched by [`crate::comm::peer`]).

use std::sync::Arc;

use tessera_core::dtype::DType;
use tessera_core::fusion::{AllReduceAdd, RmsNormMul};
use tessera_core::{Result, TensorId};

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
/// connection), as the fusion matcher finds it: one kernel writes the sum plus the residual
/// straight into the addition's result (the summed tensor has no other reader, so its memory
/// need not hold the sum); with the next block's `rms_norm(sum) * w` of one row after it, the
/// kernel applies that too ([`all_reduce_add_norm`]). `Ok(false)`: the group's kernel does not
/// take these tensors.
pub(super) fn all_reduce_add(
    enc: &mut Encoder,
    nodes: &[TensorId],
    m: &AllReduceAdd,
) -> Result<bool> {
    let Some(r) = reduce_add(enc, m) else {
        return Ok(false);
    };
    if let Some(n) = &m.norm {
        return all_reduce_add_norm(enc, nodes, &r, n);
    }
    let (out, input, residual) = (enc.arg(m.add)?, enc.arg(m.x)?, enc.arg(m.residual)?);
    enc.q8 = None;
    let sent = enc.present.take() == Some(m.x);
    let cmd = r
        .group
        .command(r.rank, out.ptr, input.ptr, residual.ptr, r.count, sent)?;
    enc.cmds.push(cmd);
    Ok(true)
}

/// [`all_reduce_add`] of one row followed by `rms_norm(sum) * w` (the next Llama block's
/// norm, read by nothing else): one kernel does all four nodes, and quantizes the normed row
/// when quantized mat-vecs read it next.
fn all_reduce_add_norm(
    enc: &mut Encoder,
    nodes: &[TensorId],
    r: &ReduceAdd,
    n: &RmsNormMul,
) -> Result<bool> {
    let g = enc.graph;
    let m = r.m;
    let (tn, tm, tw) = (g.get(n.norm), g.get(n.mul), g.get(n.w));
    let fits = tm.dtype == DType::F32
        && tm.is_contiguous()
        && tm.ne == tn.ne
        && tn.ne[1..] == [1, 1, 1]
        && tw.dtype == DType::F32
        && tw.is_contiguous()
        && tw.ne == [tn.ne[0], 1, 1, 1];
    if !fits {
        return Ok(false);
    }
    let q8 = if super::fused::feeds_mmvq(enc, nodes, n.last + 1, n.mul)? {
        let blocks = tm.nelements() / 32;
        Some((enc.scratch(blocks * 32), enc.scratch(blocks * 8)))
    } else {
        None
    };
    let tail = NormTail {
        weight: enc.arg(n.w)?.ptr,
        out: enc.arg(n.mul)?.ptr,
        q8,
        eps: n.eps,
    };
    let t = [
        enc.arg(m.add)?.ptr,
        enc.arg(m.x)?.ptr,
        enc.arg(m.residual)?.ptr,
    ];
    let sent = enc.present == Some(m.x);
    let Some(cmd) = r.group.norm_command(r.rank, t, r.count, &tail, sent)? else {
        return Ok(false);
    };
    enc.present = None;
    enc.cmds.push(cmd);
    enc.q8 = q8.map(|q| (n.mul, q));
    Ok(true)
}

/// An all-reduce-then-add group that the group's kernel takes.
struct ReduceAdd {
    group: Arc<PeerGroup>,
    rank: usize,
    m: AllReduceAdd,
    count: usize,
}

/// The all-reduce-then-add group `m` where this stream joined a peer group, both operands and
/// the result are flat f32 of one shape, and the group's kernel takes that many elements.
fn reduce_add(enc: &Encoder, m: &AllReduceAdd) -> Option<ReduceAdd> {
    let g = enc.graph;
    let (group, rank) = enc.group.clone()?;
    let t = g.get(m.reduce);
    let flat =
        |u: &tessera_core::Tensor| u.dtype == DType::F32 && u.is_contiguous() && u.ne == t.ne;
    let count = t.nelements();
    if !flat(g.get(m.add)) || !flat(g.get(m.residual)) || count > group.max_elements() {
        return None;
    }
    Some(ReduceAdd {
        group,
        rank,
        m: *m,
        count,
    })
}
