//! Shared helpers of the GPU tests: finding the device (or skipping with the reason), running
//! a graph on it, host tensors and the error metric.
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

/// i32 values from bytes.
pub fn i32s(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// What the values of a tensor of `dtype` are after a round trip through it.
pub fn rounded(dtype: DType, v: &[f32]) -> Vec<f32> {
    from_bytes(dtype, &to_bytes(dtype, v), v.len())
}

/// Normalised mean squared error sum((a-b)^2) / sum(b^2); NaN anywhere gives infinity.
pub fn nmse(out: &[f32], reference: &[f32]) -> f64 {
    assert_eq!(out.len(), reference.len(), "length");
    let (mut num, mut den) = (0f64, 0f64);
    for (&a, &b) in out.iter().zip(reference) {
        if a.is_nan() || b.is_nan() {
            return f64::INFINITY;
        }
        if a.is_infinite() || b.is_infinite() {
            if a != b {
                return f64::INFINITY;
            }
            continue;
        }
        num += (f64::from(a) - f64::from(b)).powi(2);
        den += f64::from(b).powi(2);
    }
    if den == 0.0 {
        num
    } else {
        num / den
    }
}

/// Asserts an error below a threshold, naming the case.
pub fn check(name: &str, out: &[f32], reference: &[f32], max: f64) {
    let e = nmse(out, reference);
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

/// A host tensor: shape and values in row-major order (ne[0] fastest).
#[derive(Clone, Debug)]
pub struct Host {
    pub ne: [usize; 4],
    pub v: Vec<f32>,
}

impl Host {
    pub fn new(ne: [usize; 4], v: Vec<f32>) -> Host {
        assert_eq!(ne.iter().product::<usize>(), v.len());
        Host { ne, v }
    }
    pub fn random(rng: &mut Rng, ne: [usize; 4], lo: f32, hi: f32) -> Host {
        Host::new(ne, rng.vec(ne.iter().product(), lo, hi))
    }
    pub fn zeros(ne: [usize; 4]) -> Host {
        Host::new(ne, vec![0.0; ne.iter().product()])
    }
    pub fn idx(&self, i: [usize; 4]) -> usize {
        ((i[3] * self.ne[2] + i[2]) * self.ne[1] + i[1]) * self.ne[0] + i[0]
    }
    pub fn get(&self, i: [usize; 4]) -> f32 {
        self.v[self.idx(i)]
    }
    pub fn set(&mut self, i: [usize; 4], x: f32) {
        let k = self.idx(i);
        self.v[k] = x;
    }
    /// Every coordinate, in row-major order.
    pub fn coords(ne: [usize; 4]) -> impl Iterator<Item = [usize; 4]> {
        (0..ne[3]).flat_map(move |i3| {
            (0..ne[2]).flat_map(move |i2| {
                (0..ne[1]).flat_map(move |i1| (0..ne[0]).map(move |i0| [i0, i1, i2, i3]))
            })
        })
    }
    /// ggml's permute: axis i moves to position axes[i].
    pub fn permute(&self, axes: [usize; 4]) -> Host {
        let mut ne = [0; 4];
        for i in 0..4 {
            ne[axes[i]] = self.ne[i];
        }
        let mut out = Host::zeros(ne);
        for c in Host::coords(self.ne) {
            let mut d = [0; 4];
            for i in 0..4 {
                d[axes[i]] = c[i];
            }
            out.set(d, self.get(c));
        }
        out
    }
}
