//! soft_max (with mask, scale and ALiBi) and diag_mask_inf.

use tessera_core::{Graph, Result, TensorId};

use super::io;

/// ALiBi slope of head `h` of `n_head` (1 when max_bias is 0): heads below the largest power
/// of two n' get m0^(h+1) with m0 = 2^(-max_bias/n'), the rest m1^(2(h-n')+1) with
/// m1 = 2^(-max_bias/2/n').
pub(super) fn alibi_slope(max_bias: f64, n_head: usize, h: usize) -> f64 {
    if max_bias <= 0.0 {
        return 1.0;
    }
    let n_log2 = 1usize << (usize::BITS - 1 - n_head.max(1).leading_zeros());
    let m0 = 2f64.powf(-max_bias / n_log2 as f64);
    let m1 = 2f64.powf(-max_bias / 2.0 / n_log2 as f64);
    if h < n_log2 {
        m0.powi(h as i32 + 1)
    } else {
        m1.powi(2 * (h - n_log2) as i32 + 1)
    }
}

/// softmax of a row of logits.
pub(super) fn softmax_row(logits: &[f64], out: &mut Vec<f64>) {
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let start = out.len();
    out.extend(logits.iter().map(|&l| (l - max).exp()));
    let sum: f64 = out[start..].iter().sum();
    out[start..].iter_mut().for_each(|v| *v /= sum);
}

/// softmax(x * scale + slope * mask) over each row; the mask is broadcast over dims 2 and 3.
pub(super) fn soft_max(g: &Graph, id: TensorId, scale: f64, max_bias: f64) -> Result<()> {
    let a = io::src(g, id, 0)?;
    let mask = if g.get(id).src.len() > 1 {
        Some(io::src(g, id, 1)?)
    } else {
        None
    };
    let ne = a.ne;
    let mut out = Vec::with_capacity(a.v.len());
    let mut logits = vec![0.0; ne[0]];
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            let slope = alibi_slope(max_bias, ne[2], i2);
            for i1 in 0..ne[1] {
                for (i0, l) in logits.iter_mut().enumerate() {
                    let m = mask
                        .as_ref()
                        .map_or(0.0, |m| m.at(i0, i1, i2 % m.ne[2], i3 % m.ne[3]));
                    *l = a.at(i0, i1, i2, i3) * scale + slope * m;
                }
                softmax_row(&logits, &mut out);
            }
        }
    }
    io::write(g, id, &out)
}

/// Elements with column > n_past + row set to -inf.
pub(super) fn diag_mask_inf(g: &Graph, id: TensorId, n_past: usize) -> Result<()> {
    let a = io::src(g, id, 0)?;
    let mut out = a.v.clone();
    for (r, row) in out.chunks_exact_mut(a.ne[0].max(1)).enumerate() {
        let i1 = r % a.ne[1];
        for (i0, v) in row.iter_mut().enumerate() {
            if i0 > n_past + i1 {
                *v = f64::NEG_INFINITY;
            }
        }
    }
    io::write(g, id, &out)
}

#[cfg(test)]
mod tests {
    use super::alibi_slope;

    #[test]
    fn alibi_slopes() {
        assert_eq!(alibi_slope(0.0, 8, 3), 1.0);
        // 8 heads, max_bias 8: m0 = 2^-1, slopes 1/2, 1/4, ...
        assert!((alibi_slope(8.0, 8, 0) - 0.5).abs() < 1e-15);
        assert!((alibi_slope(8.0, 8, 2) - 0.125).abs() < 1e-15);
        // 12 heads: n' = 8, head 9 uses m1 = 2^-0.5 to the power 3.
        assert!((alibi_slope(8.0, 12, 9) - 2f64.powf(-1.5)).abs() < 1e-15);
    }
}
