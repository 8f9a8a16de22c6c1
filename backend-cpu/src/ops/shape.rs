//! Ops that move elements without arithmetic: concat, repeat, pad; and arange, which makes a
//! sequence. Elements are copied as raw bytes, so any non-quantized type works.

use tessera_core::Result;

use crate::parallel::for_ranges;
use crate::view::TView;

/// Calls `f(index)` for every element of `dst`, splitting rows over threads.
fn for_each_element(dst: &TView, f: impl Fn([usize; 4]) + Sync) -> Result<()> {
    for_ranges(dst.nrows(), dst.ne[0], |rows| {
        for r in rows {
            let [i1, i2, i3] = dst.row_index(r);
            for i0 in 0..dst.ne[0] {
                f([i0, i1, i2, i3]);
            }
        }
        Ok(())
    })
}

/// Copies element `from` of `src` to element `to` of `dst` as bytes.
fn move_unit(dst: &TView, to: [usize; 4], src: &TView, from: [usize; 4]) {
    let mut unit = [0u8; 8];
    src.read_unit(from, &mut unit);
    dst.write_unit(to, &unit);
}

/// `a` then `b` along `dim`.
pub(crate) fn concat(dst: &TView, a: &TView, b: &TView, dim: usize) -> Result<()> {
    let split = a.ne[dim];
    for_each_element(dst, |i| {
        if i[dim] < split {
            move_unit(dst, i, a, i);
        } else {
            let mut j = i;
            j[dim] -= split;
            move_unit(dst, i, b, j);
        }
    })
}

/// `src` tiled: dst(i) = src(i mod src.ne).
pub(crate) fn repeat(dst: &TView, src: &TView) -> Result<()> {
    for_each_element(dst, |i| {
        let j = [
            i[0] % src.ne[0],
            i[1] % src.ne[1],
            i[2] % src.ne[2],
            i[3] % src.ne[3],
        ];
        move_unit(dst, i, src, j);
    })
}

/// `src` with zeros after its end along every axis.
pub(crate) fn pad(dst: &TView, src: &TView) -> Result<()> {
    for_each_element(dst, |i| {
        let inside = (0..4).all(|d| i[d] < src.ne[d]);
        dst.set(i, if inside { src.get(i) } else { 0.0 });
    })
}

/// Every element of `dst` set to `v`.
pub(crate) fn fill(dst: &TView, v: f32) -> Result<()> {
    for_each_element(dst, |i| dst.set(i, v))
}

/// dst[i] = start + i * step.
pub(crate) fn arange(dst: &TView, start: f32, step: f32) -> Result<()> {
    for_each_element(dst, |i| dst.set(i, start + i[0] as f32 * step))
}
