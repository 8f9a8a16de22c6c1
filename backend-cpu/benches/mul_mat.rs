//! The CPU mat-vec and mat-mat timed on the shapes BENCHMARKS.md reports (harness-less:
//! `cargo bench -p tessera-cpu --bench mul_mat`; an argument `type,k,m,n,threads,repetitions`
//! times one shape).

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::Instant;

use common::rand_vec;
use tessera_core::alloc::GraphAllocator;
use tessera_core::{Backend, DType, Graph};
use tessera_cpu::{CpuBackend, CpuBufferType};

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

fn main() {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // An argument `q4_1,576,49152,1,2,50` times one shape: type, k, m, n, threads, repetitions.
    if let Some(spec) = std::env::args().skip(1).find(|a| a.contains(',')) {
        let f: Vec<&str> = spec.split(',').collect();
        let num = |i: usize| {
            f[i].parse::<usize>()
                .expect("type,k,m,n,threads,repetitions")
        };
        bench(
            DType::from_name(f[0]).expect("a type name such as q4_0"),
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
