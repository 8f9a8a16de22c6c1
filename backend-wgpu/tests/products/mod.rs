//! Matrix products on a device for the mat-vec and mat-mat tests and benches: their weights,
//! building one, and timing it on the GPU. (Each test or bench uses some of them.)
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use tessera_core::alloc::GraphAllocator;
use tessera_core::backend::Device;
use tessera_core::quant::{dequantize_row, quantize_row};
use tessera_core::{DType, Graph, TensorId};

/// The weight types the integer-dot mat-vec reads.
pub const MAT_VEC_TYPES: [DType; 5] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q8_0,
    DType::Q4_K,
    DType::Q6_K,
];

/// A graph dst = a^T b for weights `bytes` ([k, m] of `dtype`) and b [k, n] f32, allocated on
/// `dev` with b set to `b`: the graph, its nodes and its output.
pub fn product(
    dev: &Arc<dyn Device>,
    dtype: DType,
    bytes: &[u8],
    b: &[f32],
    shape: (usize, usize, usize),
) -> (Graph, Vec<TensorId>, TensorId) {
    let (g, nodes, outs) = products(dev, dtype, bytes, &[b], shape);
    (g, nodes, outs[0])
}

/// A graph of one product per column in `cols` (each [k, n] f32), each of its own copy of the
/// weights `bytes` (separate buffers, so that successive products read different memory), in
/// that order: the graph, its nodes and the outputs.
pub fn products(
    dev: &Arc<dyn Device>,
    dtype: DType,
    bytes: &[u8],
    cols: &[&[f32]],
    (m, n, k): (usize, usize, usize),
) -> (Graph, Vec<TensorId>, Vec<TensorId>) {
    let bt = dev.buffer_type();
    let mut g = Graph::new();
    let mut ins = Vec::new();
    let mut outs = Vec::new();
    for i in 0..cols.len() {
        let wbuf = bt.alloc(bytes.len()).unwrap();
        wbuf.set(0, bytes).unwrap();
        let wa = g.weight(&format!("a{i}"), dtype, &[k, m], wbuf, 0).unwrap();
        let ib = g.input(&format!("b{i}"), DType::F32, &[k, n]).unwrap();
        let out = g.mul_mat(wa, ib).unwrap();
        g.set_output(out);
        ins.push(ib);
        outs.push(out);
    }
    let nodes: Vec<_> = g.ids().collect();
    let mut alloc = GraphAllocator::new(Arc::clone(&bt));
    alloc.alloc(&mut g, &nodes).unwrap();
    for (ib, b) in ins.into_iter().zip(cols) {
        let bd = g.data(ib).unwrap();
        bd.buffer.set(bd.offset, bytemuck::cast_slice(b)).unwrap();
    }
    (g, nodes, outs)
}

/// The median GPU time (timestamp queries; GPU timing must be on) of `runs` computations of
/// `g` on a new backend of `dev`, or `None` where the adapter has no timestamp queries.
pub fn gpu_median(
    dev: &Arc<dyn Device>,
    g: &Graph,
    nodes: &[TensorId],
    runs: usize,
) -> Option<Duration> {
    let mut backend = dev.new_backend().unwrap();
    let _ = tessera_wgpu::take_gpu_times();
    for _ in 0..runs {
        backend.compute(g, nodes).unwrap();
    }
    backend.synchronize().unwrap();
    drop(backend);
    let mut times = tessera_wgpu::take_gpu_times();
    times.sort_unstable();
    times.get(times.len() / 2).copied()
}

/// `m` rows of `k` values of `dtype` made by quantizing `distinct` pseudo-random rows and
/// repeating them: the bytes, and the dequantized values of the distinct rows.
pub fn weights(dtype: DType, m: usize, k: usize, distinct: usize) -> (Vec<u8>, Vec<f32>) {
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

/// Columns b [k, n] of values in [-1, 1) that repeat with a long period.
pub fn columns(k: usize, n: usize) -> Vec<f32> {
    (0..k * n)
        .map(|i| (((i * 40503) >> 3) % 777) as f32 / 388.0 - 1.0)
        .collect()
}

/// a^T b computed on `dev` by `backend` ([`product`]'s graph), read back: [m, n] f32.
pub fn computed(
    dev: &Arc<dyn Device>,
    backend: &mut dyn tessera_core::Backend,
    dtype: DType,
    bytes: &[u8],
    b: &[f32],
    (m, n, k): (usize, usize, usize),
) -> Vec<f32> {
    let (g, nodes, out) = product(dev, dtype, bytes, b, (m, n, k));
    backend.compute(&g, &nodes).unwrap();
    backend.synchronize().unwrap();
    let od = g.data(out).unwrap();
    let mut got = vec![0f32; m * n];
    od.buffer
        .get(od.offset, bytemuck::cast_slice_mut(&mut got))
        .unwrap();
    got
}

/// `vals` ([k, rows] f32) quantized to `dtype` row by row, and those rows dequantized again:
/// the weights' bytes and the values they stand for.
pub fn quantized(dtype: DType, vals: &[f32], rows: usize, k: usize) -> (Vec<u8>, Vec<f32>) {
    let row = dtype.row_size(k).unwrap();
    let mut bytes = vec![0u8; row * rows];
    let mut a = vec![0f32; k * rows];
    for r in 0..rows {
        let q = &mut bytes[r * row..(r + 1) * row];
        quantize_row(dtype, &vals[r * k..(r + 1) * k], q).unwrap();
        dequantize_row(dtype, q, &mut a[r * k..(r + 1) * k]).unwrap();
    }
    (bytes, a)
}
