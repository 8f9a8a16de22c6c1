//! Matrix products on a device for the mat-vec and mat-mat tests: building one, and timing it
//! on the GPU.

use std::sync::Arc;
use std::time::Duration;

use tessera_core::alloc::GraphAllocator;
use tessera_core::backend::Device;
use tessera_core::{DType, Graph, TensorId};

/// A graph dst = a^T b for weights `bytes` ([k, m] of `dtype`) and b [k, n] f32, allocated on
/// `dev` with b set to `b`: the graph, its nodes and its output.
pub fn product(
    dev: &Arc<dyn Device>,
    dtype: DType,
    bytes: &[u8],
    b: &[f32],
    (m, n, k): (usize, usize, usize),
) -> (Graph, Vec<TensorId>, TensorId) {
    let bt = dev.buffer_type();
    let wbuf = bt.alloc(bytes.len()).unwrap();
    wbuf.set(0, bytes).unwrap();
    let mut g = Graph::new();
    let wa = g.weight("a", dtype, &[k, m], wbuf, 0).unwrap();
    let ib = g.input("b", DType::F32, &[k, n]).unwrap();
    let out = g.mul_mat(wa, ib).unwrap();
    g.set_output(out);
    let nodes: Vec<_> = g.ids().collect();
    let mut alloc = GraphAllocator::new(Arc::clone(&bt));
    alloc.alloc(&mut g, &nodes).unwrap();
    let bd = g.data(ib).unwrap();
    bd.buffer.set(bd.offset, bytemuck::cast_slice(b)).unwrap();
    (g, nodes, out)
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
