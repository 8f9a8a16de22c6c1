//! mul_mat: out[i, j, p, q] = sum_l a[l, i, p / r2, q / r3] * b[l, j, p, q], with
//! r2 = b.ne2 / a.ne2 and r3 = b.ne3 / a.ne3 (a's batches broadcast). Quantized weights are
//! dequantized; the activations are not quantized.

use tessera_core::{Graph, Result, TensorId};

use super::io;

/// Computes node `id`.
pub(super) fn mul_mat(g: &Graph, id: TensorId) -> Result<()> {
    let (a, b) = (io::src(g, id, 0)?, io::src(g, id, 1)?);
    let ne = g.get(id).ne;
    let (r2, r3) = (b.ne[2] / a.ne[2].max(1), b.ne[3] / a.ne[3].max(1));
    let mut out = Vec::with_capacity(ne.iter().product());
    for q in 0..ne[3] {
        for p in 0..ne[2] {
            for j in 0..ne[1] {
                let y = b.row(j, p, q);
                for i in 0..ne[0] {
                    let x = a.row(i, p / r2.max(1), q / r3.max(1));
                    out.push(x.iter().zip(y).map(|(u, v)| u * v).sum());
                }
            }
        }
    }
    io::write(g, id, &out)
}
