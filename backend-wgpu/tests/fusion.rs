//! Fused dispatches: a decode step of a small Llama-like block (attention output and
//! feed-forward halves, quantized weights) run with and without fusion gives the same values,
//! and fusion cuts its dispatches from 14 to 7; the rope of Q and K with the stores of K and V
//! into F16 caches writes the same bytes in one dispatch as in four.

mod common;

use tessera_core::alloc::GraphAllocator;
use tessera_core::backend::Backend;
use tessera_core::quant::quantize_row;
use tessera_core::{DType, Graph, RopeMode, RopeParams, TensorId};
use tessera_wgpu::WgpuDevice;

/// Model width and feed-forward width (multiples of 256 for the K types).
const D: usize = 256;
const FF: usize = 512;

/// The block: x = scale(x_in) (a residual that is not a graph input, so that the adds may run
/// in place over it as in a model), then h = rms_norm(x) * wn, the outputs K = W_k h and
/// V = W_v h, x1 = x + W_o h, out = x1 + W_down swiglu(W_gate h2, W_up h2) with
/// h2 = rms_norm(x1) * wn2. Returns the graph, its inputs and the outputs (out, K, V).
fn block() -> (Graph, Vec<(TensorId, DType, usize)>, [TensorId; 3]) {
    let mut g = Graph::new();
    let x_in = g.input("x", DType::F32, &[D, 1]).unwrap();
    let wn = g.input("wn", DType::F32, &[D]).unwrap();
    let wn2 = g.input("wn2", DType::F32, &[D]).unwrap();
    let wo = g.input("wo", DType::Q8_0, &[D, D]).unwrap();
    let wg = g.input("wg", DType::Q4_K, &[D, FF]).unwrap();
    let wu = g.input("wu", DType::Q4_K, &[D, FF]).unwrap();
    let wd = g.input("wd", DType::Q6_K, &[FF, D]).unwrap();
    let wk = g.input("wk", DType::Q4_0, &[D, 64]).unwrap();
    let wv = g.input("wv", DType::Q4_0, &[D, 64]).unwrap();
    let x = g.scale(x_in, 1.0).unwrap();
    let h = g.rms_norm(x, 1e-5).unwrap();
    let h = g.mul(h, wn).unwrap();
    let k = g.mul_mat(wk, h).unwrap();
    let v = g.mul_mat(wv, h).unwrap();
    let o = g.mul_mat(wo, h).unwrap();
    let x1 = g.add(x, o).unwrap();
    let h2 = g.rms_norm(x1, 1e-5).unwrap();
    let h2 = g.mul(h2, wn2).unwrap();
    let gate = g.mul_mat(wg, h2).unwrap();
    let up = g.mul_mat(wu, h2).unwrap();
    let act = g.swiglu_split(gate, up).unwrap();
    let down = g.mul_mat(wd, act).unwrap();
    let out = g.add(x1, down).unwrap();
    for t in [out, k, v] {
        g.set_output(t);
    }
    let inputs = vec![
        (x_in, DType::F32, D),
        (wn, DType::F32, D),
        (wn2, DType::F32, D),
        (wo, DType::Q8_0, D * D),
        (wg, DType::Q4_K, D * FF),
        (wu, DType::Q4_K, D * FF),
        (wd, DType::Q6_K, FF * D),
        (wk, DType::Q4_0, D * 64),
        (wv, DType::Q4_0, D * 64),
    ];
    (g, inputs, [out, k, v])
}

