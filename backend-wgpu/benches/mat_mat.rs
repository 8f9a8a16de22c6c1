//! The GPU time of square mat-mats (harness-less: `main` runs it; arguments are ignored).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/products/mod.rs"]
mod products;

use tessera_core::DType;

/// GPU time (timestamp queries, median of 10 runs) of dst = a^T b with a and b n x n, a f16 or
/// f32, b f32, for n = 4096 and 8192: `cargo bench -p tessera-wgpu --bench mat_mat`.
fn main() {
    let Some(dev) = common::device() else { return };
    tessera_wgpu::set_gpu_timing(true);
    for n in [4096usize, 8192] {
        for dtype in [DType::F16, DType::F32] {
            let vals: Vec<f32> = (0..n * n)
                .map(|i| (i % 1000) as f32 / 500.0 - 1.0)
                .collect();
            let (bytes, _) = products::quantized(dtype, &vals, n, n);
            let (g, nodes, _) = products::product(&dev, dtype, &bytes, &vals, (n, n, n));
            let Some(med) = products::gpu_median(&dev, &g, &nodes, 10) else {
                println!("gemm {dtype} {n}^3: no GPU times (no timestamp queries)");
                return;
            };
            let s = med.as_secs_f64();
            println!(
                "gemm {dtype}xf32 {n}^3: {:.3} ms, {:.1} TFLOP/s",
                s * 1e3,
                2.0 * (n as f64).powi(3) / s / 1e12
            );
        }
    }
}
