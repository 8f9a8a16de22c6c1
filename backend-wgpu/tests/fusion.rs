//! Fused dispatches: decode steps of small Llama-like blocks (quantized weights) run with and
//! without fusion give the same values with fewer dispatches: a block whose norms feed the
//! mat-vecs that read them, Q, K and V in one (15 dispatches to 5; to 6 where Q's weights are
//! of another type than K's and V's, which run as one), one whose residual add runs in place over the
//! input of the attention norm, so that the norm keeps a dispatch (14 to 6), and norms whose
//! result something other than a mat-vec also reads; the rope of Q and K with the stores of K
//! and V into F16 caches writes the same bytes in one dispatch as in four; and a token's Q, K
//! and V with that rope and those stores run as one mat-vec dispatch (adjacent pairs; NEOX
//! pairs keep the rope dispatch).

mod common;

use tessera_core::alloc::GraphAllocator;
use tessera_core::backend::Backend;
use tessera_core::quant::quantize_row;
use tessera_core::{DType, Graph, RopeMode, RopeParams, TensorId};
use tessera_wgpu::WgpuDevice;

/// Model width and feed-forward width (multiples of 256 for the K types).
const D: usize = 256;
const FF: usize = 512;

/// A graph to run: its inputs (tensor, type, values, and the range they are drawn from) and
/// its outputs (f32, with their lengths).
struct Block {
    g: Graph,
    inputs: Vec<(TensorId, DType, usize, (f32, f32))>,
    outs: Vec<(TensorId, usize)>,
}

/// Ranges of the inputs: activations, norm weights, weight matrices.
const X: (f32, f32) = (-1.0, 1.0);
const NORM: (f32, f32) = (0.5, 1.5);
const W: (f32, f32) = (-0.1, 0.1);

impl Block {
    /// An empty graph.
    fn new() -> Block {
        Block {
            g: Graph::new(),
            inputs: Vec::new(),
            outs: Vec::new(),
        }
    }

    /// A new input of type `dtype` and shape `ne`, drawn from `range`.
    fn input(&mut self, name: &str, dtype: DType, ne: &[usize], range: (f32, f32)) -> TensorId {
        let id = self.g.input(name, dtype, ne).unwrap();
        self.inputs.push((id, dtype, ne.iter().product(), range));
        id
    }

    /// Marks `id` (f32) as an output.
    fn output(&mut self, id: TensorId) {
        self.g.set_output(id);
        self.outs.push((id, self.g.get(id).nelements()));
    }
}

/// The block: x = scale(x_in) (a residual that is not a graph input, so that the adds may run
/// in place over it as in a model), then h = rms_norm(x) * wn, the outputs K = W_k h and
/// V = W_v h, x1 = x + W_o h, out = x1 + W_down swiglu(W_gate h2, W_up h2) with
/// h2 = rms_norm(x1) * wn2. The add x + W_o h runs in place over x while W_o h reads h: the
/// attention norm cannot be left to the mat-vecs (they would read x as it is overwritten).
fn block() -> Block {
    llama(None)
}

/// A Llama decode layer with the attention itself left out: [`block`] with h also read by
/// Q = W_q h (an output; W_q of K's and V's type) and x1 = x + W_o Q (Q standing in for the
/// attention): both norms are left to the mat-vecs that read them.
fn layer() -> Block {
    llama(Some(DType::Q4_0))
}

