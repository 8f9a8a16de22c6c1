//! mul_mat against a plain f64 loop, for every weight type, with batches, broadcasting and
//! strided activations (the timings of the decode and prefill shapes: `benches/mul_mat.rs`).

mod common;

use common::{nmse, rand_vec, round_trip, Case};
use tessera_core::DType;
use tessera_cpu::CpuBackend;

/// out[m, n, b2, b3] = sum_k w[k, m, b2 / r2, b3 / r3] * x[k, n, b2, b3], in f64.
fn naive(
    w: &[f32],
    x: &[f32],
    k: usize,
    m: usize,
    n: usize,
    wb: [usize; 2],
    xb: [usize; 2],
) -> Vec<f32> {
    let (r2, r3) = (xb[0] / wb[0], xb[1] / wb[1]);
    let mut out = vec![0f32; m * n * xb[0] * xb[1]];
    for b3 in 0..xb[1] {
        for b2 in 0..xb[0] {
            let wo = (b2 / r2 + wb[0] * (b3 / r3)) * m * k;
            let xo = (b2 + xb[0] * b3) * n * k;
            for j in 0..n {
                for i in 0..m {
                    let s: f64 = (0..k)
                        .map(|t| f64::from(w[wo + i * k + t]) * f64::from(x[xo + j * k + t]))
                        .sum();
                    out[((b3 * xb[0] + b2) * n + j) * m + i] = s as f32;
                }
            }
        }
    }
    out
}

/// Runs w (type `wt`) x x (type `xt`) with the given batches; returns (result, f64 reference).
#[allow(clippy::too_many_arguments)]
fn case(
    wt: DType,
    xt: DType,
    k: usize,
    m: usize,
    n: usize,
    wb: [usize; 2],
    xb: [usize; 2],
    precise: bool,
) -> (Vec<f32>, Vec<f32>) {
    let w = rand_vec(k * m * wb[0] * wb[1], 20);
    let x = round_trip(xt, &rand_vec(k * n * xb[0] * xb[1], 21));
    let wq: Vec<f32> = w.chunks(k).flat_map(|r| round_trip(wt, r)).collect();
    let mut c = Case::new();
    let tw = c.input(wt, &[k, m, wb[0], wb[1]], &w);
    let tx = c.input(xt, &[k, n, xb[0], xb[1]], &x);
    let y = c.g.mul_mat(tw, tx).unwrap();
    let out = c
        .run_f32(&mut CpuBackend::new(2, precise).unwrap(), &[y])
        .unwrap()
        .remove(0);
    (out, naive(&wq, &x, k, m, n, wb, xb))
}

#[test]
fn float_weights_match_f64() {
    for (wt, xt) in [
        (DType::F32, DType::F32),
        (DType::F16, DType::F32),
        (DType::BF16, DType::F32),
        (DType::F16, DType::F16),
    ] {
        let (out, want) = case(wt, xt, 70, 37, 45, [2, 1], [4, 3], false);
        let e = nmse(&out, &want);
        assert!(e < 1e-10, "{wt} x {xt}: nmse {e}");
    }
}

#[test]
fn quantized_weights_match_f64_within_ggml_tolerance() {
    for wt in DType::QUANTIZED {
        let k = 512;
        let (out, want) = case(wt, DType::F32, k, 19, 40, [1, 2], [3, 2], false);
        let e = nmse(&out, &want);
        assert!(e < 5e-4, "{wt}: nmse {e}");
        // Precise mode keeps the activations in f32: only rounding differs.
        let (out, want) = case(wt, DType::F32, k, 19, 3, [1, 1], [1, 1], true);
        let e = nmse(&out, &want);
        assert!(e < 1e-10, "{wt} precise: nmse {e}");
    }
}

#[test]
fn activations_may_be_a_transposed_view() {
    let (k, m, n) = (40, 9, 6);
    let w = rand_vec(k * m, 30);
    let xt = rand_vec(n * k, 31); // stored [n, k]: transposed, it is [k, n] with nb0 = 4n
    let mut c = Case::new();
    let tw = c.input(DType::F32, &[k, m], &w);
    let tx = c.input(DType::F32, &[n, k], &xt);
    let t = c.g.transpose(tx).unwrap();
    let y = c.g.mul_mat(tw, t).unwrap();
    let out = c.run(&[y]).unwrap().remove(0);
    let x: Vec<f32> = (0..n)
        .flat_map(|j| (0..k).map(move |t| (j, t)))
        .map(|(j, t)| xt[t * n + j])
        .collect();
    let e = nmse(&out, &naive(&w, &x, k, m, n, [1, 1], [1, 1]));
    assert!(e < 1e-10, "nmse {e}");
}
