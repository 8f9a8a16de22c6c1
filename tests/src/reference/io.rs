//! Reading a graph tensor as f64 and storing f64 results, through its buffer.

use tessera_core::{Error, Graph, Result, TensorId};

use crate::tensor_io;

/// A tensor's values in logical order, with its shape.
pub(super) struct Vals {
    /// Shape.
    pub ne: [usize; 4],
    /// Values, element (i0, i1, i2, i3) at `i0 + ne0 * (i1 + ne1 * (i2 + ne2 * i3))`.
    pub v: Vec<f64>,
}

impl Vals {
    /// Element (i0, i1, i2, i3).
    pub fn at(&self, i0: usize, i1: usize, i2: usize, i3: usize) -> f64 {
        self.v[tensor_io::flat(self.ne, i0, i1, i2, i3)]
    }

    /// Row (i1, i2, i3).
    pub fn row(&self, i1: usize, i2: usize, i3: usize) -> &[f64] {
        let s = tensor_io::flat(self.ne, 0, i1, i2, i3);
        &self.v[s..s + self.ne[0]]
    }
}

/// The bytes a tensor spans, from its buffer.
fn span(g: &Graph, id: TensorId) -> Result<Vec<u8>> {
    let d = g.data_or_err(id)?;
    let mut bytes = vec![0u8; g.get(id).nbytes()];
    d.buffer.get(d.offset, &mut bytes)?;
    Ok(bytes)
}

/// Source `i` of node `id`, as f64.
pub(super) fn src(g: &Graph, id: TensorId, i: usize) -> Result<Vals> {
    let s = *g
        .get(id)
        .src
        .get(i)
        .ok_or_else(|| Error::Invalid(format!("{} has no source {i}", g.label(id))))?;
    read(g, s)
}

/// Tensor `id` as f64.
pub(super) fn read(g: &Graph, id: TensorId) -> Result<Vals> {
    let t = g.get(id);
    Ok(Vals {
        ne: t.ne,
        v: tensor_io::read(t, &span(g, id)?)?,
    })
}

/// Stores `v` (logical order) as tensor `id`'s values, in its type and layout.
pub(super) fn write(g: &Graph, id: TensorId, v: &[f64]) -> Result<()> {
    let d = g.data_or_err(id)?;
    let mut bytes = span(g, id)?;
    tensor_io::write(g.get(id), &mut bytes, v)?;
    d.buffer.set(d.offset, &bytes)
}

/// Stores one row (i1, i2, i3) of tensor `id` (its rows contiguous), leaving the rest alone.
pub(super) fn write_row(g: &Graph, id: TensorId, i: [usize; 3], v: &[f64]) -> Result<()> {
    let t = g.get(id);
    let d = g.data_or_err(id)?;
    let mut bytes = vec![0u8; t.dtype.row_size(t.ne[0])?];
    tensor_io::encode_row(t.dtype, v, &mut bytes)?;
    d.buffer.set(
        d.offset + i[0] * t.nb[1] + i[1] * t.nb[2] + i[2] * t.nb[3],
        &bytes,
    )
}
