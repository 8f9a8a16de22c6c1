//! Throughput figures on a real GPU: `gpu [--types q4_0,q4_K] [NAME...]` runs the benchmarks
//! whose names contain one of the NAMEs (every one without), printing one line per figure;
//! results are checked to be finite, not timed against a bound. `--types` limits the types the
//! mat-vec benchmark measures. Without a CUDA device it prints why and measures nothing.
//!
//! Built with `cargo bench -p tessera-cuda --bench gpu --no-run` (the executable's path is
//! printed), run there with `cargo bench -p tessera-cuda --bench gpu -- mat_vec`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use common::*;
use tessera_core::dtype::DType;
use tessera_core::{Backend, Graph, TensorId};
use tessera_cuda::FewColumns;

/// Runs the graph `iters` times after a warm-up and returns seconds per run.
fn time_graph(
    dev: &Dev,
    g: &mut Graph,
    inputs: &[(TensorId, Vec<u8>)],
    outs: &[TensorId],
    iters: usize,
) -> f64 {
    time_graph_with(dev, FewColumns::default(), g, inputs, outs, iters)
}

/// [`time_graph`] on a stream whose products of a few columns run the kernels `few`.
fn time_graph_with(
    dev: &Dev,
    few: FewColumns,
    g: &mut Graph,
    inputs: &[(TensorId, Vec<u8>)],
    outs: &[TensorId],
    iters: usize,
) -> f64 {
    let cd = concrete(dev);
    let mut be = cd
        .with_options(cd.options().few_columns(few))
        .cuda_backend()
        .unwrap();
    let _ = run(dev, &mut be, g, inputs, outs);
    let nodes: Vec<TensorId> = g.ids().collect();
    for _ in 0..3 {
        be.compute(g, &nodes).unwrap();
    }
    be.synchronize().unwrap();
    let t = Instant::now();
    for _ in 0..iters {
        be.compute(g, &nodes).unwrap();
    }
    be.synchronize().unwrap();
    let s = t.elapsed().as_secs_f64() / iters as f64;
    let out = read(g, outs);
    assert!(from_bytes(DType::F32, &out[0], 16)
        .iter()
        .all(|v| v.is_finite()));
    s
}

/// An `m x k` weight of type `dt` from the values `x` (repeated, scaled per row), or, for the
/// lattice i-quants, random blocks fitted to a similar spread: their search on the CPU would
/// take minutes of the GPU machine's time, and the mat-vec's speed does not depend on values.
fn weight_bytes(dt: DType, m: usize, k: usize, x: &[f32]) -> Vec<u8> {
    if tessera_core::quant::is_lattice(dt) {
        let mut rng = Rng::new(13);
        let mut b: Vec<u8> = (0..m * dt.row_size(k).unwrap())
            .map(|_| rng.uniform(0.0, 256.0) as u8)
            .collect();
        for block in b.chunks_exact_mut(dt.type_size()) {
            tessera_core::quant::fit_random_block(dt, block, 0.3).unwrap();
        }
        return b;
    }
    let wdata: Vec<f32> = (0..m * k)
        .map(|i| x[i % x.len()] * ((i / k) % 7) as f32 * 0.1)
        .collect();
    to_bytes(dt, &wdata)
}

/// A benchmark: it measures on the device and prints its figures.
type Bench = fn(&Dev, &Args);

/// The benchmarks, by name.
const BENCHES: [(&str, Bench); 5] = [
    ("mat_vec_bandwidth", mat_vec_bandwidth),
    ("mat_vec_fused", mat_vec_fused),
    ("mat_vec_batch", mat_vec_batch),
    ("gemm_throughput", gemm_throughput),
    ("attention_decode", attention_decode),
];

type Dev = std::sync::Arc<dyn tessera_core::Device>;

/// The command line: name filters and the mat-vec types.
struct Args {
    names: Vec<String>,
    types: Option<Vec<String>>,
}