/// [`block`] (`q` None) or [`layer`] with W_q of type `q`.
fn llama(q: Option<DType>) -> Block {
    let mut b = Block::new();
    let x_in = b.input("x", DType::F32, &[D, 1], X);
    let wn = b.input("wn", DType::F32, &[D], NORM);
    let wn2 = b.input("wn2", DType::F32, &[D], NORM);
    let wq = q.map(|t| b.input("wq", t, &[D, D], W));
    let wk = b.input("wk", DType::Q4_0, &[D, 64], W);
    let wv = b.input("wv", DType::Q4_0, &[D, 64], W);
    let wo = b.input("wo", DType::Q8_0, &[D, D], W);
    let wg = b.input("wg", DType::Q4_K, &[D, FF], W);
    let wu = b.input("wu", DType::Q4_K, &[D, FF], W);
    let wd = b.input("wd", DType::Q6_K, &[FF, D], W);
    let g = &mut b.g;
    let x = g.scale(x_in, 1.0).unwrap();
    let h = g.rms_norm(x, 1e-5).unwrap();
    let h = g.mul(h, wn).unwrap();
    let q = wq.map(|wq| g.mul_mat(wq, h).unwrap());
    let k = g.mul_mat(wk, h).unwrap();
    let v = g.mul_mat(wv, h).unwrap();
    let o = g.mul_mat(wo, q.unwrap_or(h)).unwrap();
    let x1 = g.add(x, o).unwrap();
    let h2 = g.rms_norm(x1, 1e-5).unwrap();
    let h2 = g.mul(h2, wn2).unwrap();
    let gate = g.mul_mat(wg, h2).unwrap();
    let up = g.mul_mat(wu, h2).unwrap();
    let act = g.swiglu_split(gate, up).unwrap();
    let down = g.mul_mat(wd, act).unwrap();
    let out = g.add(x1, down).unwrap();
    b.output(out);
    for t in q.into_iter().chain([k, v]) {
        b.output(t);
    }
    b
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

/// `b`'s graph allocated on `dev` with its inputs written, and its nodes.
fn load(dev: &std::sync::Arc<dyn tessera_core::Device>, b: &mut Block) -> Vec<TensorId> {
    let nodes: Vec<_> = b.g.ids().collect();
    let mut alloc = GraphAllocator::new(dev.buffer_type());
    alloc.alloc(&mut b.g, &nodes).unwrap();
    for (k, &(id, dtype, n, (lo, hi))) in b.inputs.iter().enumerate() {
        let v = values(n, k as u64 + 1, lo, hi);
        let mut bytes = vec![0u8; dtype.row_size(n).unwrap()];
        quantize_row(dtype, &v, &mut bytes).unwrap();
        let d = b.g.data(id).unwrap();
        d.buffer.set(d.offset, &bytes).unwrap();
    }
    nodes
}

/// Runs `b` on `backend` and reads its outputs back, one after the other.
fn run(backend: &mut tessera_wgpu::WgpuBackend, b: &Block, nodes: &[TensorId]) -> Vec<f32> {
    backend.compute(&b.g, nodes).unwrap();
    backend.synchronize().unwrap();
    let mut v = Vec::new();
    for &(o, n) in &b.outs {
        let d = b.g.data(o).unwrap();
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

/// Runs `b` without fusion, with fusion, and with fusion again (replayed from its recording):
/// checks that the values agree and returns the dispatch counts without and with fusion.
fn fused_and_unfused(b: &mut Block) -> Option<(usize, usize)> {
    let dev = common::device()?;
    let mut backend = wgpu_device(&dev).backend().unwrap();
    let nodes = load(&dev, b);
    let mut run = |fusion: bool| {
        backend.set_fusion(fusion);
        let v = run(&mut backend, b, &nodes);
        (v, backend.last_dispatch_count())
    };
    let (plain, plain_n) = run(false);
    let (fused, fused_n) = run(true);
    let (again, again_n) = run(true);
    assert_eq!(fused_n, again_n);
    assert_eq!(fused, again);
    let scale = plain.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (i, (a, b)) in plain.iter().zip(&fused).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * scale.max(1.0),
            "element {i}: unfused {a}, fused {b}"
        );
    }
    println!("dispatches: {plain_n} unfused, {fused_n} fused");
    Some((plain_n, fused_n))
}

#[test]
fn fused_block_matches_unfused_with_fewer_dispatches() {
    let Some(counts) = fused_and_unfused(&mut block()) else {
        return;
    };
    // scale, then norm, mul, K, V, O, add, norm, mul, gate, up, swiglu, down, add; fused:
    // scale, norm*w, K and V, O+add, gate/up/swiglu with the norm, down+add.
    assert_eq!(counts, (14, 6));
}

#[test]
fn norms_fuse_into_the_mat_vecs_that_read_them() {
    let Some(counts) = fused_and_unfused(&mut layer()) else {
        return;
    };
    // scale, norm, mul, Q, K, V, O, add, norm, mul, gate, up, swiglu, down, add; fused: scale,
    // Q, K and V with the norm, O+add, gate/up/swiglu with the norm, down+add.
    assert_eq!(counts, (15, 5));
}

/// Several tokens (sequences decoded together) normalized and read by Q, K and V: the mat-vecs
/// read their columns pre-quantized, and one dispatch normalizes and quantizes them for all
/// three; unfused, each product quantizes its own.
#[test]
fn several_columns_are_quantized_once_for_q_k_and_v() {
    for (t, n) in [(DType::Q4_0, 16), (DType::Q4_K, 3)] {
        let mut b = Block::new();
        let x = b.input("x", DType::F32, &[2 * D, n], X);
        let wn = b.input("wn", DType::F32, &[2 * D], NORM);
        let wq = b.input("wq", t, &[2 * D, 3 * D], W);
        let wk = b.input("wk", t, &[2 * D, 80], W);
        let wv = b.input("wv", t, &[2 * D, 80], W);
        let h = b.g.rms_norm(x, 1e-5).unwrap();
        let h = b.g.mul(h, wn).unwrap();
        for w in [wq, wk, wv] {
            let o = b.g.mul_mat(w, h).unwrap();
            b.output(o);
        }
        let Some(counts) = fused_and_unfused(&mut b) else {
            return;
        };
        // norm, mul, then each product's quantization and mat-vec; fused: the norm and the
        // quantization, Q, K, V.
        assert_eq!(counts, (8, 4), "type {t}, {n} columns");
    }
}

/// W_q of another type than W_k and W_v (Q8_0 and Q4_0): Q keeps a mat-vec of its own, and K
/// and V run as one.
#[test]
fn q_of_another_type_runs_apart_from_k_and_v() {
    let Some(counts) = fused_and_unfused(&mut llama(Some(DType::Q8_0))) else {
        return;
    };
    // As the layer, with Q with the norm and K and V with the norm as two dispatches.
    assert_eq!(counts, (15, 6));
}

/// Q with more rows than K and V (as in grouped-query attention), all of one type, by a plain
/// vector (no norm) and by a normalized one, for each weight type of the integer-dot mat-vec:
/// one dispatch with the values of three.
#[test]
fn q_k_and_v_run_as_one_dispatch() {
    for t in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q6_K,
    ] {
        for norm in [false, true] {
            let mut b = Block::new();
            let x = b.input("x", DType::F32, &[2 * D, 1], X);
            let wn = b.input("wn", DType::F32, &[2 * D], NORM);
            let wq = b.input("wq", t, &[2 * D, 3 * D], W);
            let wk = b.input("wk", t, &[2 * D, 80], W);
            let wv = b.input("wv", t, &[2 * D, 80], W);
            let g = &mut b.g;
            let h = if norm {
                let h = g.rms_norm(x, 1e-5).unwrap();
                g.mul(h, wn).unwrap()
            } else {
                g.scale(x, 1.0).unwrap()
            };
            let q = g.mul_mat(wq, h).unwrap();
            let k = g.mul_mat(wk, h).unwrap();
            let v = g.mul_mat(wv, h).unwrap();
            for o in [q, k, v] {
                b.output(o);
            }
            let Some(counts) = fused_and_unfused(&mut b) else {
                return;
            };
            // norm, mul (or scale), Q, K, V; fused: Q, K and V (after the scale).
            let expect = if norm { (5, 1) } else { (4, 2) };
            assert_eq!(counts, expect, "type {t}, norm {norm}");
        }
    }
}

