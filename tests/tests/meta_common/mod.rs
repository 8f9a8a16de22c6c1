//! Weights, graphs and comparisons shared by the meta-device tests (meta.rs, meta_group.rs):
//! random weights in a sharded buffer, a small MLP with column- and row-parallel products,
//! evaluation of a graph on any device, and NMSE checks against the CPU.

// Each test binary uses part of this module.
#![allow(dead_code)]

use std::sync::Arc;

use tessera::meta::{check_plan, MetaDevice, ShardedTensor, SplitState};
use tessera_core::alloc::GraphAllocator;
use tessera_core::quant::quantize_row;
use tessera_core::sched::Scheduler;
use tessera_core::{Buffer, DType, Device, Graph, Result, TensorId, UnaryOp};
use tessera_cpu::CpuDevice;

/// The CPU device the meta results are compared with (one thread: the parts run side by side).
pub fn cpu() -> Arc<dyn Device> {
    Arc::new(CpuDevice::new().with_threads(1))
}

/// A weight: type, shape, state on a meta device, and its bytes.
pub struct W {
    pub dtype: DType,
    pub ne: [usize; 4],
    pub state: SplitState,
    pub data: Vec<u8>,
}

/// Random values in [-1, 1) (never all zeros).
pub fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 20000) as f32 / 10000.0 - 1.0
        })
        .collect()
}

/// A weight of `dtype` and shape `ne` with random values, quantized where the type is.
pub fn weight(dtype: DType, ne: [usize; 4], state: SplitState, seed: u32) -> W {
    let n: usize = ne.iter().product();
    let v = values(n, seed);
    let row = ne[0] / dtype.block_size() * dtype.type_size();
    let mut data = vec![0u8; row * n / ne[0]];
    for (r, out) in data.chunks_exact_mut(row).enumerate() {
        quantize_row(dtype, &v[r * ne[0]..(r + 1) * ne[0]], out).unwrap();
    }
    W {
        dtype,
        ne,
        state,
        data,
    }
}

/// Puts the weights on `dev`: a sharded buffer on a meta device, a plain one elsewhere.
pub fn place(dev: &Arc<dyn Device>, ws: &[W]) -> Result<(Arc<dyn Buffer>, Vec<usize>)> {
    let mut offs = Vec::new();
    let mut end = 0;
    for w in ws {
        offs.push(end);
        end += w.data.len().div_ceil(64) * 64;
    }
    let buf = match MetaDevice::from_device(dev.as_ref()) {
        Some(m) => {
            let specs: Vec<ShardedTensor> = ws
                .iter()
                .zip(&offs)
                .map(|(w, &offset)| ShardedTensor {
                    offset,
                    dtype: w.dtype,
                    ne: w.ne,
                    state: w.state.clone(),
                })
                .collect();
            m.alloc_sharded(end, &specs)?
        }
        None => dev.buffer_type().alloc(end)?,
    };
    for (w, &o) in ws.iter().zip(&offs) {
        buf.set(o, &w.data)?;
    }
    Ok((buf, offs))
}

pub type BuildFn = dyn Fn(&mut Graph, &[TensorId], TensorId) -> Result<Vec<TensorId>>;

/// Runs a graph of weights `ws` and one random f32 input `x` on `dev` `runs` times (the
/// later runs reuse the plan); returns the outputs.
pub fn eval(
    dev: &Arc<dyn Device>,
    ws: &[W],
    x_ne: &[usize],
    build: &BuildFn,
    runs: usize,
) -> Result<Vec<Vec<f32>>> {
    let (buf, offs) = place(dev, ws)?;
    let mut g = Graph::new();
    let mut wid = Vec::new();
    for (i, (w, &o)) in ws.iter().zip(&offs).enumerate() {
        wid.push(g.weight(&format!("w{i}"), w.dtype, &w.ne, buf.clone(), o)?);
    }
    let x = g.input("x", DType::F32, x_ne)?;
    let outs = build(&mut g, &wid, x)?;
    for &o in &outs {
        g.set_output(o);
    }
    let nodes: Vec<TensorId> = g.ids().collect();
    let mut alloc = GraphAllocator::new(dev.buffer_type());
    alloc.alloc(&mut g, &nodes)?;
    let xv: Vec<u8> = values(x_ne.iter().product(), 99)
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let xd = g.data_or_err(x)?;
    xd.buffer.set(xd.offset, &xv)?;
    let mut b = dev.new_backend()?;
    for _ in 0..runs {
        b.compute(&g, &nodes)?;
        b.synchronize()?;
    }
    outs.iter()
        .map(|&o| {
            let d = g.data_or_err(o)?;
            let mut bytes = vec![0u8; g.get(o).nbytes()];
            d.buffer.get(d.offset, &mut bytes)?;
            Ok(bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect())
        })
        .collect()
}