impl Args {
    /// Parses the arguments; `--bench` (which `cargo bench` passes) and other flags are
    /// ignored.
    fn parse() -> Args {
        let mut args = Args {
            names: Vec::new(),
            types: None,
        };
        let mut it = std::env::args().skip(1);
        while let Some(a) = it.next() {
            if a == "--types" {
                let list = it.next().unwrap_or_default();
                args.types = Some(list.split(',').map(|t| t.trim().to_string()).collect());
            } else if let Some(list) = a.strip_prefix("--types=") {
                args.types = Some(list.split(',').map(|t| t.trim().to_string()).collect());
            } else if !a.starts_with("--") {
                args.names.push(a);
            }
        }
        args
    }

    /// Whether the benchmark `name` runs.
    fn runs(&self, name: &str) -> bool {
        self.names.is_empty() || self.names.iter().any(|n| name.contains(n.as_str()))
    }

    /// Whether type `name` is measured (every one unless `--types` was given).
    fn measures(&self, name: &str) -> bool {
        self.types
            .as_ref()
            .is_none_or(|t| t.iter().any(|t| t == name))
    }
}

fn main() {
    let args = Args::parse();
    let Some(dev) = cuda() else { return };
    for (name, bench) in BENCHES {
        if args.runs(name) {
            bench(&dev, &args);
        }
    }
}

fn mat_vec_bandwidth(dev: &Dev, args: &Args) {
    let (m, k) = (4096usize, 14336usize);
    let mut rng = Rng::new(11);
    let x = rng.vec(k * 64, -1.0, 1.0);
    for dt in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q5_0,
        DType::F16,
        DType::IQ4_XS,
        DType::IQ4_NL,
        DType::IQ3_S,
        DType::IQ2_XS,
        DType::MXFP4,
    ]
    .into_iter()
    .filter(|dt| args.measures(dt.name()))
    {
        let bytes = m * dt.row_size(k).unwrap();
        let wb = weight_bytes(dt, m, k, &x);
        // One weight repeated (largely L2-resident), and 8 weights rotated (> 200 MB: DRAM).
        for rotated in [false, true] {
            for n in [1usize, 2, 4, 8] {
                if rotated && n != 1 {
                    continue;
                }
                let mut g = Graph::new();
                let v = g.input("v", DType::F32, &[k, n]).unwrap();
                let mut inputs = vec![(v, to_bytes(DType::F32, &x[..k * n]))];
                let mut outs = Vec::new();
                let nw = if rotated { 8 } else { 1 };
                let ws: Vec<TensorId> = (0..nw)
                    .map(|i| {
                        let w = g.input(&format!("w{i}"), dt, &[k, m]).unwrap();
                        inputs.push((w, wb.clone()));
                        w
                    })
                    .collect();
                for i in 0..8 {
                    outs.push(g.mul_mat(ws[i % nw], v).unwrap());
                }
                let s = time_graph(dev, &mut g, &inputs, &outs, 50) / 8.0;
                println!(
                    "mul_mat {} m={m} k={k} n={n} {}: {:.1} us, {:.0} GB/s",
                    dt.name(),
                    if rotated {
                        "8 weights rotated"
                    } else {
                        "one weight repeated"
                    },
                    s * 1e6,
                    bytes as f64 / s / 1e9
                );
            }
        }
    }
}