/// h = rms_norm(x) * w read by K and V, and also by an add, as an output, or by a mul_mat that
/// does not run as the integer-dot mat-vec (Q6_K rows of 256 values, 210 bytes, are not whole
/// words): the norm keeps its dispatch (norm*w), and K and V read its result.
#[test]
fn norms_read_by_more_than_mat_vecs_keep_their_dispatch() {
    for other in ["add", "output", "float mat-vec"] {
        let mut b = Block::new();
        let x = b.input("x", DType::F32, &[D, 1], X);
        let wn = b.input("wn", DType::F32, &[D], NORM);
        let wk = b.input("wk", DType::Q8_0, &[D, 64], W);
        let wv = b.input("wv", DType::Q8_0, &[D, 64], W);
        let wq = b.input("wq", DType::Q6_K, &[D, 64], W);
        let g = &mut b.g;
        let h = g.rms_norm(x, 1e-5).unwrap();
        let h = g.mul(h, wn).unwrap();
        let k = g.mul_mat(wk, h).unwrap();
        let v = g.mul_mat(wv, h).unwrap();
        let o = match other {
            "add" => g.add(h, x).unwrap(),
            "output" => h,
            _ => g.mul_mat(wq, h).unwrap(),
        };
        for t in [k, v, o] {
            b.output(t);
        }
        let Some(counts) = fused_and_unfused(&mut b) else {
            return;
        };
        // norm, mul, K, V (and the other reader); fused: norm*w, K and V (and the other).
        let expect = if other == "output" { (4, 2) } else { (5, 3) };
        assert_eq!(counts, expect, "also read by: {other}");
    }
}

