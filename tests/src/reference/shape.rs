//! concat, repeat, pad and arange.

use tessera_core::{Graph, Result, TensorId};

use super::io;

/// Calls `f` with every index of shape `ne`, in logical order.
fn each_index(ne: [usize; 4], mut f: impl FnMut([usize; 4])) {
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                for i0 in 0..ne[0] {
                    f([i0, i1, i2, i3]);
                }
            }
        }
    }
}

/// a and b joined along `dim`.
pub(super) fn concat(g: &Graph, id: TensorId, dim: usize) -> Result<()> {
    let (a, b) = (io::src(g, id, 0)?, io::src(g, id, 1)?);
    let mut out = Vec::with_capacity(a.v.len() + b.v.len());
    each_index(g.get(id).ne, |mut i| {
        if i[dim] < a.ne[dim] {
            out.push(a.at(i[0], i[1], i[2], i[3]));
        } else {
            i[dim] -= a.ne[dim];
            out.push(b.at(i[0], i[1], i[2], i[3]));
        }
    });
    io::write(g, id, &out)
}

/// a tiled to the result's shape.
pub(super) fn repeat(g: &Graph, id: TensorId) -> Result<()> {
    let a = io::src(g, id, 0)?;
    let mut out = Vec::new();
    each_index(g.get(id).ne, |i| {
        out.push(a.at(
            i[0] % a.ne[0],
            i[1] % a.ne[1],
            i[2] % a.ne[2],
            i[3] % a.ne[3],
        ))
    });
    io::write(g, id, &out)
}

/// a with zeros after the end of each axis.
pub(super) fn pad(g: &Graph, id: TensorId) -> Result<()> {
    let a = io::src(g, id, 0)?;
    let mut out = Vec::new();
    each_index(g.get(id).ne, |i| {
        let inside = (0..4).all(|d| i[d] < a.ne[d]);
        out.push(if inside {
            a.at(i[0], i[1], i[2], i[3])
        } else {
            0.0
        });
    });
    io::write(g, id, &out)
}

/// start + i * step.
pub(super) fn arange(g: &Graph, id: TensorId, start: f64, step: f64) -> Result<()> {
    let n = g.get(id).nelements();
    let out: Vec<f64> = (0..n).map(|i| start + i as f64 * step).collect();
    io::write(g, id, &out)
}
