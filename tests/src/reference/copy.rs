//! cpy, cont, dup: the source's values, in logical order, stored in the result's type and
//! layout (for cpy, the memory of its destination).

use tessera_core::{Graph, Result, TensorId};

use super::io;

/// Copies source 0 into node `id`.
pub(super) fn copy(g: &Graph, id: TensorId) -> Result<()> {
    io::write(g, id, &io::src(g, id, 0)?.v)
}
