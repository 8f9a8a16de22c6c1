//! CUDA graph replay and fused kernels, checked against eager, unfused runs of the same graph
//! (and skipped with a message when no CUDA device is present).

mod common;

use common::*;
use tessera_core::alloc::GraphAllocator;
use tessera_core::dtype::DType;
use tessera_core::{Backend, Graph, RopeMode, RopeParams, TensorId};
use tessera_cuda::{CudaOptions, GraphMode};

/// A decode step of a small Llama-like block: norm + weight, Q, K and V projections, Q and K
/// rotated, K and V stored into F16 caches, gate/up/swiglu. With `qv` false, Q is not rotated
/// and V not stored (only K's rope and set_rows can fuse).
struct Block {
    g: Graph,
    inputs: Vec<TensorId>,
    outputs: Vec<TensorId>,
    /// The type of the K and V weights (Q's is Q4_0).
    kv_type: DType,
}

const OUTPUT_NAMES: [&str; 4] = ["K cache", "V cache", "gate/up/swiglu", "Q"];

fn block(tokens: usize, qv: bool, kv_type: DType) -> Block {
    let mut g = Graph::new();
    let x = g.input("x", DType::F32, &[576, tokens]).unwrap();
    let wn = g.input("wn", DType::F32, &[576]).unwrap();
    let wq = g.input("wq", DType::Q4_0, &[576, 576]).unwrap();
    let wk = g.input("wk", kv_type, &[576, 192]).unwrap();
    let wv = g.input("wv", kv_type, &[576, 192]).unwrap();
    let wg = g.input("wg", DType::Q4_1, &[576, 1536]).unwrap();
    let wu = g.input("wu", DType::Q4_1, &[576, 1536]).unwrap();
    let pos = g.input("pos", DType::I32, &[tokens]).unwrap();
    let idx = g.input("idx", DType::I64, &[tokens]).unwrap();
    let kcache = g.input("kcache", DType::F16, &[192, 64]).unwrap();
    let vcache = g.input("vcache", DType::F16, &[192, 64]).unwrap();
    let h = g.rms_norm(x, 1e-5).unwrap();
    let hn = g.mul(h, wn).unwrap();
    let q = g.mul_mat(wq, hn).unwrap();
    let k = g.mul_mat(wk, hn).unwrap();
    let v = g.mul_mat(wv, hn).unwrap();
    let q3 = g.reshape(q, &[64, 9, tokens]).unwrap();
    let k3 = g.reshape(k, &[64, 3, tokens]).unwrap();
    let p = RopeParams::new(64, RopeMode::Normal, 10000.0, 1.0);
    let qr = if qv { g.rope(q3, pos, p).unwrap() } else { q };
    let kr = g.rope(k3, pos, p).unwrap();
    let kv = g.reshape(kr, &[192, tokens]).unwrap();
    let sk = g.set_rows(kcache, kv, idx).unwrap();
    let sv = if qv {
        g.set_rows(vcache, v, idx).unwrap()
    } else {
        v
    };
    let gate = g.mul_mat(wg, hn).unwrap();
    let up = g.mul_mat(wu, hn).unwrap();
    let sw = g.swiglu_split(gate, up).unwrap();
    Block {
        g,
        inputs: vec![x, wn, wq, wk, wv, wg, wu, pos, idx, kcache, vcache],
        outputs: vec![sk, sv, sw, qr],
        kv_type,
    }
}

/// Input bytes for a block, step `step` (positions and cache rows move with it).
fn block_inputs(b: &Block, rng: &mut Rng, tokens: usize, step: usize) -> Vec<(TensorId, Vec<u8>)> {
    let [x, wn, wq, wk, wv, wg, wu, pos, idx, kcache, vcache] = b.inputs[..] else {
        unreachable!()
    };
    let positions: Vec<f32> = (0..tokens).map(|t| (step * tokens + t) as f32).collect();
    let rows: Vec<u8> = (0..tokens)
        .flat_map(|t| (((step * tokens + t) % 64) as i64).to_le_bytes())
        .collect();
    vec![
        (x, to_bytes(DType::F32, &rng.vec(576 * tokens, -1.0, 1.0))),
        (wn, to_bytes(DType::F32, &rng.vec(576, 0.5, 1.5))),
        (wq, to_bytes(DType::Q4_0, &rng.vec(576 * 576, -0.1, 0.1))),
        (wk, to_bytes(b.kv_type, &rng.vec(576 * 192, -0.1, 0.1))),
        (wv, to_bytes(b.kv_type, &rng.vec(576 * 192, -0.1, 0.1))),
        (wg, to_bytes(DType::Q4_1, &rng.vec(576 * 1536, -0.1, 0.1))),
        (wu, to_bytes(DType::Q4_1, &rng.vec(576 * 1536, -0.1, 0.1))),
        (pos, to_bytes(DType::I32, &positions)),
        (idx, rows),
        (kcache, to_bytes(DType::F16, &rng.vec(192 * 64, -1.0, 1.0))),
        (vcache, to_bytes(DType::F16, &rng.vec(192 * 64, -1.0, 1.0))),
    ]
}

