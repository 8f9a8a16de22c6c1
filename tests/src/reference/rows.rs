//! get_rows and set_rows.

use tessera_core::{Error, Graph, Result, TensorId};

use super::io::{self, Vals};

/// A row index from an index tensor, checked against the row count.
fn index(idx: &Vals, i: [usize; 3], rows: usize) -> Result<usize> {
    let v = idx.at(i[0], i[1], i[2], 0);
    if v < 0.0 || v as usize >= rows {
        return Err(Error::Invalid(format!("row index {v} outside 0..{rows}")));
    }
    Ok(v as usize)
}

/// out[:, i, j, k] = a[:, idx[i, j, k], j, k]
pub(super) fn get_rows(g: &Graph, id: TensorId) -> Result<()> {
    let (a, idx) = (io::src(g, id, 0)?, io::src(g, id, 1)?);
    let ne = g.get(id).ne;
    let mut out = Vec::with_capacity(ne.iter().product());
    for k in 0..ne[3] {
        for j in 0..ne[2] {
            for i in 0..ne[1] {
                let r = index(&idx, [i, j, k], a.ne[1])?;
                out.extend_from_slice(a.row(r, j, k));
            }
        }
    }
    io::write(g, id, &out)
}

/// dst[:, idx[i, j % m2, k % m3], j, k] = b[:, i, j, k]; other rows keep their values.
pub(super) fn set_rows(g: &Graph, id: TensorId) -> Result<()> {
    let (b, idx) = (io::src(g, id, 1)?, io::src(g, id, 2)?);
    let rows = g.get(id).ne[1];
    for k in 0..b.ne[3] {
        for j in 0..b.ne[2] {
            for i in 0..b.ne[1] {
                let r = index(&idx, [i, j % idx.ne[1], k % idx.ne[2]], rows)?;
                io::write_row(g, id, [r, j, k], b.row(i, j, k))?;
            }
        }
    }
    Ok(())
}