/// Quantized products of a few columns (sequences decoded together), weights from DRAM (8
/// rotated), in the shapes of a Llama-8B block's down projection (m=4096 k=14336) and gate or up
/// projection (m=14336 k=4096): per column count, the time of one product, its time per column
/// and the rate at which it reads the weights, for each kernel choice of [`FewColumns`] where
/// they differ (2 to 32 columns), so that one run compares them.
fn mat_vec_batch(dev: &Dev, args: &Args) {
    let mut rng = Rng::new(12);
    let x = rng.vec(14336 * 64, -1.0, 1.0);
    for dt in [
        DType::Q4_0,
        DType::Q4_K,
        DType::Q6_K,
        DType::Q8_0,
        DType::Q5_K,
    ]
    .into_iter()
    .filter(|dt| args.measures(dt.name()))
    {
        for (m, k) in [(4096usize, 14336usize), (14336, 4096)] {
            let wdata: Vec<f32> = (0..m * k)
                .map(|i| x[i % x.len()] * ((i / k) % 7) as f32 * 0.1)
                .collect();
            let wb = to_bytes(dt, &wdata);
            drop(wdata);
            let bytes = (m * k / dt.block_size() * dt.type_size()) as f64;
            for n in [1usize, 2, 3, 4, 6, 8, 12, 16, 24, 32, 40, 48, 64] {
                let kinds: &[FewColumns] = if (2..=32).contains(&n) {
                    &[
                        FewColumns::Direct16,
                        FewColumns::Direct32,
                        FewColumns::Staged,
                    ]
                } else {
                    &[FewColumns::Direct16]
                };
                for &few in kinds {
                    let mut g = Graph::new();
                    let v = g.input("v", DType::F32, &[k, n]).unwrap();
                    let mut inputs = vec![(v, to_bytes(DType::F32, &x[..k * n]))];
                    let ws: Vec<TensorId> = (0..8)
                        .map(|i| {
                            let w = g.input(&format!("w{i}"), dt, &[k, m]).unwrap();
                            inputs.push((w, wb.clone()));
                            w
                        })
                        .collect();
                    let outs: Vec<TensorId> =
                        ws.iter().map(|&w| g.mul_mat(w, v).unwrap()).collect();
                    let s = time_graph_with(dev, few, &mut g, &inputs, &outs, 30) / 8.0;
                    println!(
                        "mul_mat batch {} m={m} k={k} n={n} {few:?}: {:.1} us, {:.2} us a column, weights {:.0} GB/s",
                        dt.name(),
                        s * 1e6,
                        s * 1e6 / n as f64,
                        bytes / s * 1e-9
                    );
                }
            }
        }
    }
}

/// The fused decode kernels of a Llama-8B block with Q4_0 weights, from DRAM (4 weight sets
/// rotated): gate+up+swiglu (2 x 14336 rows, k 4096) and K+V (2 x 1024 rows, k 4096; each pair
/// by its own vector, so the time includes quantizing that vector).
fn mat_vec_fused(dev: &Dev, _: &Args) {
    let (k, dt, sets) = (4096usize, DType::Q4_0, 4usize);
    let mut rng = Rng::new(14);
    let x = rng.vec(k * sets, -1.0, 1.0);
    for (what, m, glu) in [("gate+up+swiglu", 14336usize, true), ("K+V", 1024, false)] {
        let w: Vec<f32> = (0..m * k)
            .map(|i| x[i % x.len()] * ((i / k) % 7) as f32 * 0.1)
            .collect();
        let wb = to_bytes(dt, &w);
        drop(w);
        let mut g = Graph::new();
        let (mut inputs, mut outs) = (Vec::new(), Vec::new());
        let shared = g.input("x", DType::F32, &[k, 1]).unwrap();
        inputs.push((shared, to_bytes(DType::F32, &x[..k])));
        for i in 0..sets {
            let v = if glu {
                shared
            } else {
                let v = g.input(&format!("x{i}"), DType::F32, &[k, 1]).unwrap();
                inputs.push((v, to_bytes(DType::F32, &x[i * k..(i + 1) * k])));
                v
            };
            let a = g.input(&format!("a{i}"), dt, &[k, m]).unwrap();
            let b = g.input(&format!("b{i}"), dt, &[k, m]).unwrap();
            inputs.push((a, wb.clone()));
            inputs.push((b, wb.clone()));
            let (ya, yb) = (g.mul_mat(a, v).unwrap(), g.mul_mat(b, v).unwrap());
            if glu {
                outs.push(g.swiglu_split(ya, yb).unwrap());
            } else {
                outs.extend([ya, yb]);
            }
        }
        let s = time_graph(dev, &mut g, &inputs, &outs, 50) / sets as f64;
        let bytes = 2 * m * dt.row_size(k).unwrap();
        println!(
            "{what} {} 2 x {m}x{k}, {sets} weight sets rotated: {:.1} us, {:.0} GB/s",
            dt.name(),
            s * 1e6,
            bytes as f64 / s / 1e9
        );
    }
}

