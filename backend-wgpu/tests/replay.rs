//! A graph computed again is replayed from its recording: new input values give new results,
//! and the same shapes in other memory are not mistaken for it.

mod common;

use std::sync::Arc;

use tessera_core::alloc::GraphAllocator;
use tessera_core::{DType, Graph, TensorId};

/// out = x * 2 + x * y over [n].
fn build(n: usize) -> (Graph, TensorId, TensorId, TensorId) {
    let mut g = Graph::new();
    let x = g.input("x", DType::F32, &[n]).unwrap();
    let y = g.input("y", DType::F32, &[n]).unwrap();
    let s = g.scale(x, 2.0).unwrap();
    let m = g.mul(x, y).unwrap();
    let out = g.add(s, m).unwrap();
    g.set_output(out);
    (g, x, y, out)
}

/// Writes f32 values into a tensor's memory.
fn put(g: &Graph, id: TensorId, v: &[f32]) {
    let d = g.data(id).unwrap();
    d.buffer.set(d.offset, bytemuck::cast_slice(v)).unwrap();
}

/// Reads f32 values from a tensor's memory.
fn take(g: &Graph, id: TensorId, n: usize) -> Vec<f32> {
    let d = g.data(id).unwrap();
    let mut v = vec![0f32; n];
    d.buffer
        .get(d.offset, bytemuck::cast_slice_mut(&mut v))
        .unwrap();
    v
}

#[test]
fn replayed_graphs_see_new_inputs_and_new_memory() {
    let Some(dev) = common::device() else { return };
    let n = 1000;
    let mut backend = dev.new_backend().unwrap();
    let (mut g, x, y, out) = build(n);
    let nodes: Vec<_> = g.ids().collect();
    let mut alloc = GraphAllocator::new(dev.buffer_type());
    alloc.alloc(&mut g, &nodes).unwrap();
    for round in 0..3 {
        let xv: Vec<f32> = (0..n).map(|i| (i + round) as f32 * 0.5).collect();
        let yv: Vec<f32> = (0..n).map(|i| (i % 7) as f32 - round as f32).collect();
        put(&g, x, &xv);
        put(&g, y, &yv);
        backend.compute(&g, &nodes).unwrap();
        backend.synchronize().unwrap();
        let got = take(&g, out, n);
        for i in 0..n {
            assert_eq!(
                got[i],
                xv[i] * 2.0 + xv[i] * yv[i],
                "round {round}, element {i}"
            );
        }
    }
    // The same graph in another buffer (a fresh allocator), with the first one freed.
    drop(alloc);
    let (mut g2, x2, y2, out2) = build(n);
    let mut alloc2 = GraphAllocator::new(Arc::clone(&dev.buffer_type()));
    alloc2.alloc(&mut g2, &nodes).unwrap();
    put(&g2, x2, &vec![3.0; n]);
    put(&g2, y2, &vec![-1.0; n]);
    backend.compute(&g2, &nodes).unwrap();
    backend.synchronize().unwrap();
    assert!(take(&g2, out2, n).iter().all(|&v| v == 3.0));
}
