//! A graph computed again is replayed from its recording: new input values give new results,
//! the same shapes in other memory are not mistaken for it, and a graph changed in place (an
//! op's parameter) is not replayed as it was. Graphs whose split attention
//! decode leaves partial results in the device's scratch buffer give the same results when a
//! larger graph grows the scratch between their runs.

mod common;

use std::sync::Arc;

use tessera_core::alloc::GraphAllocator;
use tessera_core::backend::Backend;
use tessera_core::{DType, Graph, Op, TensorId};
use tessera_wgpu::WgpuDevice;

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

/// [`build`]'s graph in memory of `dev`: the graph, x, y, out, its nodes, and the allocator
/// that holds its memory.
fn allocated(
    dev: &Arc<dyn tessera_core::Device>,
    n: usize,
) -> (
    Graph,
    TensorId,
    TensorId,
    TensorId,
    Vec<TensorId>,
    GraphAllocator,
) {
    let (mut g, x, y, out) = build(n);
    let nodes: Vec<_> = g.ids().collect();
    let mut alloc = GraphAllocator::new(dev.buffer_type());
    alloc.alloc(&mut g, &nodes).unwrap();
    (g, x, y, out, nodes, alloc)
}

/// Computes `nodes` of `g` on `backend`, waits, and reads `n` values of `out`.
fn run(
    backend: &mut dyn Backend,
    g: &Graph,
    nodes: &[TensorId],
    out: TensorId,
    n: usize,
) -> Vec<f32> {
    backend.compute(g, nodes).unwrap();
    backend.synchronize().unwrap();
    take(g, out, n)
}

#[test]
fn replayed_graphs_see_new_inputs_and_new_memory() {
    let Some(dev) = common::device() else { return };
    let n = 1000;
    let mut backend = dev.new_backend().unwrap();
    let (g, x, y, out, nodes, alloc) = allocated(&dev, n);
    for round in 0..3 {
        let xv: Vec<f32> = (0..n).map(|i| (i + round) as f32 * 0.5).collect();
        let yv: Vec<f32> = (0..n).map(|i| (i % 7) as f32 - round as f32).collect();
        put(&g, x, &xv);
        put(&g, y, &yv);
        let got = run(backend.as_mut(), &g, &nodes, out, n);
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
    let (g2, x2, y2, out2, nodes2, _alloc2) = allocated(&dev, n);
    put(&g2, x2, &vec![3.0; n]);
    put(&g2, y2, &vec![-1.0; n]);
    let got = run(backend.as_mut(), &g2, &nodes2, out2, n);
    assert!(got.iter().all(|&v| v == 3.0));
}

#[test]
fn a_graph_changed_in_place_is_not_replayed_as_it_was() {
    let Some(dev) = common::device() else { return };
    let n = 256;
    let mut backend = dev.new_backend().unwrap();
    let (mut g, x, y, out, nodes, _alloc) = allocated(&dev, n);
    let xv: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 3.0).collect();
    let yv: Vec<f32> = (0..n).map(|i| (i % 5) as f32 - 2.0).collect();
    put(&g, x, &xv);
    put(&g, y, &yv);
    let scale = nodes
        .iter()
        .copied()
        .find(|&id| matches!(g.get(id).op, Op::Scale { .. }))
        .unwrap();
    for factor in [2.0f32, 2.0, 5.0, 5.0, -1.0] {
        if let Op::Scale { scale: s, .. } = &mut g.get_mut(scale).op {
            *s = factor;
        }
        let got = run(backend.as_mut(), &g, &nodes, out, n);
        for i in 0..n {
            assert_eq!(
                got[i],
                xv[i] * factor + xv[i] * yv[i],
                "factor {factor}, element {i}"
            );
        }
    }
}

/// An attention graph in device memory: the graph, its nodes, its output, and the allocator
/// that holds its memory.
struct Attention {
    g: Graph,
    nodes: Vec<TensorId>,
    out: TensorId,
    _alloc: GraphAllocator,
}

/// Attention of one token over `kv` keys on `dev`: q [hd, 1, heads], f16 k and v
/// [hd, kv, heads / 4] (four query heads a KV head), an f16 mask [kv, 1] hiding every third
/// key; the inputs filled with values that depend on `seed`.
fn attention(
    dev: &Arc<dyn tessera_core::Device>,
    hd: usize,
    heads: usize,
    kv: usize,
    seed: usize,
) -> Attention {
    let mut g = Graph::new();
    let q = g.input("q", DType::F32, &[hd, 1, heads]).unwrap();
    let k = g.input("k", DType::F16, &[hd, kv, heads / 4]).unwrap();
    let v = g.input("v", DType::F16, &[hd, kv, heads / 4]).unwrap();
    let m = g.input("mask", DType::F16, &[kv, 1]).unwrap();
    let out = g
        .flash_attn_ext(q, k, v, Some(m), 1.0 / (hd as f32).sqrt(), 0.0, 0.0)
        .unwrap();
    g.set_output(out);
    let nodes: Vec<_> = g.ids().collect();
    let mut alloc = GraphAllocator::new(dev.buffer_type());
    alloc.alloc(&mut g, &nodes).unwrap();
    let wave = |i: usize| (((i * 7 + seed * 13) % 29) as f32 - 14.0) / 15.0;
    put(&g, q, &(0..hd * heads).map(wave).collect::<Vec<_>>());
    for t in [k, v] {
        let n = hd * kv * heads / 4;
        let h: Vec<u16> = (0..n)
            .map(|i| half::f16::from_f32(wave(i + t.index())).to_bits())
            .collect();
        let d = g.data(t).unwrap();
        d.buffer.set(d.offset, bytemuck::cast_slice(&h)).unwrap();
    }
    let mask: Vec<u16> = (0..kv)
        .map(|i| {
            let x = if i % 3 == 2 {
                f32::NEG_INFINITY
            } else {
                wave(i)
            };
            half::f16::from_f32(x).to_bits()
        })
        .collect();
    let d = g.data(m).unwrap();
    d.buffer.set(d.offset, bytemuck::cast_slice(&mask)).unwrap();
    Attention {
        g,
        nodes,
        out,
        _alloc: alloc,
    }
}

#[test]
fn split_attention_survives_a_larger_scratch() {
    let Some(dev) = common::device() else { return };
    let mut backend = dev
        .as_any()
        .downcast_ref::<WgpuDevice>()
        .expect("a wgpu device")
        .backend()
        .unwrap();
    // The scratch of the small one fits the smallest scratch buffer, the large one's does not.
    let small = attention(&dev, 64, 8, 512, 1);
    let large = attention(&dev, 128, 16, 4096, 2);
    let mut run = |a: &Attention| {
        backend.compute(&a.g, &a.nodes).unwrap();
        backend.synchronize().unwrap();
        let n = a.g.get(a.out).nelements();
        (take(&a.g, a.out, n), backend.last_dispatch_count())
    };
    let (first, n) = run(&small);
    // 8 rows and heads over 512 keys: 16 splits, then their merge.
    assert_eq!(n, 2);
    let (large_first, _) = run(&large);
    let (again, _) = run(&small);
    let (large_again, _) = run(&large);
    assert!(first.iter().all(|v| v.is_finite()) && first.iter().any(|&v| v != 0.0));
    assert_eq!(first, again);
    assert_eq!(large_first, large_again);
}