fn gemm_throughput(dev: &Dev, _: &Args) {
    let mut rng = Rng::new(12);
    for (dt, bt, n) in [
        (DType::F16, DType::F16, 4096usize),
        (DType::F16, DType::F16, 8192),
        (DType::BF16, DType::BF16, 8192),
        (DType::BF16, DType::F32, 8192),
        (DType::F32, DType::F32, 4096),
    ] {
        let vals = rng.vec(1 << 20, -1.0, 1.0);
        let fill = |len: usize| -> Vec<f32> { (0..len).map(|i| vals[i % vals.len()]).collect() };
        let mut g = Graph::new();
        let a = g.input("a", dt, &[n, n]).unwrap();
        let b = g.input("b", bt, &[n, n]).unwrap();
        let y = g.mul_mat(a, b).unwrap();
        let inputs = vec![
            (a, to_bytes(dt, &fill(n * n))),
            (b, to_bytes(bt, &fill(n * n))),
        ];
        let s = time_graph(dev, &mut g, &inputs, &[y], 10);
        println!(
            "gemm {}x{} {n}^3: {:.3} ms, {:.1} TFLOP/s",
            dt.name(),
            bt.name(),
            s * 1e3,
            2.0 * (n as f64).powi(3) / s / 1e12
        );
    }
    // Prefill-shaped quantized product (dequantize to f16 + cuBLAS).
    for dt in [DType::Q4_0, DType::Q4_1, DType::Q8_0] {
        let (m, k, n) = (4096usize, 14336usize, 512usize);
        let w: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let mut g = Graph::new();
        let a = g.input("a", dt, &[k, m]).unwrap();
        let b = g.input("b", DType::F32, &[k, n]).unwrap();
        let y = g.mul_mat(a, b).unwrap();
        let inputs = vec![
            (a, to_bytes(dt, &w)),
            (b, to_bytes(DType::F32, &rng.vec(k * n, -1.0, 1.0))),
        ];
        let s = time_graph(dev, &mut g, &inputs, &[y], 10);
        println!(
            "mul_mat {} m={m} k={k} n={n}: {:.1} us, {:.1} TFLOP/s",
            dt.name(),
            s * 1e6,
            2.0 * (m * k * n) as f64 / s / 1e12
        );
    }
}

fn attention_decode(dev: &Dev, _: &Args) {
    let mut rng = Rng::new(13);
    for nkv in [4096usize, 8192, 16384] {
        let (d, heads, kvh) = (128usize, 32usize, 4usize);
        let mut g = Graph::new();
        let q = g.input("q", DType::F32, &[d, 1, heads]).unwrap();
        let k = g.input("k", DType::F16, &[d, nkv, kvh]).unwrap();
        let v = g.input("v", DType::F16, &[d, nkv, kvh]).unwrap();
        let y = g.flash_attn_ext(q, k, v, None, 0.088, 0.0, 0.0).unwrap();
        let kv = rng.vec(d * nkv * kvh, -1.0, 1.0);
        let inputs = vec![
            (q, to_bytes(DType::F32, &rng.vec(d * heads, -1.0, 1.0))),
            (k, to_bytes(DType::F16, &kv)),
            (v, to_bytes(DType::F16, &kv)),
        ];
        let s = time_graph(dev, &mut g, &inputs, &[y], 50);
        println!(
            "flash_attn decode d={d} heads={heads}/{kvh} kv={nkv} f16: {:.1} us",
            s * 1e6
        );
    }
    let (d, heads, kvh, n) = (128usize, 32usize, 8usize, 4096usize);
    let mut g = Graph::new();
    let q = g.input("q", DType::F32, &[d, n, heads]).unwrap();
    let k = g.input("k", DType::F16, &[d, n, kvh]).unwrap();
    let v = g.input("v", DType::F16, &[d, n, kvh]).unwrap();
    let y = g.flash_attn_ext(q, k, v, None, 0.088, 0.0, 0.0).unwrap();
    let inputs = vec![
        (q, to_bytes(DType::F32, &rng.vec(d * n * heads, -1.0, 1.0))),
        (k, to_bytes(DType::F16, &rng.vec(d * n * kvh, -1.0, 1.0))),
        (v, to_bytes(DType::F16, &rng.vec(d * n * kvh, -1.0, 1.0))),
    ];
    let s = time_graph(dev, &mut g, &inputs, &[y], 3);
    println!(
        "flash_attn prefill d={d} heads={heads}/{kvh} n={n}: {:.2} ms, {:.1} TFLOP/s",
        s * 1e3,
        4.0 * (n * n * d * heads) as f64 / s / 1e12
    );
}
