//! mul_mat against a plain f64 loop, for every weight type, with batches, broadcasting and
//! strided activations; and (ignored, run by hand) a benchmark of the decode and prefill shapes.

mod common;

use std::sync::Arc;
use std::time::Instant;

use common::{nmse, rand_vec, round_trip, Case};
use tessera_core::alloc::GraphAllocator;
use tessera_core::{Backend, DType, Graph};
use tessera_cpu::{CpuBackend, CpuBufferType};

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

/// Times `reps` runs of w [k, m] (type `wt`) times n F32 columns; prints the weight bandwidth.
fn bench(wt: DType, k: usize, m: usize, n: usize, threads: usize, reps: usize) {
    let mut g = Graph::new();
    let tw = g.input("w", wt, &[k, m]).unwrap();
    let tx = g.input("x", DType::F32, &[k, n]).unwrap();
    let y = g.mul_mat(tw, tx).unwrap();
    g.set_output(y);
    let ids: Vec<_> = g.ids().collect();
    GraphAllocator::new(Arc::new(CpuBufferType))
        .alloc(&mut g, &ids)
        .unwrap();
    let w = rand_vec(k * m, 1);
    let mut wq = vec![0u8; wt.row_size(k).unwrap() * m];
    for (r, q) in w.chunks(k).zip(wq.chunks_mut(wt.row_size(k).unwrap())) {
        tessera_core::quant::quantize_row(wt, r, q).unwrap();
    }
    let d = g.data(tw).unwrap();
    d.buffer.set(d.offset, &wq).unwrap();
    let x: Vec<u8> = rand_vec(k * n, 2)
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let d = g.data(tx).unwrap();
    d.buffer.set(d.offset, &x).unwrap();
    let mut be = CpuBackend::new(threads, false).unwrap();
    be.compute(&g, &ids).unwrap(); // warm up
    let t0 = Instant::now();
    for _ in 0..reps {
        be.compute(&g, &ids).unwrap();
    }
    let s = t0.elapsed().as_secs_f64() / reps as f64;
    let gflops = 2.0 * (k * m * n) as f64 / s / 1e9;
    println!(
        "{wt} k={k} m={m} n={n} threads={threads}: {:.3} ms, {:.1} GB/s of weights, {:.1} GFLOP/s",
        s * 1e3,
        wq.len() as f64 / s / 1e9,
        gflops
    );
}

#[test]
#[ignore = "a benchmark: cargo test -p tessera-cpu --release --test mul_mat -- --ignored --nocapture"]
fn bench_mul_mat() {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // BENCH="q4_1,576,49152,1,2,50" times one shape: type, k, m, n, threads, repetitions.
    if let Ok(spec) = std::env::var("BENCH") {
        let f: Vec<&str> = spec.split(',').collect();
        let num = |i: usize| f[i].parse::<usize>().unwrap();
        bench(
            DType::from_name(f[0]).unwrap(),
            num(1),
            num(2),
            num(3),
            num(4),
            num(5),
        );
        return;
    }
    bench(DType::Q4_0, 14336, 4096, 1, threads, 10);
    bench(DType::Q4_0, 14336, 4096, 1, 1, 5);
    for (k, m) in [(576, 576), (576, 1536), (1536, 576), (576, 49152)] {
        bench(DType::Q4_1, k, m, 1, threads, 50);
    }
    bench(DType::Q8_0, 576, 49152, 1, threads, 50);
    bench(DType::Q4_1, 576, 1536, 512, threads, 3);
    bench(DType::Q4_0, 4096, 4096, 512, threads, 1);
    bench(DType::F16, 576, 1536, 512, threads, 3);
    bench(DType::F32, 576, 1536, 1, threads, 50);
}
