//! argsort and top_k: each row's indices in order of value (largest first for top_k), equal
//! values in index order.

use tessera_core::{Graph, Result, TensorId};

use super::io;

/// The first `ne[0]` of each row's indices, sorted by value.
pub(super) fn sorted(g: &Graph, id: TensorId, descending: bool) -> Result<()> {
    let a = io::src(g, id, 0)?;
    let k = g.get(id).ne[0];
    let mut out = Vec::new();
    for row in a.v.chunks_exact(a.ne[0].max(1)) {
        let mut idx: Vec<usize> = (0..row.len()).collect();
        // A stable sort keeps equal values in index order.
        if descending {
            idx.sort_by(|&i, &j| row[j].total_cmp(&row[i]));
        } else {
            idx.sort_by(|&i, &j| row[i].total_cmp(&row[j]));
        }
        out.extend(idx[..k].iter().map(|&i| i as f64));
    }
    io::write(g, id, &out)
}
