//! The SIMD kernels against tessera-core's reference code: the same dot products (up to f32
//! rounding) and the same quantized bytes.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

fn uniform(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

/// Roughly normal with standard deviation 1 (a scaled sum of 4 uniforms).
fn gaussian(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| (0..4).map(|_| rng.gen_range(-1.0f32..1.0)).sum::<f32>() * 0.866)
        .collect()
}

/// `x` quantized by the reference quantizer.
fn quantize(t: DType, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; t.row_size(x.len()).unwrap()];
    reference::quantize_row(t, x, &mut q).unwrap();
    q
}

#[test]
fn simd_kernels_match_the_reference() {
    let Some(k) = kernels() else {
        return;
    };
    let pairs: [(DType, DotFn); 9] = [
        (DType::Q4_0, k.dot_q4_0),
        (DType::Q4_1, k.dot_q4_1),
        (DType::Q5_0, k.dot_q5_0),
        (DType::Q8_0, k.dot_q8_0),
        (DType::Q4_K, k.dot_q4_k),
        (DType::Q6_K, k.dot_q6_k),
        (DType::IQ4_NL, k.dot_iq4_nl),
        (DType::IQ4_XS, k.dot_iq4_xs),
        (DType::MXFP4, k.dot_mxfp4),
    ];
    for seed in 0..8u64 {
        for (t, fast) in pairs {
            let n = t.block_size() * (1 + seed as usize * 3);
            let mut x = gaussian(n, 10 + seed);
            x[..t.block_size()].fill(0.0); // an all-zero block
            let y = uniform(n, 20 + seed);
            let yt = vec_dot_type(t);
            let (qx, qy) = (quantize(t, &x), quantize(yt, &y));
            let (a, b) = (fast(&qx, &qy), reference::vec_dot(t, n, &qx, &qy));
            assert!(
                (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                "{t} n={n}: simd {a} vs reference {b}"
            );
            assert_eq!(
                vec_dot(t, n, &qx, &qy),
                a,
                "{t}: vec_dot takes the SIMD kernel"
            );
        }
        let x = gaussian(32 * 9, 30 + seed);
        for (t, fast) in [
            (DType::Q8_0, k.quantize_q8_0),
            (DType::Q8_1, k.quantize_q8_1),
        ] {
            let mut a = vec![0u8; t.row_size(x.len()).unwrap()];
            fast(&x, &mut a);
            assert_eq!(a, quantize(t, &x), "{t} quantizer");
            let mut b = vec![0u8; a.len()];
            quantize_row(t, &x, &mut b).unwrap();
            assert_eq!(a, b, "{t}: quantize_row takes the SIMD quantizer");
        }
    }
}

#[test]
fn quantize_row_refuses_bad_lengths() {
    let x = uniform(40, 1);
    let mut q = vec![0u8; 34];
    assert!(quantize_row(DType::Q8_0, &x, &mut q).is_err());
    let x = uniform(32, 1);
    let mut q = vec![0u8; 35];
    assert!(quantize_row(DType::Q8_0, &x, &mut q).is_err());
}

/// Every tile kernel (AVX2, and AVX-512 VNNI where present) and every tile shape the CPU
/// backend uses give the reference dot products, including all-zero blocks and short slices.
#[test]
fn tile_kernels_match_the_reference() {
    fn check<const R: usize, const C: usize>(t: DType, nblocks: usize, seed: u64) {
        let n = t.block_size() * nblocks;
        let xs: Vec<Vec<u8>> = (0..R as u64)
            .map(|r| {
                let mut x = gaussian(n, 100 * seed + r);
                x[..t.block_size()].fill(0.0);
                quantize(t, &x)
            })
            .collect();
        let ys: Vec<Vec<u8>> = (0..C as u64)
            .map(|c| quantize(vec_dot_type(t), &uniform(n, 100 * seed + 50 + c)))
            .collect();
        let xr: [&[u8]; R] = std::array::from_fn(|r| xs[r].as_slice());
        let yr: [&[u8]; C] = std::array::from_fn(|c| ys[c].as_slice());
        // (the row length the slices hold, so a short slice stops the product early)
        let want_of = |x: &[u8], y: &[u8]| {
            reference::vec_dot(t, x.len() / t.type_size() * t.block_size(), x, y)
        };
        let close = |a: f32, b: f32| (a - b).abs() <= 1e-4 * (1.0 + b.abs());
        let mut results = vec![vec_dot_tile::<R, C>(t, n, &xr, &yr)];
        #[cfg(target_arch = "x86_64")]
        {
            let nb = nblocks;
            results.extend(avx2::dot_tile::<R, C>(t, nb, &xr, &yr, false));
            results.extend(avx2::dot_tile::<R, C>(t, nb, &xr, &yr, true));
            // A slice one block short: every product stops a block early.
            let short = &ys[0][..ys[0].len() - vec_dot_type(t).type_size()];
            let got = vec_dot_tile::<R, 1>(t, n, &xr, &[short]);
            for (r, g) in got.iter().enumerate() {
                let want = want_of(&xs[r][..xs[r].len() - t.type_size()], short);
                assert!(close(g[0], want), "{t} short row {r}: {} vs {want}", g[0]);
            }
        }
        for out in &results {
            for (r, row) in out.iter().enumerate() {
                for (c, &got) in row.iter().enumerate() {
                    let want = want_of(&xs[r], &ys[c]);
                    assert!(
                        close(got, want),
                        "{t} {R}x{C} n={n} ({r}, {c}): {got} vs {want}"
                    );
                }
            }
        }
    }
    for seed in 0..4u64 {
        let nb = 1 + 5 * seed as usize;
        for t in [DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q5_1] {
            check::<4, 4>(t, nb, seed);
            check::<4, 1>(t, nb, seed);
            check::<1, 4>(t, nb, seed);
            check::<1, 1>(t, nb, seed);
            check::<2, 3>(t, nb, seed);
        }
    }
}
