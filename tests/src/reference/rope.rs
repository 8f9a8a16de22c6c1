//! rope (ggml's rope_ext): pair k of the rotated dimensions of a head turns by an angle made
//! from theta_k = pos * freq_base^(-2k / n_dims) / factor_k (factor_k from the optional third
//! source, else 1): freq_scale * theta_k, or with YaRN (ext_factor != 0) a blend of that and
//! theta_k itself ramping over YaRN's correction range; cos and sin are multiplied by
//! attn_factor (with YaRN also by 1 + 0.1 ln(1 / freq_scale)). Normal mode pairs (2k, 2k+1),
//! neox mode (k, k + n_dims/2); dimensions past n_dims are copied.

use std::f64::consts::PI;

use tessera_core::{Graph, Result, RopeMode, RopeParams, TensorId};

use super::io;

/// YaRN's correction range in f64: the pair indices (clamped to the rotated dimensions) of the
/// pairs that turn beta_fast and beta_slow times over the original context.
fn corr_dims(p: &RopeParams) -> [f64; 2] {
    let n = p.n_dims as f64;
    let dim = |rotations: f64| {
        n * (p.n_ctx_orig as f64 / (rotations * 2.0 * PI)).ln() / (2.0 * (p.freq_base as f64).ln())
    };
    [
        dim(p.beta_fast as f64).floor().max(0.0),
        dim(p.beta_slow as f64).ceil().min(n - 1.0),
    ]
}

/// Computes node `id`: src0 [head_dim, heads, tokens, d3], src1 the i32 positions [tokens],
/// src2 (optional) the f32 frequency factors [n_dims / 2].
pub(super) fn rope(g: &Graph, id: TensorId, p: &RopeParams) -> Result<()> {
    let (a, pos) = (io::src(g, id, 0)?, io::src(g, id, 1)?);
    let factors = if g.get(id).src.len() > 2 {
        Some(io::src(g, id, 2)?.v)
    } else {
        None
    };
    let ne = a.ne;
    let half = p.n_dims / 2;
    let corr = corr_dims(p);
    let (freq_scale, ext) = (p.freq_scale as f64, p.ext_factor as f64);
    let mut out = a.v.clone();
    for (r, row) in out.chunks_exact_mut(ne[0].max(1)).enumerate() {
        let token = (r / ne[1]) % ne[2];
        let position = pos.v[token];
        for i in 0..half {
            let factor = factors.as_ref().map_or(1.0, |f| f[i]);
            let theta =
                position * (p.freq_base as f64).powf(-2.0 * i as f64 / p.n_dims as f64) / factor;
            let mut angle = freq_scale * theta;
            let mut mag = p.attn_factor as f64;
            if ext != 0.0 {
                let y = (i as f64 - corr[0]) / (corr[1] - corr[0]).max(0.001);
                let ramp = (1.0 - y.clamp(0.0, 1.0)) * ext;
                angle = angle * (1.0 - ramp) + theta * ramp;
                mag *= 1.0 + 0.1 * (1.0 / freq_scale).ln();
            }
            let (sin, cos) = angle.sin_cos();
            let (sin, cos) = (sin * mag, cos * mag);
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
