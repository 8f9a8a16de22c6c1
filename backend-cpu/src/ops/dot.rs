//! f32 kernels the float ops lean on: a dot product and `y += a * x`. The compiler vectorises the plain loops; on x86-64 CPUs with
//! AVX2 and FMA a copy compiled for those features is used, chosen at run time.


/// Independent accumulators: enough for two 8-lane FMA chains in flight.
const LANES: usize = 16;

/// Whether this CPU has AVX2 and FMA (the detection result is cached by std).
#[cfg(target_arch = "x86_64")]
fn avx2_fma() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

/// The dot product of the common length of `a` and `b`.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: AVX2 and FMA were detected just above.
        return unsafe { dot_avx2(a, b) };
    }
    dot_body::<false>(a, b)
}

/// `dot` compiled for AVX2 + FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_body::<true>(a, b)
}

/// The dot product with `LANES` accumulators (fused multiply-adds when `FMA`).
#[inline(always)]
fn dot_body<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] = if FMA { x[l].mul_add(y[l], acc[l]) } else { acc[l] + x[l] * y[l] };
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `y += a * x` over the common length.
pub(crate) fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: AVX2 and FMA were detected just above.
        return unsafe { axpy_avx2(y, a, x) };
    }
    axpy_body::<false>(y, a, x)
}

/// `axpy` compiled for AVX2 + FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_avx2(y: &mut [f32], a: f32, x: &[f32]) {
    axpy_body::<true>(y, a, x)
}

/// `y += a * x` (fused when `FMA`).
#[inline(always)]
fn axpy_body<const FMA: bool>(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = if FMA { x.mul_add(a, *y) } else { *y + a * x };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_and_axpy_match_plain_loops() {
        let a: Vec<f32> = (0..37).map(|i| i as f32 * 0.5 - 3.0).collect();
        let b: Vec<f32> = (0..37).map(|i| 1.0 - i as f32 * 0.25).collect();
        let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - want).abs() < 1e-3);
        let mut y = b.clone();
        axpy(&mut y, 2.0, &a);
        for i in 0..37 {
            assert_eq!(y[i], b[i] + 2.0 * a[i]);
        }
    }
}