/// Deterministic values in [lo, hi).
fn values(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            lo + (hi - lo) * ((s >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

/// The block's graph allocated on `dev` with its inputs written, its nodes and outputs.
fn loaded_block(
    dev: &std::sync::Arc<dyn tessera_core::Device>,
) -> (Graph, Vec<TensorId>, [TensorId; 3]) {
    let (mut g, inputs, outs) = block();
    let nodes: Vec<_> = g.ids().collect();
    let mut alloc = GraphAllocator::new(dev.buffer_type());
    alloc.alloc(&mut g, &nodes).unwrap();
    for (k, &(id, dtype, n)) in inputs.iter().enumerate() {
        let (lo, hi) = match k {
            0 => (-1.0, 1.0),
            1 | 2 => (0.5, 1.5),
            _ => (-0.1, 0.1),
        };
        let v = values(n, k as u64 + 1, lo, hi);
        let mut bytes = vec![0u8; dtype.row_size(n).unwrap()];
        quantize_row(dtype, &v, &mut bytes).unwrap();
        let d = g.data(id).unwrap();
        d.buffer.set(d.offset, &bytes).unwrap();
    }
    (g, nodes, outs)
}

/// Runs the block on `backend` and reads its outputs (out, K, V) back.
fn run_block(
    backend: &mut tessera_wgpu::WgpuBackend,
    g: &Graph,
    nodes: &[TensorId],
    outs: [TensorId; 3],
) -> Vec<f32> {
    backend.compute(g, nodes).unwrap();
    backend.synchronize().unwrap();
    let mut v = Vec::new();
    for (o, n) in outs.into_iter().zip([D, 64, 64]) {
        let d = g.data(o).unwrap();
        let mut x = vec![0f32; n];
        d.buffer
            .get(d.offset, bytemuck::cast_slice_mut(&mut x))
            .unwrap();
        v.extend(x);
    }
    v
}

/// `dev` as the wgpu device it is.
fn wgpu_device(dev: &std::sync::Arc<dyn tessera_core::Device>) -> &WgpuDevice {
    dev.as_any()
        .downcast_ref::<WgpuDevice>()
        .expect("a wgpu device")
}

#[test]
fn fused_block_matches_unfused_with_fewer_dispatches() {
    let Some(dev) = common::device() else { return };
    let wdev = wgpu_device(&dev);
    let mut backend = wdev.backend().unwrap();
    let (g, nodes, outs) = loaded_block(&dev);
    let mut run = |fusion: bool| {
        backend.set_fusion(fusion);
        let v = run_block(&mut backend, &g, &nodes, outs);
        (v, backend.last_dispatch_count())
    };
    let (plain, plain_n) = run(false);
    let (fused, fused_n) = run(true);
    // Replayed from its recording: the same dispatches and values.
    let (again, again_n) = run(true);
    println!("dispatches per block: {plain_n} unfused, {fused_n} fused");
    // scale, then norm, mul, K, V, O, add, norm, mul, gate, up, swiglu, down, add; fused:
    // scale, norm*w, K and V, O+add, norm*w, gate/up/swiglu, down+add.
    assert_eq!(plain_n, 14);
    assert_eq!(fused_n, 7);
    assert_eq!(again_n, 7);
    assert_eq!(fused, again);
    let scale = plain.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (i, (a, b)) in plain.iter().zip(&fused).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * scale.max(1.0),
            "element {i}: unfused {a}, fused {b}"
        );
    }
}

/// The per-dispatch profile: a profiled run gives the same values, and its table counts each
/// of the fused block's 7 dispatches once per run under its variant's name, with GPU time.
#[test]
fn profiled_block_names_and_times_its_dispatches() {
    let Some(dev) = common::device() else { return };
    let wdev = wgpu_device(&dev);
    let mut backend = wdev.backend().unwrap();
    backend.set_fusion(true);
    let (g, nodes, outs) = loaded_block(&dev);
    let plain = run_block(&mut backend, &g, &nodes, outs);
    assert!(backend.profile_table().is_empty());
    backend.set_profile(true);
    let profiled = run_block(&mut backend, &g, &nodes, outs);
    let again = run_block(&mut backend, &g, &nodes, outs);
    assert_eq!(plain, profiled);
    assert_eq!(plain, again);
    let table = backend.profile_table();
    for (name, t, n) in &table {
        println!("{name:<32} {:>10.1} us {n}", t.as_secs_f64() * 1e6);
    }
    if table.is_empty() {
        println!(
            "skipped: {} has no timestamp queries",
            wdev.adapter_info().name
        );
        return;
    }
    assert_eq!(table.iter().map(|r| r.2).sum::<usize>(), 2 * 7);
    assert!(
        table.iter().any(|r| r.0 == "mat_vec_q_q4_K+w2+glu"),
        "{table:?}"
    );
    assert!(table.iter().map(|r| r.1).sum::<std::time::Duration>() > std::time::Duration::ZERO);
}

#[test]
fn fused_rope_kv_stores_match_unfused() {
    let Some(dev) = common::device() else { return };
    let wdev = wgpu_device(&dev);
    let mut backend = wdev.backend().unwrap();
    let (hd, nkv, rows) = (64, 2, 16);
    let mut g = Graph::new();
    let q = g.input("q", DType::F32, &[hd, 4, 1]).unwrap();
    let k = g.input("k", DType::F32, &[hd, nkv, 1]).unwrap();
    let v = g.input("v", DType::F32, &[hd * nkv, 1]).unwrap();
    let pos = g.input("pos", DType::I32, &[1]).unwrap();
    let idx = g.input("idx", DType::I64, &[1]).unwrap();
    let kc = g.input("kc", DType::F16, &[hd * nkv, rows]).unwrap();
    let vc = g.input("vc", DType::F16, &[hd * nkv, rows]).unwrap();
    let p = RopeParams {
        n_dims: hd,
        mode: RopeMode::Neox,
        freq_base: 10000.0,
        freq_scale: 1.0,
    };
    let qr = g.rope(q, pos, p).unwrap();
    let kr = g.rope(k, pos, p).unwrap();
    let kr = g.reshape(kr, &[hd * nkv, 1]).unwrap();
    let sk = g.set_rows(kc, kr, idx).unwrap();
    let sv = g.set_rows(vc, v, idx).unwrap();
    for t in [qr, sk, sv] {
        g.set_output(t);
    }
    let nodes: Vec<_> = g.ids().collect();
    let mut alloc = GraphAllocator::new(dev.buffer_type());
    alloc.alloc(&mut g, &nodes).unwrap();
    let put = |id: TensorId, bytes: &[u8]| {
        let d = g.data(id).unwrap();
        d.buffer.set(d.offset, bytes).unwrap();
    };
    put(q, bytemuck::cast_slice(&values(hd * 4, 3, -1.0, 1.0)));
    put(k, bytemuck::cast_slice(&values(hd * nkv, 1, -1.0, 1.0)));
    put(v, bytemuck::cast_slice(&values(hd * nkv, 2, -1.0, 1.0)));
    put(pos, &37i32.to_le_bytes());
    put(idx, &5i64.to_le_bytes());
    let cache_bytes = hd * nkv * rows * 2;
    let mut run = |fusion: bool| {
        put(kc, &vec![0u8; cache_bytes]);
        put(vc, &vec![0u8; cache_bytes]);
        backend.set_fusion(fusion);
        backend.compute(&g, &nodes).unwrap();
        backend.synchronize().unwrap();
        let mut caches = Vec::new();
        for (id, n) in [(kc, cache_bytes), (vc, cache_bytes), (qr, hd * 4 * 4)] {
            let d = g.data(id).unwrap();
            let mut b = vec![0u8; n];
            d.buffer.get(d.offset, &mut b).unwrap();
            caches.push(b);
        }
        (caches, backend.last_dispatch_count())
    };
    let (plain, plain_n) = run(false);
    let (fused, fused_n) = run(true);
    assert_eq!((plain_n, fused_n), (4, 1));
    assert!(plain[0].iter().any(|&b| b != 0) && plain[1].iter().any(|&b| b != 0));
    // The same f32 arithmetic, rounded to f16 alike: the same bytes.
    assert_eq!(plain, fused);
}
