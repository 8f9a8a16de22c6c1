//! cpy, cont and dup: element k of the source (in row-major order of its own shape) goes to
//! element k of the destination, whatever the two shapes and strides. Same-type copies move
//! bytes (exact, blocks included); other pairs go through f32, quantizing or dequantizing rows.

use tessera_core::Result;

use crate::parallel::for_ranges;
use crate::view::TView;

/// The largest block of any type, in bytes (Q8_K).
const MAX_UNIT: usize = 292;

/// Copies `src` into `dst` (same element count).
pub(crate) fn run(dst: &TView, src: &TView) -> Result<()> {
    if src.dtype == dst.dtype {
        copy_units(dst, src)
    } else {
        copy_converting(dst, src)
    }
}

/// Walks the flat positions `start..start + len` of `src`, seen as rows of `n0` items, in
/// pieces that stay inside one row: calls `f(src row, first column, count, position in the walk)`.
fn segments(
    src: &TView,
    n0: usize,
    start: usize,
    len: usize,
    mut f: impl FnMut([usize; 3], usize, usize, usize) -> Result<()>,
) -> Result<()> {
    let mut done = 0;
    while done < len {
        let p = start + done;
        let (row, col) = (p / n0, p % n0);
        let take = (n0 - col).min(len - done);
        f(src.row_index(row), col, take, done)?;
        done += take;
    }
    Ok(())
}

/// Byte-exact copy of elements or blocks.
fn copy_units(dst: &TView, src: &TView) -> Result<()> {
    let bs = dst.dtype.block_size();
    let (ud, us) = (dst.ne[0] / bs, src.ne[0] / bs);
    let whole_rows = ud == us && dst.rows_contiguous() && src.rows_contiguous();
    for_ranges(dst.nrows(), dst.ne[0], |rows| {
        let mut unit = [0u8; MAX_UNIT];
        for r in rows {
            let di = dst.row_index(r);
            if whole_rows {
                dst.copy_row_from(di, src, src.row_index(r));
                continue;
            }
            segments(src, us, r * ud, ud, |si, col, take, at| {
                for k in 0..take {
                    src.read_unit([(col + k) * bs, si[0], si[1], si[2]], &mut unit);
                    dst.write_unit([(at + k) * bs, di[0], di[1], di[2]], &unit);
                }
                Ok(())
            })?;
        }
        Ok(())
    })
}

/// Copy through f32: each destination row is gathered from the source's rows, converted, and
/// stored (quantized when the destination is).
fn copy_converting(dst: &TView, src: &TView) -> Result<()> {
    let n = dst.ne[0];
    for_ranges(dst.nrows(), n * 2, |rows| {
        let mut out = vec![0f32; n];
        let mut row = vec![0f32; src.ne[0]];
        let mut loaded = None;
        for r in rows {
            segments(src, src.ne[0], r * n, n, |si, col, take, at| {
                if loaded != Some(si) {
                    src.load_row(si, &mut row)?;
                    loaded = Some(si);
                }
                out[at..at + take].copy_from_slice(&row[col..col + take]);
                Ok(())
            })?;
            dst.store_row(dst.row_index(r), &out)?;
        }
        Ok(())
    })
}
