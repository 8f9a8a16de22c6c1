//! A mul_mat whose weights are larger than one storage binding (128 MiB on lavapipe) runs as
//! several launches over row ranges and gives the host's result; other ops on such a tensor
//! are not supported.

mod common;

use std::sync::Arc;

use half::f16;
use tessera_core::alloc::GraphAllocator;
use tessera_core::{DType, Graph};

#[test]
fn weights_past_one_binding_are_split() {
    let Some(dev) = common::device() else { return };
    let (k, m) = (1024usize, 70_000usize);
    let bt = dev.buffer_type();
    // Small integers times 1/8: exact in f16, and the products sum exactly in f32.
    let w: Vec<f16> = (0..k * m)
        .map(|i| f16::from_f32(((i * 7 + i / k) % 17) as f32 / 8.0 - 1.0))
        .collect();
    let y: Vec<f32> = (0..k).map(|i| ((i * 5) % 11) as f32 / 4.0 - 1.25).collect();
    let wbuf = bt.alloc(k * m * 2).unwrap();
    wbuf.set(0, bytemuck::cast_slice(&w)).unwrap();
    let mut g = Graph::new();
    let a = g.weight("w", DType::F16, &[k, m], wbuf.clone(), 0).unwrap();
    let b = g.input("y", DType::F32, &[k, 1]).unwrap();
    let out = g.mul_mat(a, b).unwrap();
    g.set_output(out);
    // Other ops on a tensor past one binding are refused up front, so the scheduler can place
    // them elsewhere.
    let mut g2 = g.clone();
    let idx = g2.input("idx", DType::I32, &[2]).unwrap();
    let rows = g2.get_rows(a, idx).unwrap();
    assert!(dev.supports_op(&g2, out));
    assert!(!dev.supports_op(&g2, rows));
    let nodes: Vec<_> = g.ids().collect();
    let mut alloc = GraphAllocator::new(Arc::clone(&bt));
    alloc.alloc(&mut g, &nodes).unwrap();
    let yd = g.data(b).unwrap();
    yd.buffer.set(yd.offset, bytemuck::cast_slice(&y)).unwrap();
    let mut backend = dev.new_backend().unwrap();
    backend.compute(&g, &nodes).unwrap();
    backend.synchronize().unwrap();
    let od = g.data(out).unwrap();
    let mut got = vec![0f32; m];
    od.buffer
        .get(od.offset, bytemuck::cast_slice_mut(&mut got))
        .unwrap();
    for (r, &v) in got.iter().enumerate() {
        let want: f32 = (0..k).map(|i| w[r * k + i].to_f32() * y[i]).sum();
        assert!(
            (v - want).abs() <= 1e-3 * want.abs().max(1.0),
            "row {r}: {v} vs {want}"
        );
    }
}
