//! Reductions: sum of everything, sum and mean of each row, argmax of each row. Sums are taken
//! in f64.

use tessera_core::Result;

use crate::parallel::for_ranges;
use crate::view::TView;

/// The one-element sum of every element of `src`.
pub(crate) fn sum(dst: &TView, src: &TView) -> Result<()> {
    let mut row = vec![0f32; src.ne[0]];
    let mut total = 0f64;
    for r in 0..src.nrows() {
        src.load_row(src.row_index(r), &mut row)?;
        total += row.iter().map(|&x| f64::from(x)).sum::<f64>();
    }
    dst.set([0; 4], total as f32);
    Ok(())
}

/// Calls `f` with each row of `src` (its number, its index and its values), the rows divided
/// among the threads.
fn each_row(src: &TView, f: impl Fn(usize, [usize; 3], &[f32]) + Sync) -> Result<()> {
    let n = src.ne[0];
    for_ranges(src.nrows(), n, |rows| {
        let mut row = vec![0f32; n];
        for r in rows {
            let i = src.row_index(r);
            src.load_row(i, &mut row)?;
            f(r, i, &row);
        }
        Ok(())
    })
}

/// The sum (or, with `mean`, the mean) of each row, into [1, ne1, ne2, ne3].
pub(crate) fn sum_rows(dst: &TView, src: &TView, mean: bool) -> Result<()> {
    let n = src.ne[0];
    each_row(src, |_, i, row| {
        let s: f64 = row.iter().map(|&x| f64::from(x)).sum();
        let v = if mean { s / n as f64 } else { s };
        dst.set([0, i[0], i[1], i[2]], v as f32);
    })
}

/// The index of the first largest value of each row (I32); NaNs are passed over, and a row
/// with no number larger than -inf gives 0.
pub(crate) fn argmax(dst: &TView, src: &TView) -> Result<()> {
    each_row(src, |r, _, row| {
        let (mut best, mut max) = (0usize, f32::NEG_INFINITY);
        for (k, &x) in row.iter().enumerate() {
            if x > max {
                max = x;
                best = k;
            }
        }
        dst.set_int([r, 0, 0, 0], best as i64);
    })
}
