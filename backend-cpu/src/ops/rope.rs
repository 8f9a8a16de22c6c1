//! Rotary position embedding. Pair k (k < n_dims/2) turns by theta_k = pos *
//! base^(-2k/n_dims) / factor_k, scaled and blended as [`RopeParams::cos_sin`] says; as in ggml,
//! base^(-2k/n_dims) is built by repeated multiplication in f32. Normal mode rotates adjacent
//! pairs (2k, 2k+1), NEOX mode the halves (k, k + n_dims/2); dimensions from n_dims on are
//! copied unchanged.

use tessera_core::{Error, Result, RopeMode, RopeParams};

use crate::parallel::for_ranges;
use crate::view::TView;

/// Applies rope to `src` [head_dim, heads, tokens, b] at the I32 positions `pos` [tokens];
/// `dst` may share `src`'s memory; `factors` (F32 `[n_dims / 2]`) divide each pair's angle.
pub(crate) fn run(
    p: &RopeParams,
    dst: &TView,
    src: &TView,
    pos: &TView,
    factors: Option<&TView>,
) -> Result<()> {
    let n = src.ne[0];
    if p.n_dims & 1 != 0 || p.n_dims > n {
        return Err(Error::Invalid(format!(
            "rope: n_dims {} must be even and at most {n}",
            p.n_dims
        )));
    }
    let half = p.n_dims / 2;
    let theta_scale = p.freq_base.powf(-2.0 / p.n_dims as f32);
    let mut inv_factor = vec![1f32; half];
    if let Some(f) = factors {
        let mut row = vec![0f32; half];
        f.load_row([0, 0, 0], &mut row)?;
        for (inv, f) in inv_factor.iter_mut().zip(row) {
            *inv = 1.0 / f;
        }
    }
    let corr = p.yarn_corr_dims();
    for_ranges(dst.nrows(), n * 4, |rows| {
        let mut x = vec![0f32; n];
        let mut y = vec![0f32; n];
        let mut cs = vec![(0f32, 0f32); half];
        let mut cached_token = None;
        for r in rows {
            let i = dst.row_index(r);
            let token = (i[1], i[2]);
            if cached_token != Some(token) {
                let mut theta = pos.get_int([i[1], 0, 0, 0]) as f32;
                for (k, c) in cs.iter_mut().enumerate() {
                    *c = p.cos_sin(theta * inv_factor[k], k, corr);
                    theta *= theta_scale;
                }
                cached_token = Some(token);
            }
            src.load_row(i, &mut x)?;
            for (k, &(cos, sin)) in cs.iter().enumerate() {
                let (i0, i1) = match p.mode {
                    RopeMode::Normal => (2 * k, 2 * k + 1),
                    RopeMode::Neox => (k, k + half),
                };
                let (x0, x1) = (x[i0], x[i1]);
                y[i0] = x0 * cos - x1 * sin;
                y[i1] = x0 * sin + x1 * cos;
            }
            y[p.n_dims..].copy_from_slice(&x[p.n_dims..]);
            dst.store_row(i, &y)?;
        }
        Ok(())
    })
}