/// The per-dispatch profile: a profiled run gives the same values, and its table counts each
/// of the fused layer's 5 dispatches once per run under its variant's name, with GPU time.
#[test]
fn profiled_block_names_and_times_its_dispatches() {
    let Some(dev) = common::device() else { return };
    let wdev = wgpu_device(&dev);
    let mut backend = wdev.backend().unwrap();
    backend.set_fusion(true);
    let mut b = layer();
    let nodes = load(&dev, &mut b);
    let plain = run(&mut backend, &b, &nodes);
    assert!(backend.profile_table().is_empty());
    backend.set_profile(true);
    let profiled = run(&mut backend, &b, &nodes);
    let again = run(&mut backend, &b, &nodes);
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
    assert_eq!(table.iter().map(|r| r.2).sum::<usize>(), 2 * 5);
    for name in [
        "mat_vec_q_q4_K+w2+glu+norm",
        "mat_vec_q_q4_0+w2+pair+qkv+norm",
    ] {
        assert!(table.iter().any(|r| r.0 == name), "{name}: {table:?}");
    }
    assert!(table.iter().map(|r| r.1).sum::<std::time::Duration>() > std::time::Duration::ZERO);
}

/// A Llama block's step between its projections and attention: the rope of q and k (k of
/// `[hd, nkv, 1]`) at `pos` (with frequency factors `f` where given), then the rotated k and v
/// stored at cache row `idx`; the rotated q and both stores are outputs. Returns the rotated q.
fn rope_and_store(
    g: &mut Graph,
    [q, k, v]: [TensorId; 3],
    [pos, idx]: [TensorId; 2],
    [kc, vc]: [TensorId; 2],
    (p, f): (RopeParams, Option<TensorId>),
) -> TensorId {
    let ne = g.get(k).ne;
    let qr = g.rope_ext(q, pos, f, p).unwrap();
    let kr = g.rope_ext(k, pos, f, p).unwrap();
    let kr = g.reshape(kr, &[ne[0] * ne[1], 1]).unwrap();
    let sk = g.set_rows(kc, kr, idx).unwrap();
    let sv = g.set_rows(vc, v, idx).unwrap();
    for t in [qr, sk, sv] {
        g.set_output(t);
    }
    qr
}

