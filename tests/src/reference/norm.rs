//! rms_norm and norm over each row.

use tessera_core::{Graph, Result, TensorId};

use super::io;

fn each_row(g: &Graph, id: TensorId, f: impl Fn(&[f64], &mut Vec<f64>)) -> Result<()> {
    let a = io::src(g, id, 0)?;
    let mut out = Vec::with_capacity(a.v.len());
    for row in a.v.chunks_exact(a.ne[0].max(1)) {
        f(row, &mut out);
    }
    io::write(g, id, &out)
}

/// x / sqrt(mean(x^2) + eps)
pub(super) fn rms_norm(g: &Graph, id: TensorId, eps: f64) -> Result<()> {
    each_row(g, id, |row, out| {
        let ms = row.iter().map(|x| x * x).sum::<f64>() / row.len() as f64;
        let s = 1.0 / (ms + eps).sqrt();
        out.extend(row.iter().map(|x| x * s));
    })
}

/// (x - mean) / sqrt(var + eps)
pub(super) fn norm(g: &Graph, id: TensorId, eps: f64) -> Result<()> {
    each_row(g, id, |row, out| {
        let n = row.len() as f64;
        let mean = row.iter().sum::<f64>() / n;
        let var = row.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
        let s = 1.0 / (var + eps).sqrt();
        out.extend(row.iter().map(|x| (x - mean) * s));
    })
}
