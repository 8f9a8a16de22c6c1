//! Shared helpers of the GPU tests: finding the device (or skipping with the reason), running
//! a graph on it, and host values; the error metric is the conformance suite's
//! ([`tessera_conformance::nmse`]).
#![allow(dead_code)]

use std::sync::Arc;

use tessera_core::alloc::GraphAllocator;
use tessera_core::dtype::DType;
use tessera_core::quant::{dequantize_row, quantize_row};
use tessera_core::{Backend, BackendReg, Device, Graph, Op, TensorId};
use tessera_cuda::{CudaBackend, CudaBackendReg, CudaDevice};

/// The first CUDA device, or `None` after printing why the test is skipped.
pub fn cuda() -> Option<Arc<dyn Device>> {
    static WARM: std::sync::Once = std::sync::Once::new();
    match CudaBackendReg::new().devices() {
        Ok(d) if !d.is_empty() => {
            WARM.call_once(|| {
                let t = std::time::Instant::now();
                d[0].prepare(&mut |_, _| {}).expect("kernels compile");
                eprintln!("kernels ready in {:.2} s", t.elapsed().as_secs_f64());
            });
            Some(d[0].clone())
        }
        Ok(_) => {
            eprintln!("skipped: no CUDA devices");
            None
        }
        Err(why) => {
            eprintln!("skipped: {why}");
            None
        }
    }
}

/// The concrete device behind a `dyn Device`.
pub fn concrete(d: &Arc<dyn Device>) -> &CudaDevice {
    d.as_any()
        .downcast_ref::<CudaDevice>()
        .expect("a CUDA device")
}

/// A small deterministic random source (xorshift64*).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}

/// Values stored as `dtype` (a whole number of blocks).
pub fn to_bytes(dtype: DType, v: &[f32]) -> Vec<u8> {
    if dtype == DType::I32 {
        return v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect();
    }
    let mut out = vec![0u8; dtype.row_size(v.len()).unwrap()];
    quantize_row(dtype, v, &mut out).unwrap();
    out
}

/// `n` values of `dtype` read back as f32.
pub fn from_bytes(dtype: DType, b: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    dequantize_row(dtype, &b[..dtype.row_size(n).unwrap()], &mut out).unwrap();
    out
}

/// What the values of a tensor of `dtype` are after a round trip through it.
pub fn rounded(dtype: DType, v: &[f32]) -> Vec<f32> {
    from_bytes(dtype, &to_bytes(dtype, v), v.len())
}

/// Asserts an error below a threshold, naming the case.
pub fn check(name: &str, out: &[f32], reference: &[f32], max: f64) {
    let e = tessera_conformance::nmse(reference, out);
    assert!(
        e <= max,
        "{name}: NMSE {e:e} > {max:e}\n  out[..8] {:?}\n  ref[..8] {:?}",
        &out[..out.len().min(8)],
        &reference[..reference.len().min(8)]
    );
    println!("ok {name}: NMSE {e:.2e}");
}

/// Runs every node of `g` on the device with the given input bytes and returns the bytes of
/// each output (inputs must have been made with `Graph::input`).
pub fn run(
    dev: &Arc<dyn Device>,
    be: &mut CudaBackend,
    g: &mut Graph,
    inputs: &[(TensorId, Vec<u8>)],
    outputs: &[TensorId],
) -> Vec<Vec<u8>> {
    for &o in outputs {
        g.set_output(o);
    }
    let nodes: Vec<TensorId> = g.ids().collect();
    let mut alloc = GraphAllocator::new(dev.buffer_type());
    alloc.alloc(g, &nodes).expect("allocate");
    set_inputs(g, inputs);
    be.compute(g, &running_nodes(g)).expect("compute");
    be.synchronize().expect("synchronize");
    read(g, outputs)
}

/// The nodes a scheduler hands a backend: every node but leaves and views (which run nothing).
pub fn running_nodes(g: &Graph) -> Vec<TensorId> {
    g.ids()
        .filter(|&id| {
            let op = &g.get(id).op;
            *op != Op::None && !op.is_view()
        })
        .collect()
}

/// Writes input bytes into their tensors.
pub fn set_inputs(g: &Graph, inputs: &[(TensorId, Vec<u8>)]) {
    for (id, bytes) in inputs {
        let d = g.data(*id).expect("input memory");
        d.buffer.set(d.offset, bytes).expect("set input");
    }
}

/// Reads the bytes of tensors (their whole span).
pub fn read(g: &Graph, ids: &[TensorId]) -> Vec<Vec<u8>> {
    ids.iter()
        .map(|&o| {
            let d = g.data(o).expect("output memory");
            let mut out = vec![0u8; g.get(o).nbytes()];
            d.buffer.get(d.offset, &mut out).expect("get output");
            out
        })
        .collect()
}
