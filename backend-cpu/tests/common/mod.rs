//! A small harness for the backend's tests: build a graph, give its inputs values, run it on a
//! CPU backend, read results back as f32.

#![allow(dead_code)]

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera_core::alloc::GraphAllocator;
use tessera_core::quant::{dequantize_row, quantize_row};
use tessera_core::{Backend, DType, Graph, Result, TensorId};
use tessera_cpu::{CpuBackend, CpuBufferType};

/// A graph under test and the bytes of its inputs.
#[derive(Default)]
pub struct Case {
    pub g: Graph,
    inputs: Vec<(TensorId, Vec<u8>)>,
}

impl Case {
    pub fn new() -> Self {
        Self::default()
    }

    /// An input of `dtype` holding `vals` (converted row by row, quantized if need be).
    pub fn input(&mut self, dtype: DType, ne: &[usize], vals: &[f32]) -> TensorId {
        let id = self
            .g
            .input(&format!("in{}", self.inputs.len()), dtype, ne)
            .unwrap();
        let n0 = ne[0];
        let row = dtype.row_size(n0).unwrap();
        let mut bytes = vec![0u8; vals.len() / n0 * row];
        for (v, b) in vals.chunks(n0).zip(bytes.chunks_mut(row)) {
            quantize_row(dtype, v, b).unwrap();
        }
        self.inputs.push((id, bytes));
        id
    }

    /// An I32 input.
    pub fn ints(&mut self, ne: &[usize], vals: &[i32]) -> TensorId {
        let id = self
            .g
            .input(&format!("in{}", self.inputs.len()), DType::I32, ne)
            .unwrap();
        self.inputs
            .push((id, vals.iter().flat_map(|v| v.to_le_bytes()).collect()));
        id
    }

    /// An I64 input.
    pub fn longs(&mut self, ne: &[usize], vals: &[i64]) -> TensorId {
        let id = self
            .g
            .input(&format!("in{}", self.inputs.len()), DType::I64, ne)
            .unwrap();
        self.inputs
            .push((id, vals.iter().flat_map(|v| v.to_le_bytes()).collect()));
        id
    }

    /// Allocates, sets the inputs, runs every node on `backend`; returns the raw bytes of `outs`.
    pub fn run_on(&mut self, backend: &mut CpuBackend, outs: &[TensorId]) -> Result<Vec<Vec<u8>>> {
        for &o in outs {
            let (root, _) = self.g.root(o);
            self.g.set_output(root);
        }
        let ids: Vec<TensorId> = self.g.ids().collect();
        let mut alloc = GraphAllocator::new(Arc::new(CpuBufferType));
        alloc.alloc(&mut self.g, &ids)?;
        for (id, bytes) in &self.inputs {
            let d = self.g.data(*id).unwrap();
            d.buffer.set(d.offset, bytes)?;
        }
        backend.compute(&self.g, &ids)?;
        Ok(outs
            .iter()
            .map(|&o| {
                let t = self.g.get(o);
                let d = self.g.data(o).unwrap();
                let mut b = vec![0u8; t.nbytes()];
                d.buffer.get(d.offset, &mut b).unwrap();
                b
            })
            .collect())
    }

    /// Runs on a fresh two-thread backend and returns `outs` as f32.
    pub fn run(&mut self, outs: &[TensorId]) -> Result<Vec<Vec<f32>>> {
        let mut backend = CpuBackend::new(2, false)?;
        self.run_f32(&mut backend, outs)
    }

    /// Runs on `backend` and returns `outs` (contiguous) as f32.
    pub fn run_f32(
        &mut self,
        backend: &mut CpuBackend,
        outs: &[TensorId],
    ) -> Result<Vec<Vec<f32>>> {
        let bytes = self.run_on(backend, outs)?;
        Ok(outs
            .iter()
            .zip(bytes)
            .map(|(&o, b)| {
                let t = self.g.get(o);
                let mut v = vec![0f32; t.nelements()];
                let row = t.dtype.row_size(t.ne[0]).unwrap();
                for (r, out) in b.chunks(row).zip(v.chunks_mut(t.ne[0])) {
                    dequantize_row(t.dtype, r, out).unwrap();
                }
                v
            })
            .collect())
    }
}

/// `n` values uniform in [-1, 1).
pub fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

/// Normalised mean squared error sum((a-b)^2) / sum(b^2) against the reference `b`.
pub fn nmse(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
        .sum();
    let den: f64 = b.iter().map(|&y| f64::from(y).powi(2)).sum();
    num / den
}

/// Asserts `a` and `b` agree elementwise within `tol`.
pub fn assert_close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol, "element {i}: {x} vs {y}");
    }
}

/// The values of a row quantized to `dtype` and back.
pub fn round_trip(dtype: DType, v: &[f32]) -> Vec<f32> {
    let mut b = vec![0u8; dtype.row_size(v.len()).unwrap()];
    quantize_row(dtype, v, &mut b).unwrap();
    let mut out = vec![0f32; v.len()];
    dequantize_row(dtype, &b, &mut out).unwrap();
    out
}
