//! get_rows and set_rows: gathering rows by index, and scattering rows to indexed places.

use tessera_core::{DType, Error, Result};

use crate::parallel::for_ranges;
use crate::view::TView;

/// Checks an index against the number of rows it picks from.
fn checked(op: &str, v: i64, rows: usize) -> Result<usize> {
    usize::try_from(v)
        .ok()
        .filter(|&r| r < rows)
        .ok_or_else(|| Error::Invalid(format!("{op}: row index {v} is outside 0..{rows}")))
}

/// dst[:, i, i2, i3] = src[:, idx[i, i2, i3], i2, i3], dequantized to f32 (I32 rows are
/// copied as they are).
pub(crate) fn get_rows(dst: &TView, src: &TView, idx: &TView) -> Result<()> {
    let n = dst.ne[0];
    let raw = src.dtype == dst.dtype;
    for_ranges(dst.nrows(), n, |rows| {
        let mut buf = vec![0f32; if raw { 0 } else { n }];
        let mut unit = [0u8; 8];
        for r in rows {
            let [i, i2, i3] = dst.row_index(r);
            let s = checked("get_rows", idx.get_int([i, i2, i3, 0]), src.ne[1])?;
            if raw {
                for i0 in 0..n {
                    src.read_unit([i0, s, i2, i3], &mut unit);
                    dst.write_unit([i0, i, i2, i3], &unit);
                }
            } else {
                src.load_row([s, i2, i3], &mut buf)?;
                dst.store_row([i, i2, i3], &buf)?;
            }
        }
        Ok(())
    })
}

/// dst[:, idx[i, i2 % d2, i3 % d3], i2, i3] = src[:, i, i2, i3], converted to dst's type.
/// Runs on one thread: two rows with the same index must not be written at once.
pub(crate) fn set_rows(dst: &TView, src: &TView, idx: &TView) -> Result<()> {
    if !matches!(idx.dtype, DType::I32 | DType::I64) {
        return Err(Error::Invalid(format!(
            "set_rows: indices must be i32 or i64, not {}",
            idx.dtype
        )));
    }
    let mut buf = vec![0f32; src.ne[0]];
    for r in 0..src.nrows() {
        let [i, i2, i3] = src.row_index(r);
        let v = idx.get_int([i, i2 % idx.ne[1], i3 % idx.ne[2], 0]);
        let d = checked("set_rows", v, dst.ne[1])?;
        src.load_row([i, i2, i3], &mut buf)?;
        dst.store_row([d, i2, i3], &buf)?;
    }
    Ok(())
}