fn outputs_f32(b: &Block, bytes: &[Vec<u8>]) -> Vec<Vec<f32>> {
    b.outputs
        .iter()
        .zip(bytes)
        .map(|(&o, v)| {
            let t = b.g.get(o);
            from_bytes(t.dtype, v, t.nelements())
        })
        .collect()
}

#[test]
fn fused_kernels_match_unfused_ops() {
    let Some(dev) = cuda() else { return };
    // Commands of one fused decode step: rms_norm*w (quantizing for the mat-vecs), Q (Q4_0),
    // K and V (Q8_0, one launch), rope of Q and K with both cache stores, the quantizing of the
    // norm's result again (the rope ran in between), gate/up/swiglu; without Q's rope and V's
    // store: a K rope + store launch in their place. With Q, K and V all Q4_0: one launch for
    // the three products, the rope and the stores (mmvq_multi_rope), no quantizing again.
    for (qv, kv_type, fused_commands) in [
        (true, DType::Q8_0, 6),
        (false, DType::Q8_0, 6),
        (true, DType::Q4_0, 3),
    ] {
        for tokens in [1usize, 5] {
            let [(fused, names), (unfused, unfused_names)] = fused_and_unfused(&dev, || {
                let b = block(tokens, qv, kv_type);
                let inputs = block_inputs(&b, &mut Rng::new(21 + tokens as u64), tokens, 3);
                (b, inputs)
            });
            let results = [fused, unfused];
            let counts = [names.len(), unfused_names.len()];
            for (i, name) in OUTPUT_NAMES.iter().enumerate() {
                check(
                    &format!("fused vs unfused {name}, {tokens} tokens, rope of Q {qv}"),
                    &results[0][i],
                    &results[1][i],
                    1e-10,
                );
            }
            println!(
                "{tokens} tokens, rope of Q {qv}, K/V {kv_type}: {} commands fused, {} unfused: {names:?}",
                counts[0], counts[1]
            );
            let rope_in_mmvq = names.iter().any(|n| n.starts_with("mmvq_multi_rope"));
            assert_eq!(
                rope_in_mmvq,
                tokens == 1 && qv && kv_type == DType::Q4_0,
                "mmvq_multi_rope where Q, K and V of one token share a type: {names:?}"
            );
            assert!(counts[0] < counts[1], "fusion removed no launch");
            if tokens == 1 {
                assert_eq!(
                    counts[0], fused_commands,
                    "commands of a fused decode step: {names:?}"
                );
            }
        }
    }
}

