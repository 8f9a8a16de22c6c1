//! The integer-dot mat-vec (quantized weights times one to four columns, the column quantized
//! to 8 bits per 32 values on the GPU) against a host product of the dequantized weights and
//! the exact column, on ragged row counts and on a row longer than one quantized chunk (its GPU
//! time on the model-sized products is the `mat_vec` bench).

mod common;
mod products;

use tessera_core::DType;

use products::{weights, MAT_VEC_TYPES};

/// Runs the product on the device and checks it against the host product with the column
/// quantized as the shader quantizes it (which also shows that the integer-dot path ran).
fn check(dtype: DType, m: usize, n: usize, k: usize) {
    let Some(dev) = common::device() else { return };
    let distinct = 7;
    let (bytes, a) = weights(dtype, m, k, distinct);
    let b = products::columns(k, n);
    let mut backend = dev.new_backend().unwrap();
    let got = products::computed(&dev, &mut *backend, dtype, &bytes, &b, (m, n, k));
    // The column as the shader quantizes it: per 32 values, steps of max|y| / 127, rounded to
    // nearest even.
    let mut bq = b.clone();
    for blk in bq.chunks_mut(32) {
        let a = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let inv = if a > 0.0 { 127.0 / a } else { 0.0 };
        for v in blk.iter_mut() {
            *v = (*v * inv).round_ties_even() * (a / 127.0);
        }
    }
    let (mut err, mut norm, mut err_exact) = (0f64, 0f64, 0f64);
    for j in 0..n {
        for i in 0..m {
            let w = &a[(i % distinct) * k..(i % distinct + 1) * k];
            let dot = |y: &[f32]| -> f64 {
                (0..k)
                    .map(|x| f64::from(w[x]) * f64::from(y[j * k + x]))
                    .sum()
            };
            let (want, exact) = (dot(&bq), dot(&b));
            err += (f64::from(got[j * m + i]) - want).powi(2);
            err_exact += (f64::from(got[j * m + i]) - exact).powi(2);
            norm += want * want;
        }
    }
    // Against the quantized column only f32 rounding differs (and, where the device divides
    // less exactly, a rare value rounded to the neighbouring step): a wrong block or scale
    // would give an NMSE near 1. Against the exact column the 8-bit steps add an NMSE of some
    // 1e-5 for independent random values (~2e-4 for these correlated ones, which leave small
    // products); the conformance suite allows 5e-4 on random inputs.
    assert!(
        err / norm < 1e-6,
        "{dtype} {m}x{n}x{k}: nmse {} against the quantized column",
        err / norm
    );
    assert!(
        err_exact / norm < 1e-3,
        "{dtype} {m}x{n}x{k}: nmse {} against the exact column",
        err_exact / norm
    );
}

#[test]
fn ragged_rows_one_column() {
    for t in MAT_VEC_TYPES {
        check(t, 37, 1, 512);
    }
}

#[test]
fn several_columns() {
    for t in MAT_VEC_TYPES {
        check(t, 19, 3, 1024);
    }
}

/// Tens of thousands of rows, as an output head over a vocabulary has (a thousand workgroups
/// and more).
#[test]
fn tall_weights() {
    for t in [DType::Q4_0, DType::Q6_K] {
        check(t, 128 * 256 + 1000, 1, 512);
    }
}

/// More workgroups than one dispatch dimension holds (65,535): 32-row workgroups over four
/// columns of half a million rows, or over one column of two million (whose row count is
/// compiled in), lay out over two dimensions, and the workgroups past the last must store
/// nothing.
#[test]
fn workgroups_over_two_dimensions() {
    check(DType::Q4_0, 32 * 65535 / 4 + 1000, 4, 256);
    check(DType::Q4_0, 32 * 65535 + 1000, 1, 64);
}

/// Long rows and few of them, so that each invocation takes several parts of its row in turn
/// (the loop's register sets taking turns, and the chunk ending after either).
#[test]
fn long_rows_several_parts_each() {
    for t in MAT_VEC_TYPES {
        check(t, 64, 1, 14336);
    }
}

/// Rows longer than one quantized chunk of the column (16384 values where workgroup memory
/// holds it, else 4096).
#[test]
fn rows_past_one_chunk() {
    for t in [DType::Q4_0, DType::Q6_K] {
        check(t, 5, 1, 16384 + 512);
    }
}
