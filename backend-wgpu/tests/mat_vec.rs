//! The integer-dot mat-vec (quantized weights times one to four columns, the column quantized
//! to 8 bits per 32 values on the GPU) against a host product of the dequantized weights and
//! the exact column, on ragged row counts and on a row longer than one quantized chunk; and
//! (ignored, for a real GPU) its GPU time on the model-sized products.

mod common;
mod products;

use tessera_core::quant::{dequantize_row, quantize_row};
use tessera_core::DType;

use products::{gpu_median, product, products};

/// The weight types the integer-dot mat-vec reads.
const TYPES: [DType; 5] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q8_0,
    DType::Q4_K,
    DType::Q6_K,
];

/// `m` rows of `k` values of `dtype` made by quantizing `distinct` pseudo-random rows and
/// repeating them: the bytes, and the dequantized values of the distinct rows.
fn weights(dtype: DType, m: usize, k: usize, distinct: usize) -> (Vec<u8>, Vec<f32>) {
    let row = dtype.row_size(k).unwrap();
    let distinct = distinct.min(m);
    let mut bytes = vec![0u8; row * m];
    let mut a = vec![0f32; k * distinct];
    for r in 0..distinct {
        let vals: Vec<f32> = (0..k)
            .map(|i| ((((r * k + i) * 2654435761) >> 7) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        quantize_row(dtype, &vals, &mut bytes[r * row..(r + 1) * row]).unwrap();
        dequantize_row(
            dtype,
            &bytes[r * row..(r + 1) * row],
            &mut a[r * k..(r + 1) * k],
        )
        .unwrap();
    }
    for r in distinct..m {
        bytes.copy_within((r % distinct) * row..(r % distinct + 1) * row, r * row);
    }
    (bytes, a)
}

/// Runs the product on the device and checks it against the host product with the column
/// quantized as the shader quantizes it (which also shows that the integer-dot path ran).
fn check(dtype: DType, m: usize, n: usize, k: usize) {
    let Some(dev) = common::device() else { return };
    let distinct = 7;
    let (bytes, a) = weights(dtype, m, k, distinct);
    let b: Vec<f32> = (0..k * n)
        .map(|i| (((i * 40503) >> 3) % 777) as f32 / 388.0 - 1.0)
        .collect();
    let (g, nodes, out) = product(&dev, dtype, &bytes, &b, (m, n, k));
    let mut backend = dev.new_backend().unwrap();
    backend.compute(&g, &nodes).unwrap();
    backend.synchronize().unwrap();
    let od = g.data(out).unwrap();
    let mut got = vec![0f32; m * n];
    od.buffer
        .get(od.offset, bytemuck::cast_slice_mut(&mut got))
        .unwrap();
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
    for t in TYPES {
        check(t, 37, 1, 512);
    }
}

#[test]
fn several_columns() {
    for t in TYPES {
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
    for t in TYPES {
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

/// Weight copies rotated through in [`bench_model_sizes`]' second figure: 8 of the largest
/// shape (264 MB of Q4_0) are well past the H200's 50 MB L2.
const ROTATED: usize = 8;

/// The GPU time (timestamp queries, median of 50 runs) of the model-sized mat-vecs, for each
/// type in TESSERA_BENCH_TYPES (comma-separated, default every integer-dot type and f16), two
/// ways: one product alone in its compute pass (the pass's fixed cost included; the weights
/// partly in L2 from the run before), and [`ROTATED`] products of as many weight copies and
/// columns in one pass, the pass's time over ROTATED (weights from DRAM; measured as the CUDA
/// backend's `bench mat_vec` measures its rotated figure):
/// `cargo test --release -p tessera-wgpu --test mat_vec -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench_model_sizes() {
    let Some(dev) = common::device() else { return };
    let types: Vec<DType> = match std::env::var("TESSERA_BENCH_TYPES") {
        Ok(v) => v
            .split(',')
            .filter_map(|s| {
                DType::ALL
                    .iter()
                    .copied()
                    .find(|t| t.to_string() == s.trim())
            })
            .collect(),
        Err(_) => TYPES.iter().copied().chain([DType::F16]).collect(),
    };
    tessera_wgpu::set_gpu_timing(true);
    for (m, k) in [
        (4096, 14336),
        (14336, 4096),
        (4096, 4096),
        (1024, 4096),
        (128256, 4096),
    ] {
        for &t in &types {
            let bytes = if t.is_quantized() {
                weights(t, m, k, 64).0
            } else {
                let h: Vec<half::f16> = (0..m * k)
                    .map(|i| half::f16::from_f32((i % 1000) as f32 / 500.0 - 1.0))
                    .collect();
                bytemuck::cast_slice(&h).to_vec()
            };
            let b: Vec<f32> = (0..k).map(|i| (i % 777) as f32 / 388.0 - 1.0).collect();
            let (g, nodes, _) = product(&dev, t, &bytes, &b, (m, 1, k));
            let Some(med) = gpu_median(&dev, &g, &nodes, 50) else {
                println!("{t} m={m} k={k}: no GPU times (no timestamp queries)");
                return;
            };
            let us = med.as_secs_f64() * 1e6;
            let gb = (bytes.len() + 4 * (k + m)) as f64 / us / 1e3;
            println!("{t} m={m} k={k}: {us:.2} us, {gb:.0} GB/s");
            let cols: Vec<Vec<f32>> = (0..ROTATED)
                .map(|c| b.iter().map(|v| v * (1.0 + c as f32 / 8.0)).collect())
                .collect();
            let cols: Vec<&[f32]> = cols.iter().map(Vec::as_slice).collect();
            let (g, nodes, _) = products(&dev, t, &bytes, &cols, (m, 1, k));
            let Some(med) = gpu_median(&dev, &g, &nodes, 50) else {
                return;
            };
            let us = med.as_secs_f64() * 1e6 / ROTATED as f64;
            let gb = (bytes.len() + 4 * (k + m)) as f64 / us / 1e3;
            println!("{t} m={m} k={k} {ROTATED} weights rotated: {us:.2} us, {gb:.0} GB/s");
        }
    }
}