/// The rope of Q and K and the cache stores as one dispatch (KV), with the plain rotation,
/// with YaRN's blend and a magnitude, and with frequency factors and a magnitude: the same
/// bytes as the unfused run.
#[test]
fn fused_rope_kv_stores_match_unfused() {
    let Some(dev) = common::device() else { return };
    let wdev = wgpu_device(&dev);
    let mut backend = wdev.backend().unwrap();
    let (hd, nkv, rows) = (64, 2, 16);
    let yarn = RopeParams {
        ext_factor: 1.0,
        attn_factor: 0.9,
        n_ctx_orig: 4096,
        ..RopeParams::new(hd, RopeMode::Normal, 10000.0, 0.25)
    };
    let factored = RopeParams {
        attn_factor: 1.2,
        ..RopeParams::new(hd, RopeMode::Normal, 10000.0, 1.0)
    };
    // (parameters, with factors)
    let cases = [
        (RopeParams::new(hd, RopeMode::Neox, 10000.0, 1.0), false),
        (yarn, false),
        (factored, true),
    ];
    for (p, with_factors) in cases {
        let mut g = Graph::new();
        let q = g.input("q", DType::F32, &[hd, 4, 1]).unwrap();
        let k = g.input("k", DType::F32, &[hd, nkv, 1]).unwrap();
        let v = g.input("v", DType::F32, &[hd * nkv, 1]).unwrap();
        let pos = g.input("pos", DType::I32, &[1]).unwrap();
        let idx = g.input("idx", DType::I64, &[1]).unwrap();
        let kc = g.input("kc", DType::F16, &[hd * nkv, rows]).unwrap();
        let vc = g.input("vc", DType::F16, &[hd * nkv, rows]).unwrap();
        let f = with_factors.then(|| g.input("f", DType::F32, &[hd / 2]).unwrap());
        let qr = rope_and_store(&mut g, [q, k, v], [pos, idx], [kc, vc], (p, f));
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
        if let Some(f) = f {
            put(f, bytemuck::cast_slice(&values(hd / 2, 4, 1.0, 8.0)));
        }
        put(pos, &3037i32.to_le_bytes());
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
        assert_eq!((plain_n, fused_n), (4, 1), "{p:?}");
        assert!(plain[0].iter().any(|&b| b != 0) && plain[1].iter().any(|&b| b != 0));
        // The same f32 arithmetic, rounded to f16 alike: the same bytes.
        assert_eq!(plain, fused, "{p:?}");
    }
}

