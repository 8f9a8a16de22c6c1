//! The GPU time of the integer-dot mat-vec (and the f16 mat-vec) on the model-sized products
//! (harness-less: `main` runs it; arguments are ignored).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/products/mod.rs"]
mod products;

use tessera_core::DType;

use products::{gpu_median, product, products, weights, MAT_VEC_TYPES};

/// Weight copies rotated through in the second figure: 8 of the largest
/// shape (264 MB of Q4_0) are well past the H200's 50 MB L2.
const ROTATED: usize = 8;

/// The GPU time (timestamp queries, median of 50 runs) of the model-sized mat-vecs, for each
/// type in TESSERA_BENCH_MAT_VEC_TYPES (comma-separated, default every integer-dot type and f16), two
/// ways: one product alone in its compute pass (the pass's fixed cost included; the weights
/// partly in L2 from the run before), and [`ROTATED`] products of as many weight copies and
/// columns in one pass, the pass's time over ROTATED (weights from DRAM; measured as the CUDA
/// backend's `bench mat_vec` measures its rotated figure):
/// `cargo bench -p tessera-wgpu --bench mat_vec`.
fn main() {
    let Some(dev) = common::device() else { return };
    let types: Vec<DType> = match std::env::var("TESSERA_BENCH_MAT_VEC_TYPES") {
        Ok(v) => v
            .split(',')
            .filter_map(|s| {
                DType::ALL
                    .iter()
                    .copied()
                    .find(|t| t.to_string() == s.trim())
            })
            .collect(),
        Err(_) => MAT_VEC_TYPES.iter().copied().chain([DType::F16]).collect(),
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
