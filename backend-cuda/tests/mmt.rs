//! The kernels of quantized products of 2 to 32 columns on the GPU (skipped without one): each
//! choice of [`FewColumns`] (both geometries of the direct tensor-core mat-mat, and the mat-vec
//! and staged mat-mat it replaces) against the product of the dequantized weights on the CPU,
//! plain and with a residual added (the fused MulMatAdd), for rows and k that are not whole
//! tiles or stages and column counts on both sides of each tile of 8.

#[path = "common/mod.rs"]
mod common;

use common::*;
use tessera_core::dtype::DType;
use tessera_core::Graph;
use tessera_cuda::FewColumns;

#[test]
fn few_columns_match_the_cpu() {
    let Some(dev) = cuda() else { return };
    let mut rng = Rng::new(29);
    let cd = concrete(&dev);
    let mut backends: Vec<_> = [
        FewColumns::Direct16,
        FewColumns::Direct32,
        FewColumns::Staged,
    ]
    .into_iter()
    .map(|few| {
        let be = cd
            .with_options(cd.options().few_columns(few))
            .cuda_backend();
        (few, be.unwrap())
    })
    .collect();
    for dt in [
        DType::Q4_0,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
    ] {
        let short = if dt.block_size() == 32 { 13 * 32 } else { 512 };
        for (m, k) in [(37usize, short), (300, 4608)] {
            let w = rng.vec(m * k, -1.0, 1.0);
            let wb = to_bytes(dt, &w);
            let wr = rounded(dt, &w);
            for n in [2usize, 5, 8, 9, 17, 32] {
                let x = rng.vec(k * n, -1.0, 1.0);
                let r = rng.vec(m * n, -1.0, 1.0);
                let product: Vec<f32> = (0..n * m)
                    .map(|i| {
                        let (c, row) = (i / m, i % m);
                        (0..k)
                            .map(|j| f64::from(wr[row * k + j]) * f64::from(x[c * k + j]))
                            .sum::<f64>() as f32
                    })
                    .collect();
                let with_r: Vec<f32> = product.iter().zip(&r).map(|(p, r)| p + r).collect();
                for (few, be) in &mut backends {
                    for add in [false, true] {
                        let mut g = Graph::new();
                        let a = g.input("a", dt, &[k, m]).unwrap();
                        let b = g.input("b", DType::F32, &[k, n]).unwrap();
                        let res = g.input("r", DType::F32, &[m, n]).unwrap();
                        let y = g.mul_mat(a, b).unwrap();
                        let out = if add { g.add(y, res).unwrap() } else { y };
                        let inputs = vec![
                            (a, wb.clone()),
                            (b, to_bytes(DType::F32, &x)),
                            (res, to_bytes(DType::F32, &r)),
                        ];
                        let got = run(&dev, be, &mut g, &inputs, &[out]);
                        let got = from_bytes(DType::F32, &got[0], m * n);
                        let want = if add { &with_r } else { &product };
                        check(
                            &format!("{} m={m} k={k} n={n} {few:?} add={add}", dt.name()),
                            &got,
                            want,
                            1e-3,
                        );
                    }
                }
            }
        }
    }
}