/// A token's Q, K and V (Q4_0 weights, by a normalized or a plain vector), the rope of Q and K
/// and the stores of K and V into their caches at row `idx`: with adjacent pairs, all in the
/// Q/K/V mat-vec dispatch (ROPE; F16 and F32 caches, i32 and i64 rows, a part of each head
/// left unrotated), with NEOX pairs the mat-vec and the fused rope dispatch. The rotated Q and
/// the caches agree with the unfused run's.
#[test]
fn q_k_v_rope_and_cache_stores_run_as_one_dispatch() {
    let (hd, nh, nkv, rows) = (64, 4, 2, 12);
    // (cache type, row index type, rope mode, norm, dispatches unfused and fused)
    let cases = [
        (DType::F16, DType::I64, RopeMode::Normal, true, (9, 1)),
        (DType::F32, DType::I32, RopeMode::Normal, true, (9, 1)),
        (DType::F16, DType::I64, RopeMode::Normal, false, (8, 2)),
        (DType::F16, DType::I32, RopeMode::Neox, true, (9, 2)),
    ];
    for (ct, it, mode, norm, expect) in cases {
        let Some(dev) = common::device() else { return };
        let mut backend = wgpu_device(&dev).backend().unwrap();
        let mut b = Block::new();
        let x = b.input("x", DType::F32, &[D, 1], X);
        let wn = b.input("wn", DType::F32, &[D], NORM);
        let wq = b.input("wq", DType::Q4_0, &[D, hd * nh], W);
        let wk = b.input("wk", DType::Q4_0, &[D, hd * nkv], W);
        let wv = b.input("wv", DType::Q4_0, &[D, hd * nkv], W);
        let kc = b.input("kc", ct, &[hd * nkv, rows], X);
        let vc = b.input("vc", ct, &[hd * nkv, rows], X);
        let g = &mut b.g;
        let pos = g.input("pos", DType::I32, &[1]).unwrap();
        let idx = g.input("idx", it, &[1]).unwrap();
        let h = if norm {
            let h = g.rms_norm(x, 1e-5).unwrap();
            g.mul(h, wn).unwrap()
        } else {
            // An output, so that its memory outlives the products: where the rotated Q may
            // take it, the dispatch that reads it cannot write Q, and the rope runs apart.
            let h = g.scale(x, 1.0).unwrap();
            g.set_output(h);
            h
        };
        let q = g.mul_mat(wq, h).unwrap();
        let k = g.mul_mat(wk, h).unwrap();
        let v = g.mul_mat(wv, h).unwrap();
        let q = g.reshape(q, &[hd, nh, 1]).unwrap();
        let k = g.reshape(k, &[hd, nkv, 1]).unwrap();
        let p = RopeParams::new(48, mode, 10000.0, 0.5);
        let qr = rope_and_store(g, [q, k, v], [pos, idx], [kc, vc], (p, None));
        let nodes = load(&dev, &mut b);
        let put = |id: TensorId, bytes: &[u8]| {
            let d = b.g.data(id).unwrap();
            d.buffer.set(d.offset, bytes).unwrap();
        };
        put(pos, &37i32.to_le_bytes());
        match it {
            DType::I64 => put(idx, &5i64.to_le_bytes()),
            _ => put(idx, &5i32.to_le_bytes()),
        }
        let before: Vec<u8> = {
            let d = b.g.data(kc).unwrap();
            let mut v = vec![0u8; ct.row_size(hd * nkv * rows).unwrap()];
            d.buffer.get(d.offset, &mut v).unwrap();
            v
        };
        let mut run = |fusion: bool| {
            backend.set_fusion(fusion);
            backend.compute(&b.g, &nodes).unwrap();
            backend.synchronize().unwrap();
            let mut out = Vec::new();
            for (id, t, n) in [
                (qr, DType::F32, hd * nh),
                (kc, ct, hd * nkv * rows),
                (vc, ct, hd * nkv * rows),
            ] {
                let d = b.g.data(id).unwrap();
                let mut bytes = vec![0u8; t.row_size(n).unwrap()];
                d.buffer.get(d.offset, &mut bytes).unwrap();
                if id == kc {
                    assert_ne!(bytes, before, "K cache not written");
                }
                let mut v = vec![0f32; n];
                tessera_core::quant::dequantize_row(t, &bytes, &mut v).unwrap();
                out.push(v);
            }
            (out, backend.last_dispatch_count())
        };
        let (plain, plain_n) = run(false);
        let (fused, fused_n) = run(true);
        let (again, again_n) = run(true);
        let case = format!("cache {ct}, rows {it}, {mode:?}, norm {norm}");
        assert_eq!((plain_n, fused_n), expect, "{case}");
        assert_eq!((fused_n, &fused), (again_n, &again), "{case}");
        for (which, (a, f)) in ["Q", "K cache", "V cache"]
            .iter()
            .zip(plain.iter().zip(&fused))
        {
            let scale = a.iter().fold(1f32, |m, v| m.max(v.abs()));
            for (i, (x, y)) in a.iter().zip(f).enumerate() {
                assert!(
                    (x - y).abs() <= 2e-3 * scale,
                    "{case}: {which} element {i}: unfused {x}, fused {y}"
                );
            }
        }
    }
}

/// Two registries with different options in one process: each device keeps its own (fusion
/// and subgroups on in one, off in the other), both run the same block side by side, and they
/// agree.
#[test]
fn devices_with_different_options_run_side_by_side() {
    use tessera_wgpu::WgpuOptions;
    let on = WgpuOptions::default();
    let off = WgpuOptions::default().fusion(false).subgroups(false);
    let (Some(dev_on), Some(dev_off)) = (common::device_with(on), common::device_with(off)) else {
        return;
    };
    let (mut b_on, mut b_off) = (block(), block());
    let (nodes_on, nodes_off) = (load(&dev_on, &mut b_on), load(&dev_off, &mut b_off));
    let mut be_on = wgpu_device(&dev_on).backend().unwrap();
    let mut be_off = wgpu_device(&dev_off).backend().unwrap();
    for _ in 0..2 {
        let fused = run(&mut be_on, &b_on, &nodes_on);
        let plain = run(&mut be_off, &b_off, &nodes_off);
        assert_eq!(
            (be_off.last_dispatch_count(), be_on.last_dispatch_count()),
            (14, 6)
        );
        let scale = plain.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (i, (a, b)) in plain.iter().zip(&fused).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * scale.max(1.0),
                "element {i}: options off {a}, on {b}"
            );
        }
    }
}