/// The suite's error metric (reference first).
pub use tessera_conformance::nmse;

pub fn assert_close(what: &str, want: &[Vec<f32>], got: &[Vec<f32>], tol: f64) {
    assert_eq!(want.len(), got.len());
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        assert!(
            w.iter().any(|&v| v != 0.0),
            "{what}: output {i} is all zeros"
        );
        assert!(
            g.iter().all(|v| v.is_finite()),
            "{what}: output {i} not finite"
        );
        let e = nmse(w, g);
        assert!(e <= tol, "{what}: output {i}: nmse {e:e} > {tol:e}");
    }
}

/// Column-parallel first layer, row-parallel second (partial `y`, summed before the residual
/// add and the norm; `y` is read back too).
pub fn mlp_weights(ratios: &[f64], dtype: DType) -> Vec<W> {
    let (k, m, o) = (64, 96, 64);
    let hidden = tessera::meta::partition_units(m, 32, ratios, "hidden").unwrap();
    vec![
        weight(dtype, [k, m, 1, 1], SplitState::split(1, hidden.clone()), 1),
        weight(dtype, [m, o, 1, 1], SplitState::split(0, hidden), 2),
        weight(DType::F32, [o, 1, 1, 1], SplitState::Mirrored, 3),
    ]
}

pub fn mlp(g: &mut Graph, w: &[TensorId], x: TensorId) -> Result<Vec<TensorId>> {
    let h = g.mul_mat(w[0], x)?;
    let h = g.unary(h, UnaryOp::Silu)?;
    let y = g.mul_mat(w[1], h)?;
    let z = g.add(y, x)?;
    let n = g.rms_norm(z, 1e-5)?;
    let n = g.mul(n, w[2])?;
    Ok(vec![n, y])
}

/// The MLP on `dev` through the scheduler (with the CPU as fallback), run `runs` times with
/// `cols` input columns: the scheduler must keep the whole graph on `dev`, accept the meta
/// device's splits, and give the CPU's result.
pub fn scheduled_mlp_matches_the_cpu(
    dev: &Arc<dyn Device>,
    ratios: &[f64],
    cols: usize,
    runs: usize,
) {
    let ws = mlp_weights(ratios, DType::Q8_0);
    let (buf, offs) = place(dev, &ws).unwrap();
    let mut g = Graph::new();
    let w: Vec<TensorId> = ws
        .iter()
        .zip(&offs)
        .enumerate()
        .map(|(i, (w, &o))| {
            g.weight(&format!("w{i}"), w.dtype, &w.ne, buf.clone(), o)
                .unwrap()
        })
        .collect();
    let x = g.input("x", DType::F32, &[64, cols]).unwrap();
    let outs = mlp(&mut g, &w, x).unwrap();
    g.set_output(outs[0]);
    let mut sched = Scheduler::new(vec![dev.clone(), cpu()]).unwrap();
    let plan = sched.plan(&mut g).unwrap();
    assert_eq!(plan.devices_used(), 1);
    check_plan(sched.devices(), &g, &plan).unwrap();
    let xd = g.data_or_err(x).unwrap();
    let xv: Vec<u8> = values(64 * cols, 99)
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    xd.buffer.set(xd.offset, &xv).unwrap();
    for _ in 0..runs {
        sched.compute(&g, &plan).unwrap();
    }
    let d = g.data_or_err(outs[0]).unwrap();
    let mut got = vec![0u8; 64 * cols * 4];
    d.buffer.get(d.offset, &mut got).unwrap();
    let got: Vec<f32> = got
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let want = eval(&cpu(), &ws, &[64, cols], &mlp, 1).unwrap();
    assert_close("scheduled mlp", &want[..1], &[got], 1e-10);
}
