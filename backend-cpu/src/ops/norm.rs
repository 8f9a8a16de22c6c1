//! Row normalisations: rms_norm and norm (layer norm without the affine part). Sums are taken
//! in f64, as ggml does.

use tessera_core::Result;

use super::map_rows;
use crate::view::TView;

/// x / sqrt(mean(x^2) + eps) over each row.
pub(crate) fn rms_norm(dst: &TView, src: &TView, eps: f32) -> Result<()> {
    map_rows(dst, src, 3, |_, a, out| {
        let sum: f64 = a.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
        let mean = (sum / a.len() as f64) as f32;
        let s = 1.0 / (mean + eps).sqrt();
        for (o, &x) in out.iter_mut().zip(a) {
            *o = x * s;
        }
    })
}

/// (x - mean) / sqrt(variance + eps) over each row.
pub(crate) fn norm(dst: &TView, src: &TView, eps: f32) -> Result<()> {
    map_rows(dst, src, 4, |_, a, out| {
        let n = a.len() as f64;
        let mean = (a.iter().map(|&x| f64::from(x)).sum::<f64>() / n) as f32;
        let var: f64 = a
            .iter()
            .map(|&x| f64::from(x - mean) * f64::from(x - mean))
            .sum::<f64>()
            / n;
        let s = 1.0 / (var as f32 + eps).sqrt();
        for (o, &x) in out.iter_mut().zip(a) {
            *o = (x - mean) * s;
        }
    })
}
