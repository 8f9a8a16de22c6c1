//! sum, sum_rows, mean and argmax.

use tessera_core::{Graph, Result, TensorId};

use super::io;

/// The sum of every element.
pub(super) fn sum(g: &Graph, id: TensorId) -> Result<()> {
    let a = io::src(g, id, 0)?;
    io::write(g, id, &[a.v.iter().sum()])
}

/// One value per row.
pub(super) fn rows(g: &Graph, id: TensorId, f: impl Fn(&[f64]) -> f64) -> Result<()> {
    let a = io::src(g, id, 0)?;
    let out: Vec<f64> = a.v.chunks_exact(a.ne[0].max(1)).map(f).collect();
    io::write(g, id, &out)
}

/// The index of the first largest value of each row.
pub(super) fn argmax(g: &Graph, id: TensorId) -> Result<()> {
    rows(g, id, |row| {
        let mut best = 0;
        for (i, &x) in row.iter().enumerate() {
            if x > row[best] {
                best = i;
            }
        }
        best as f64
    })
}
