//! mul_mat_id and add_id: out[:, e, t] = a[:, :, ids[e, t] - first] times b[:, e % n_b, t]
//! (0 where a does not hold that expert), and
//! out[:, e, t] = a[:, e, t] + b[:, ids[e, t]]. Quantized experts are dequantized; the
//! activations are not quantized.

use tessera_core::{Error, Graph, Result, TensorId};

use super::io::{self, Vals};

/// Id (e, t), checked against the `n` rows it picks from.
fn id_at(ids: &Vals, e: usize, t: usize, n: usize) -> Result<usize> {
    let v = ids.at(e, t, 0, 0);
    if v < 0.0 || v as usize >= n {
        return Err(Error::Invalid(format!("expert id {v} outside 0..{n}")));
    }
    Ok(v as usize)
}

/// Computes a mul_mat_id node whose experts start at id `first`.
pub(super) fn mul_mat_id(g: &Graph, id: TensorId, first: usize) -> Result<()> {
    let (a, b, ids) = (io::src(g, id, 0)?, io::src(g, id, 1)?, io::src(g, id, 2)?);
    let ne = g.get(id).ne;
    let mut out = Vec::with_capacity(ne.iter().product());
    for t in 0..ne[2] {
        for e in 0..ne[1] {
            let x = ids.at(e, t, 0, 0) - first as f64;
            let y = b.row(e % b.ne[1], t, 0);
            for i in 0..ne[0] {
                if x < 0.0 || x >= a.ne[2] as f64 {
                    out.push(0.0);
                } else {
                    out.push(
                        a.row(i, x as usize, 0)
                            .iter()
                            .zip(y)
                            .map(|(u, v)| u * v)
                            .sum(),
                    );
                }
            }
        }
    }
    io::write(g, id, &out)
}

/// Computes an add_id node.
pub(super) fn add_id(g: &Graph, id: TensorId) -> Result<()> {
    let (a, b, ids) = (io::src(g, id, 0)?, io::src(g, id, 1)?, io::src(g, id, 2)?);
    let ne = g.get(id).ne;
    let mut out = Vec::with_capacity(ne.iter().product());
    for t in 0..ne[2] {
        for e in 0..ne[1] {
            let r = id_at(&ids, e, t, b.ne[1])?;
            out.extend(
                a.row(e, t, 0)
                    .iter()
                    .zip(b.row(r, 0, 0))
                    .map(|(u, v)| u + v),
            );
        }
    }
    io::write(g, id, &out)
}
