//! rope: each pair of rotated dimensions of a head turned by theta_i = pos * freq_scale *
//! freq_base^(-2i / n_dims); normal mode pairs (2i, 2i+1), neox mode (i, i + n_dims/2);
//! dimensions past n_dims are copied.

use tessera_core::{Graph, Result, RopeMode, RopeParams, TensorId};

use super::io;

/// Computes node `id`: src0 [head_dim, heads, tokens, d3], src1 the i32 positions [tokens].
pub(super) fn rope(g: &Graph, id: TensorId, p: &RopeParams) -> Result<()> {
    let (a, pos) = (io::src(g, id, 0)?, io::src(g, id, 1)?);
    let ne = a.ne;
    let half = p.n_dims / 2;
    let mut out = a.v.clone();
    for (r, row) in out.chunks_exact_mut(ne[0].max(1)).enumerate() {
        let token = (r / ne[1]) % ne[2];
        let position = pos.v[token];
        for i in 0..half {
            let theta = position
                * p.freq_scale as f64
                * (p.freq_base as f64).powf(-2.0 * i as f64 / p.n_dims as f64);
            let (sin, cos) = theta.sin_cos();
            let (j, k) = match p.mode {
                RopeMode::Normal => (2 * i, 2 * i + 1),
                RopeMode::Neox => (i, i + half),
            };
            let (x0, x1) = (row[j], row[k]);
            row[j] = x0 * cos - x1 * sin;
            row[k] = x0 * sin + x1 * cos;
        }
    }
    io::write(g, id, &out)
}
