//! f32 kernels the float ops lean on: a dot product and `y += a * x`. Portable loops, plus
//! AVX2 + FMA versions on x86-64 CPUs that have them, chosen at run time.

/// The dot product of the common length of `a` and `b`.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: AVX2 and FMA were detected just above.
        return unsafe { avx2::dot(a, b) };
    }
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// The dot products of `R` rows `xs` with `C` rows `ys` over their common length `k` (the
/// shortest slice): `out[r][c] = dot(xs[r], ys[c])` up to f32 rounding. One pass computes the
/// whole tile, so each value loaded is used `R` or `C` times from a register.
pub(crate) fn dot_tile<const R: usize, const C: usize>(
    xs: &[&[f32]; R],
    ys: &[&[f32]; C],
) -> [[f32; C]; R] {
    let k = xs.iter().chain(ys).map(|v| v.len()).min().unwrap_or(0);
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: AVX2 and FMA were detected just above; every slice holds `k` values.
        return unsafe { avx2::dot_tile(k, xs, ys) };
    }
    std::array::from_fn(|r| std::array::from_fn(|c| dot(&xs[r][..k], &ys[c][..k])))
}

/// `y += a * x` over the common length.
pub(crate) fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: AVX2 and FMA were detected just above.
        return unsafe { avx2::axpy(y, a, x) };
    }
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// The AVX2 + FMA kernels. Safety rule: call them only when [`avx2::available`] is true;
/// they read and write only within the common length of their slices.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// Whether this CPU has AVX2 and FMA (std caches the detection).
    pub(super) fn available() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    /// Dot product with four 8-lane accumulators.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let (mut s0, mut s1, mut s2, mut s3) = (
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
        );
        let mut i = 0;
        while i + 32 <= n {
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), s0);
            s1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 8)),
                _mm256_loadu_ps(pb.add(i + 8)),
                s1,
            );
            s2 = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 16)),
                _mm256_loadu_ps(pb.add(i + 16)),
                s2,
            );
            s3 = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 24)),
                _mm256_loadu_ps(pb.add(i + 24)),
                s3,
            );
            i += 32;
        }
        while i + 8 <= n {
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), s0);
            i += 8;
        }
        let v = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
        let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        let h = _mm_add_ss(h, _mm_movehdup_ps(h));
        let mut s = _mm_cvtss_f32(h);
        while i < n {
            s += *pa.add(i) * *pb.add(i);
            i += 1;
        }
        s
    }

    /// An R x C tile of dot products over the first `k` values of each slice, 8 lanes at a
    /// time with one accumulator per product. Safety: every slice holds at least `k` values.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_tile<const R: usize, const C: usize>(
        k: usize,
        xs: &[&[f32]; R],
        ys: &[&[f32]; C],
    ) -> [[f32; C]; R] {
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let mut i = 0;
        while i + 8 <= k {
            let mut y = [_mm256_setzero_ps(); C];
            for (y, s) in y.iter_mut().zip(ys) {
                *y = _mm256_loadu_ps(s.as_ptr().add(i));
            }
            for (acc, s) in acc.iter_mut().zip(xs) {
                let x = _mm256_loadu_ps(s.as_ptr().add(i));
                for (a, &y) in acc.iter_mut().zip(&y) {
                    *a = _mm256_fmadd_ps(x, y, *a);
                }
            }
            i += 8;
        }
        let mut out = [[0f32; C]; R];
        for ((o, acc), x) in out.iter_mut().zip(&acc).zip(xs) {
            for ((o, &a), y) in o.iter_mut().zip(acc).zip(ys) {
                let h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
                let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
                let h = _mm_add_ss(h, _mm_movehdup_ps(h));
                *o = _mm_cvtss_f32(h);
                for j in i..k {
                    *o += *x.get_unchecked(j) * *y.get_unchecked(j);
                }
            }
        }
        out
    }

    /// `y += a * x`, 8 lanes at a time.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
        let n = y.len().min(x.len());
        let (py, px) = (y.as_mut_ptr(), x.as_ptr());
        let va = _mm256_set1_ps(a);
        let mut i = 0;
        while i + 8 <= n {
            _mm256_storeu_ps(
                py.add(i),
                _mm256_fmadd_ps(_mm256_loadu_ps(px.add(i)), va, _mm256_loadu_ps(py.add(i))),
            );
            i += 8;
        }
        while i < n {
            *py.add(i) += a * *px.add(i);
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_tile_matches_dot() {
        fn check<const R: usize, const C: usize>(n: usize) {
            let rows: Vec<Vec<f32>> = (0..R + C)
                .map(|r| {
                    (0..n)
                        .map(|i| ((i * 7 + r * 13) % 17) as f32 * 0.25 - 2.0)
                        .collect()
                })
                .collect();
            let xs: [&[f32]; R] = std::array::from_fn(|r| rows[r].as_slice());
            let ys: [&[f32]; C] = std::array::from_fn(|c| rows[R + c].as_slice());
            let out = dot_tile(&xs, &ys);
            for r in 0..R {
                for c in 0..C {
                    let want = dot(xs[r], ys[c]);
                    assert!(
                        (out[r][c] - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "n {n}"
                    );
                }
            }
        }
        for n in [0, 5, 8, 37, 100, 1000] {
            check::<2, 4>(n);
            check::<1, 4>(n);
            check::<4, 1>(n);
            check::<1, 1>(n);
        }
    }

    #[test]
    fn dot_and_axpy_match_plain_loops() {
        for n in [0, 5, 8, 37, 100] {
            let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
            let b: Vec<f32> = (0..n).map(|i| 1.0 - i as f32 * 0.25).collect();
            let want: f64 = a
                .iter()
                .zip(&b)
                .map(|(&x, &y)| f64::from(x) * f64::from(y))
                .sum();
            assert!((f64::from(dot(&a, &b)) - want).abs() < 1e-3, "n {n}");
            let mut y = b.clone();
            axpy(&mut y, 2.0, &a);
            for i in 0..n {
                assert_eq!(y[i], b[i] + 2.0 * a[i]);
            }
        }
    }
}
