//! argsort and top_k: the indices that order each row. Both are stable (equal values keep their
//! index order), so every backend gives the same indices.

use std::cmp::Ordering;

use tessera_core::Result;

use crate::parallel::for_ranges;
use crate::view::TView;

/// `i` before `j` when row[i] is larger (descending) or smaller (ascending); NaNs last; ties by
/// index.
fn order(row: &[f32], descending: bool, i: usize, j: usize) -> Ordering {
    let (a, b) = (row[i], row[j]);
    let by_value = match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ if descending => b.partial_cmp(&a).unwrap_or(Ordering::Equal),
        _ => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    };
    by_value.then(i.cmp(&j))
}

/// The first `dst.ne[0]` indices of each row of `src` in the order asked (I32): all of them
/// for argsort, the k largest for top_k.
pub(crate) fn sorted_indices(dst: &TView, src: &TView, descending: bool) -> Result<()> {
    let (n, k) = (src.ne[0], dst.ne[0]);
    for_ranges(src.nrows(), n * 8, |rows| {
        let mut row = vec![0f32; n];
        let mut idx: Vec<usize> = Vec::with_capacity(n);
        for r in rows {
            let i = src.row_index(r);
            src.load_row(i, &mut row)?;
            idx.clear();
            idx.extend(0..n);
            let cmp = |&p: &usize, &q: &usize| order(&row, descending, p, q);
            if k < n {
                idx.select_nth_unstable_by(k, cmp);
                idx.truncate(k);
            }
            idx.sort_unstable_by(cmp);
            for (j, &v) in idx.iter().enumerate() {
                dst.set_int([j, i[0], i[1], i[2]], v as i64);
            }
        }
        Ok(())
    })
}
