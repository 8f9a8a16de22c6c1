//! All-reduce nodes: the peer kernel of the group the backend joined (kernels/allreduce.cu,
//! launched by [`crate::comm::peer`]).

use tessera_core::{Result, TensorId};

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
    let cmd = group.command(rank, d.ptr, count)?;
    enc.cmds.push(cmd);
    Ok(())
}