/// Runs the block `make` returns (with its inputs) on a fresh backend with fusion on, then off:
/// for each, the outputs as f32 and the names of the commands it ran.
fn fused_and_unfused(
    dev: &std::sync::Arc<dyn tessera_core::Device>,
    make: impl Fn() -> (Block, Vec<(TensorId, Vec<u8>)>),
) -> [(Vec<Vec<f32>>, Vec<&'static str>); 2] {
    [true, false].map(|fuse| {
        let (mut b, inputs) = make();
        let options = CudaOptions::default().fusion(fuse);
        let mut be = concrete(dev).with_options(options).cuda_backend().unwrap();
        let outs = b.outputs.clone();
        let out = run(dev, &mut be, &mut b.g, &inputs, &outs);
        (outputs_f32(&b, &out), be.last_command_names())
    })
}

/// Runs block `b` with `inputs` on `be` and on the eager backend, checks that the outputs are
/// the same bits, and returns how `be` ran it.
fn step_vs_eager(
    be: &mut tessera_cuda::CudaBackend,
    eager: &mut tessera_cuda::CudaBackend,
    b: &Block,
    nodes: &[TensorId],
    inputs: &[(TensorId, Vec<u8>)],
    what: &str,
) -> GraphMode {
    let mut results = Vec::new();
    for backend in [&mut *be, &mut *eager] {
        set_inputs(&b.g, inputs);
        backend.compute(&b.g, nodes).unwrap();
        backend.synchronize().unwrap();
        results.push(outputs_f32(b, &read(&b.g, &b.outputs)));
    }
    let mode = be.graph_mode();
    for (i, (got, want)) in results[0].iter().zip(&results[1]).enumerate() {
        check(&format!("{what} ({mode:?}) output {i}"), got, want, 0.0);
    }
    mode
}

/// Marks the block's outputs and places every tensor of it in `dev`'s memory; returns its
/// nodes in order.
fn allocate(dev: &std::sync::Arc<dyn tessera_core::Device>, b: &mut Block) -> Vec<TensorId> {
    let nodes: Vec<TensorId> = b.g.ids().collect();
    for &o in &b.outputs {
        b.g.set_output(o);
    }
    let mut alloc = GraphAllocator::new(dev.buffer_type());
    alloc.alloc(&mut b.g, &nodes).unwrap();
    nodes
}

/// Two streams of one GPU with other options in one process: one as a GPU used alone (kernels
/// that release their successors early), one as the part of a multi-GPU group (kernels that do
/// not), without graphs. Both builds of the kernels are loaded side by side, and the results
/// are the same bits.
#[test]
fn streams_with_other_options_share_a_gpu() {
    let Some(dev) = cuda() else { return };
    let mut rng = Rng::new(23);
    let mut b = block(1, true, DType::Q4_0);
    let nodes = allocate(&dev, &mut b);
    let mut alone = concrete(&dev).cuda_backend().unwrap();
    let grouped = CudaOptions::default().grouped(true).graphs(false);
    let grouped_dev = concrete(&dev).with_options(grouped.clone());
    assert_eq!(grouped_dev.options(), grouped);
    assert_eq!(concrete(&dev).options(), CudaOptions::default());
    let mut part = grouped_dev.cuda_backend().unwrap();
    for step in 0..2 {
        let inputs = block_inputs(&b, &mut rng, 1, step);
        step_vs_eager(
            &mut alone,
            &mut part,
            &b,
            &nodes,
            &inputs,
            "alone vs grouped",
        );
    }
    assert_eq!(part.graph_mode(), GraphMode::Eager);
}

#[test]
fn graphs_replay_and_update() {
    let Some(dev) = cuda() else { return };
    let mut rng = Rng::new(22);
    let mut b = block(1, true, DType::Q8_0);
    let nodes = allocate(&dev, &mut b);
    let mut be = concrete(&dev).cuda_backend().unwrap();
    let eager_dev = concrete(&dev).with_options(CudaOptions::default().graphs(false));
    let mut eager = eager_dev.cuda_backend().unwrap();
    let mut modes = Vec::new();
    for step in 0..4 {
        let inputs = block_inputs(&b, &mut rng, 1, step);
        modes.push(step_vs_eager(
            &mut be,
            &mut eager,
            &b,
            &nodes,
            &inputs,
            "graph step",
        ));
    }
    assert_eq!(
        modes,
        vec![
            GraphMode::Eager,
            GraphMode::Captured,
            GraphMode::Replayed,
            GraphMode::Replayed
        ]
    );
    // The same graph object with one input bound elsewhere: its stamp changed, so it is
    // encoded again (not relaunched with the old address) and the graph updated.
    let x = b.inputs[0];
    let moved = dev.buffer_type().alloc(b.g.get(x).nbytes()).unwrap();
    b.g.bind(x, moved, 0).unwrap();
    let inputs = block_inputs(&b, &mut rng, 1, 5);
    let rebound = step_vs_eager(&mut be, &mut eager, &b, &nodes, &inputs, "rebound input");
    assert_eq!(rebound, GraphMode::Updated);
    // The same graph in other memory: the executable graph is updated, not rebuilt.
    let mut b2 = block(1, true, DType::Q8_0);
    allocate(&dev, &mut b2);
    let inputs = block_inputs(&b2, &mut rng, 1, 9);
    let mode = step_vs_eager(&mut be, &mut eager, &b2, &nodes, &inputs, "moved graph");
    assert_eq!(mode, GraphMode::Updated);
    println!(
        "graph modes: {modes:?}, then {mode:?}; {} commands per step",
        be.last_command_count()
    );
}

#[test]
fn out_of_memory_is_an_error() {
    let Some(dev) = cuda() else { return };
    match dev.buffer_type().alloc(1 << 50) {
        Err(tessera_core::Error::OutOfMemory { bytes, .. }) => {
            println!("ok out of memory: {bytes} bytes")
        }
        Err(e) => panic!("expected OutOfMemory, got {e}"),
        Ok(_) => panic!("a petabyte allocation succeeded"),
    }
    // Freed blocks come back from the pool: many allocations of one size do not grow memory.
    let before = dev.memory().free;
    for _ in 0..100 {
        let b = dev.buffer_type().alloc(64 << 20).unwrap();
        b.clear(1).unwrap();
    }
    let after = dev.memory().free;
    assert!(
        before.abs_diff(after) < 512 << 20,
        "memory grew from {before} to {after} free"
    );
    println!(
        "ok pool reuse: free {} MiB before, {} MiB after 100 x 64 MiB",
        before >> 20,
        after >> 20
    );
}

/// Attention of one token over a cache long enough to split, then the o projection with its
/// residual add (as a Llama block ends its attention): 9 heads of 64 over 3 KV heads.
fn attention_block() -> Block {
    let mut g = Graph::new();
    let q = g.input("q", DType::F32, &[64, 9, 1]).unwrap();
    let k = g.input("k", DType::F16, &[64, 600, 3]).unwrap();
    let v = g.input("v", DType::F16, &[64, 600, 3]).unwrap();
    let mask = g.input("mask", DType::F16, &[600, 1]).unwrap();
    let wo = g.input("wo", DType::Q4_0, &[576, 576]).unwrap();
    let r = g.input("r", DType::F32, &[576, 1]).unwrap();
    let qp = g.permute(q, [0, 2, 1, 3]).unwrap();
    let att = g
        .flash_attn_ext(qp, k, v, Some(mask), 0.125, 0.0, 0.0)
        .unwrap();
    let flat = g.reshape(att, &[576, 1]).unwrap();
    let o = g.mul_mat(wo, flat).unwrap();
    let out = g.add(r, o).unwrap();
    Block {
        g,
        inputs: vec![q, k, v, mask, wo, r],
        outputs: vec![att, out],
        kv_type: DType::F16,
    }
}

/// Fresh input bytes for [`attention_block`].
fn attention_inputs(b: &Block, rng: &mut Rng) -> Vec<(TensorId, Vec<u8>)> {
    let [q, k, v, mask, wo, r] = b.inputs[..] else {
        unreachable!()
    };
    vec![
        (q, to_bytes(DType::F32, &rng.vec(576, -1.0, 1.0))),
        (k, to_bytes(DType::F16, &rng.vec(64 * 600 * 3, -1.0, 1.0))),
        (v, to_bytes(DType::F16, &rng.vec(64 * 600 * 3, -1.0, 1.0))),
        (mask, to_bytes(DType::F16, &rng.vec(600, -2.0, 0.0))),
        (wo, to_bytes(DType::Q4_0, &rng.vec(576 * 576, -0.1, 0.1))),
        (r, to_bytes(DType::F32, &rng.vec(576, -1.0, 1.0))),
    ]
}

#[test]
fn split_attention_replays() {
    let Some(dev) = cuda() else { return };
    let mut rng = Rng::new(23);
    // Fused (split attention merged in its own launch, its result quantized for the o
    // projection) against unfused ops.
    let [(fused, names), (unfused, unfused_names)] = fused_and_unfused(&dev, || {
        let b = attention_block();
        let inputs = attention_inputs(&b, &mut Rng::new(24));
        (b, inputs)
    });
    let results = [fused, unfused];
    let counts = [names.len(), unfused_names.len()];
    for (i, name) in ["attention", "o projection + residual"].iter().enumerate() {
        check(
            &format!("fused vs unfused {name}"),
            &results[0][i],
            &results[1][i],
            1e-5,
        );
    }
    println!(
        "attention + o projection: {} commands fused, {} unfused",
        counts[0], counts[1]
    );
    assert_eq!(counts[0], 2, "fattn_dec and the o projection");
    assert_eq!(
        counts[1], 5,
        "fattn_dec, fattn_combine, quantize, mat-vec and add unfused"
    );
    // Replays with new inputs each step: the merge's block counters must be back at zero.
    let mut b = attention_block();
    let outs = b.outputs.clone();
    for &o in &outs {
        b.g.set_output(o);
    }
    let nodes = running_nodes(&b.g);
    let all: Vec<TensorId> = b.g.ids().collect();
    let mut alloc = GraphAllocator::new(dev.buffer_type());
    alloc.alloc(&mut b.g, &all).unwrap();
    let mut be = concrete(&dev).cuda_backend().unwrap();
    let eager_dev = concrete(&dev).with_options(CudaOptions::default().graphs(false));
    let mut eager = eager_dev.cuda_backend().unwrap();
    let mut modes = Vec::new();
    for step in 0..4 {
        let inputs = attention_inputs(&b, &mut rng);
        let what = format!("split attention step {step}");
        modes.push(step_vs_eager(
            &mut be, &mut eager, &b, &nodes, &inputs, &what,
        ));
    }
    assert_eq!(modes[2..], [GraphMode::Replayed, GraphMode::Replayed]);
}
