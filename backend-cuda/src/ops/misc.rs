//! Shape ops and reductions: concat, repeat, pad, arange, sum, sum_rows, mean, argmax
//! (kernels/shape.cu, reduce.cu).

use tessera_core::{Result, TensorId};

use super::norm::row_block;
use super::{params, Encoder};

/// a and b joined along `dim`.
pub(super) fn concat(enc: &mut Encoder, id: TensorId, dim: usize) -> Result<()> {
    let t = enc.graph.get(id);
    let d = enc.arg(id)?;
    let mut p = params(d, &[enc.arg(t.src[0])?, enc.arg(t.src[1])?]);
    p.i[0] = dim as i32;
    enc.launch_elems(
        "shape",
        &format!("concat_raw{}", t.dtype.type_size()),
        d.ne,
        p,
    )
}

/// src0 tiled.
pub(super) fn repeat(enc: &mut Encoder, id: TensorId) -> Result<()> {
    let t = enc.graph.get(id);
    let d = enc.arg(id)?;
    let p = params(d, &[enc.arg(t.src[0])?]);
    enc.launch_elems(
        "shape",
        &format!("repeat_raw{}", t.dtype.type_size()),
        d.ne,
        p,
    )
}

/// src0 padded with zeros.
pub(super) fn pad(enc: &mut Encoder, id: TensorId) -> Result<()> {
    let t = enc.graph.get(id);
    let d = enc.arg(id)?;
    let p = params(d, &[enc.arg(t.src[0])?]);
    enc.launch_elems("shape", "pad_f32", d.ne, p)
}

/// start, start + step, ...
pub(super) fn arange(enc: &mut Encoder, id: TensorId, start: f32, step: f32) -> Result<()> {
    let d = enc.arg(id)?;
    let mut p = params(d, &[]);
    p.f[0] = start;
    p.f[1] = step;
    enc.launch_flat("shape", "arange_f32", d.ne[0], p)
}

/// The sum of all elements.
pub(super) fn sum(enc: &mut Encoder, id: TensorId) -> Result<()> {
    let t = enc.graph.get(id);
    let s = t.src[0];
    let name = format!("sum_{}", enc.graph.get(s).dtype.name());
    let p = params(enc.arg(id)?, &[enc.arg(s)?]);
    enc.launch("reduce", &name, [1, 1, 1], [1024, 1, 1], 0, p)
}

/// The sum (or mean) of each row.
pub(super) fn sum_rows(enc: &mut Encoder, id: TensorId, mean: bool) -> Result<()> {
    let t = enc.graph.get(id);
    let s = enc.arg(t.src[0])?;
    let mut p = params(enc.arg(id)?, &[s]);
    p.i[0] = i32::from(mean);
    let rows = (t.nrows() as u64).min(u32::MAX as u64) as u32;
    enc.launch(
        "reduce",
        "sum_rows_f32",
        [rows, 1, 1],
        [row_block(s.ne[0]), 1, 1],
        0,
        p,
    )
}

/// The index of each row's largest value.
pub(super) fn argmax(enc: &mut Encoder, id: TensorId) -> Result<()> {
    let t = enc.graph.get(id);
    let s = enc.arg(t.src[0])?;
    let p = params(enc.arg(id)?, &[s]);
    let rows = s.ne[1].clamp(1, u32::MAX as i64) as u32;
    enc.launch(
        "reduce",
        "argmax_f32",
        [rows, 1, 1],
        [row_block(s.ne[0]), 1, 1],
        0,
        p,
    )
}
