//! soft_max (with scale, mask and ALiBi) and diag_mask_inf, the causal mask it pairs with.

use tessera_core::Result;

use super::map_rows;
use crate::parallel::for_ranges;
use crate::view::TView;

/// The ALiBi slope of head `head` of `n_head` for `max_bias` (1 when ALiBi is off), as ggml
/// computes it: heads below the largest power of two `n` under `n_head` get m0^(h+1) with
/// m0 = 2^(-max_bias/n); the rest get m1^(2(h-n)+1) with m1 = 2^(-max_bias/(2n)).
pub(crate) fn alibi_slope(max_bias: f32, head: usize, n_head: usize) -> f32 {
    if max_bias <= 0.0 {
        return 1.0;
    }
    let n = 1usize << (n_head.max(1).ilog2());
    let m0 = 2f32.powf(-max_bias / n as f32);
    let m1 = 2f32.powf(-(max_bias / 2.0) / n as f32);
    if head < n {
        m0.powi(head as i32 + 1)
    } else {
        m1.powi(2 * (head - n) as i32 + 1)
    }
}

/// softmax(x * scale + slope * mask) over each row. The mask row is the row's index along
/// dim 1, its dims 2-3 broadcast; the slope uses the head index i2 of ne2 heads. A row that
/// is entirely -inf gives zeros.
pub(crate) fn soft_max(
    dst: &TView,
    src: &TView,
    mask: Option<&TView>,
    scale: f32,
    max_bias: f32,
) -> Result<()> {
    let n_head = src.ne[2];
    let n = src.ne[0];
    for_ranges(dst.nrows(), n * 8, |rows| {
        let mut w = vec![0f32; n];
        let mut m = vec![0f32; if mask.is_some() { n } else { 0 }];
        for r in rows {
            let i = dst.row_index(r);
            src.load_row(i, &mut w)?;
            for x in w.iter_mut() {
                *x *= scale;
            }
            if let Some(mk) = mask {
                mk.load_row([i[0], i[1] % mk.ne[2], i[2] % mk.ne[3]], &mut m)?;
                let slope = alibi_slope(max_bias, i[1], n_head);
                for (x, &v) in w.iter_mut().zip(&m) {
                    *x += slope * v;
                }
            }
            softmax_in_place(&mut w);
            dst.store_row(i, &w)?;
        }
        Ok(())
    })
}

/// Replaces `w` by its softmax (the sum taken in f64); all -inf gives zeros.
fn softmax_in_place(w: &mut [f32]) {
    let max = w.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        w.fill(0.0);
        return;
    }
    let mut sum = 0f64;
    for x in w.iter_mut() {
        *x = (*x - max).exp();
        sum += f64::from(*x);
    }
    let inv = (1.0 / sum) as f32;
    for x in w.iter_mut() {
        *x *= inv;
    }
}

/// Copies rows, setting element i0 of row i1 to -inf where i0 > n_past + i1.
pub(crate) fn diag_mask_inf(dst: &TView, src: &TView, n_past: usize) -> Result<()> {
    map_rows(dst, src, 1, |i, a, out| {
        for (i0, (o, &x)) in out.iter_mut().zip(a).enumerate() {
            *o = if i0 > n_past + i[0] {
                f32::NEG_INFINITY
            } else {
                x
            };
        }
    })
}
