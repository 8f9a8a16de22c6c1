//! All-reduce nodes: the peer kernel of the group the backend joined (kernels/allreduce.cu,
//! launched by [`crate::comm::peer`]).

use tessera_core::dtype::DType;
use tessera_core::{BinaryOp, Op, Result, TensorId};

use super::Encoder;

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
    let cmd = group.command(rank, d.ptr, d.ptr, 0, count)?;
    enc.cmds.push(cmd);
    Ok(())
}

/// An all-reduce node followed by the addition of its sum to another tensor (a residual
/// connection): one kernel writes the sum plus the residual straight into the addition's
/// result. Applies when the summed tensor has no other reader, so its memory need not hold
/// the sum. Returns the nodes consumed (0: the pattern is not here).
pub(super) fn all_reduce_add(enc: &mut Encoder, nodes: &[TensorId], i: usize) -> Result<usize> {
    let g = enc.graph;
    let ar = nodes[i];
    let t = g.get(ar);
    if t.op != Op::AllReduce {
        return Ok(0);
    }
    let Some((group, rank)) = enc.group.clone() else {
        return Ok(0);
    };
    let Some(&add) = nodes.get(i + 1) else {
        return Ok(0);
    };
    let ta = g.get(add);
    let x = t.src[0];
    if ta.op != Op::Binary(BinaryOp::Add) || !ta.src.contains(&x) || ta.src[0] == ta.src[1] {
        return Ok(0);
    }
    // x is read by the all-reduce node and the addition only; nothing reads the node itself.
    if enc.use_count(x) != 2 || enc.use_count(ar) != 0 {
        return Ok(0);
    }
    let res = if ta.src[0] == x { ta.src[1] } else { ta.src[0] };
    let tr = g.get(res);
    let flat =
        |u: &tessera_core::Tensor| u.dtype == DType::F32 && u.is_contiguous() && u.ne == t.ne;
    if !flat(ta) || !flat(tr) {
        return Ok(0);
    }
    let count = t.nelements();
    if count > group.max_elements() {
        return Ok(0);
    }
    let (out, input, residual) = (enc.arg(add)?, enc.arg(x)?, enc.arg(res)?);
    enc.q8 = None;
    let cmd = group.command(rank, out.ptr, input.ptr, residual.ptr, count)?;
    enc.cmds.push(cmd);
    Ok(2)
}
