//! Tiled mat-mat on shapes past one tile, with ragged edges, for float and quantized weights,
//! against a host product of the same (dequantized) values: the f32 variant, and the f16 one
//! (H16, the default on GPUs with SHADER_F16) where the adapter has SHADER_F16 (the GPU time of
//! square products is the `mat_mat` bench).

mod common;
mod products;

use tessera_core::DType;
use tessera_wgpu::WgpuOptions;

/// NMSE bound of the f32 variant: the same products as the host's, summed in another order.
const F32_NMSE: f64 = 1e-9;
/// NMSE bound of the f16 variant. The activations are rounded to f16 (11 significant bits, a
/// relative error of up to 2^-12 each), and the products are summed in f16 over 16 k-steps
/// before each f32 addition, every f16 addition rounding at 2^-12 of its partial sum: with
/// these values that is an NMSE of 1e-6 to 2e-6. 1e-5 leaves a fivefold margin and is still
/// 50 times under the conformance suite's mul_mat bound (5e-4).
const F16_NMSE: f64 = 1e-5;

/// Runs dst = a^T b for a [k, m] of `dtype` and b [k, n] f32, with the f16 mat-mat variant
/// where `f16` (and the adapter has SHADER_F16) and the f32 one otherwise, and checks it
/// within the variant's NMSE bound.
fn check(dtype: DType, m: usize, n: usize, k: usize, f16: bool) {
    let options = WgpuOptions::default().mat_mat_f16(Some(f16));
    let Some(dev) = common::device_with(options) else {
        return;
    };
    let mut backend = dev.new_backend().unwrap();
    let tol = if f16 { F16_NMSE } else { F32_NMSE };
    let vals: Vec<f32> = (0..k * m)
        .map(|i| (((i * 2654435761) >> 7) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let (bytes, a) = products::quantized(dtype, &vals, m, k);
    let b = products::columns(k, n);
    let got = products::computed(&dev, &mut *backend, dtype, &bytes, &b, (m, n, k));
    let (mut err, mut norm) = (0f64, 0f64);
    for j in 0..n {
        for i in 0..m {
            let want: f64 = (0..k)
                .map(|x| f64::from(a[i * k + x]) * f64::from(b[j * k + x]))
                .sum();
            err += (f64::from(got[j * m + i]) - want).powi(2);
            norm += want * want;
        }
    }
    assert!(err / norm < tol, "{dtype} {m}x{n}x{k}: nmse {}", err / norm);
}

#[test]
fn large_tiles_f32() {
    check(DType::F32, 200, 150, 96, false);
}

#[test]
fn large_tiles_f16() {
    check(DType::F16, 131, 257, 64, false);
}

#[test]
fn large_tiles_q4_0() {
    check(DType::Q4_0, 129, 130, 128, false);
}

#[test]
fn large_tiles_q6_k() {
    check(DType::Q6_K, 140, 128, 256, false);
}

#[test]
fn f16_variant_f16() {
    check(DType::F16, 131, 257, 64, true);
}

#[test]
fn f16_variant_q4_0() {
    check(DType::Q4_0, 129, 130, 128, true);
}

#[test]
fn f16_variant_q6_k() {
    check(DType::Q6_K, 140, 128, 256, true);
}

// The weight types the cooperative-matrix mat-mat fetches as words (Q4_1, Q8_0, Q4_K; Q4_0 and
// Q6_K above), one it dequantizes as it fetches (Q5_K), and f16 weights whose k is not a
// multiple of its 32-deep step (the step's tail is zeros).

#[test]
fn f16_variant_q4_1() {
    check(DType::Q4_1, 136, 130, 96, true);
}

#[test]
fn f16_variant_q8_0() {
    check(DType::Q8_0, 129, 140, 160, true);
}

#[test]
fn f16_variant_q4_k() {
    check(DType::Q4_K, 130, 129, 512, true);
}

#[test]
fn f16_variant_q5_k() {
    check(DType::Q5_K, 128, 131, 256, true);
}

#[test]
fn f16_variant_f16_k_tail() {
    check(DType::F16, 200, 140, 72, true);
}

/// Enough 128 x 128 tiles for the larger cooperative tile (and a k tail).
#[test]
fn f16_variant_f16_large() {
    check(DType::F16, 4100, 2050, 40, true);
}
