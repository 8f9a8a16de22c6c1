//! The suite must be able to fail: devices that corrupt an output value, write past a tensor,
//! leave the poisoned output alone, modify an input, or cannot run an op are wrapped around a
//! working device (the CPU backend, and the f64 reference) and every case they touch must fail
//! (or be skipped, for the unsupported ones) — never pass.

use std::any::Any;
use std::sync::Arc;

use tessera_conformance::{
    test, CaseResult, Filter, Options, RefDevice, Reference, Status, Summary,
};
use tessera_core::{
    Backend, Buffer, BufferType, DType, Device, DeviceKind, Error, Graph, Memory, Op, Result,
    TensorId,
};
use tessera_cpu::CpuDevice;

/// What the faulty device does wrong.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    /// Changes one element of the result.
    CorruptOne,
    /// Writes one byte just past the end of the result.
    WritePast,
    /// Computes nothing.
    NoCompute,
    /// Changes one byte of the first input.
    TouchInput,
    /// Says it does not support mul_mat.
    NoMulMat,
    /// Returns `Error::Unsupported` from compute.
    ComputeUnsupported,
}

struct Faulty {
    inner: Arc<dyn Device>,
    fault: Fault,
}

impl Device for Faulty {
    fn name(&self) -> String {
        format!("faulty({:?})", self.fault)
    }
    fn description(&self) -> String {
        self.name()
    }
    fn kind(&self) -> DeviceKind {
        self.inner.kind()
    }
    fn memory(&self) -> Memory {
        self.inner.memory()
    }
    fn buffer_type(&self) -> Arc<dyn BufferType> {
        self.inner.buffer_type()
    }
    fn new_backend(&self) -> Result<Box<dyn Backend>> {
        Ok(Box::new(FaultyBackend {
            inner: self.inner.new_backend()?,
            fault: self.fault,
        }))
    }
    fn supports_op(&self, graph: &Graph, id: TensorId) -> bool {
        !(self.fault == Fault::NoMulMat && graph.get(id).op == Op::MulMat)
            && self.inner.supports_op(graph, id)
    }
    fn can_use_buffer(&self, buffer: &dyn Buffer) -> bool {
        self.inner.can_use_buffer(buffer)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct FaultyBackend {
    inner: Box<dyn Backend>,
    fault: Fault,
}

impl Backend for FaultyBackend {
    fn name(&self) -> String {
        "faulty".into()
    }

    fn compute(&mut self, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
        match self.fault {
            Fault::NoCompute => return Ok(()),
            Fault::ComputeUnsupported => {
                return Err(Error::Unsupported {
                    backend: "faulty".into(),
                    what: "everything".into(),
                })
            }
            _ => {}
        }
        self.inner.compute(graph, nodes)?;
        self.inner.synchronize()?;
        let last = *nodes.last().expect("a case has nodes");
        let t = graph.get(last);
        let d = graph.data_or_err(last)?;
        match self.fault {
            Fault::CorruptOne => {
                let mut b = vec![0u8; t.dtype.type_size()];
                d.buffer.get(d.offset, &mut b)?;
                match t.dtype {
                    DType::F32 => {
                        let x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                        b.copy_from_slice(&(x + 100.0).to_le_bytes());
                    }
                    DType::F16 => b.copy_from_slice(&half::f16::from_f32(100.0).to_le_bytes()),
                    DType::BF16 => b.copy_from_slice(&half::bf16::from_f32(100.0).to_le_bytes()),
                    DType::I32 => {
                        let x = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                        b.copy_from_slice(&(x + 1).to_le_bytes());
                    }
                    // The high byte of a block's f16 scale: the whole block is rescaled.
                    _ => b[1] ^= 0x40,
                }
                d.buffer.set(d.offset, &b)
            }
            Fault::WritePast => d.buffer.set(d.offset + t.nbytes(), &[0x5A]),
            Fault::TouchInput => {
                // An input the graph does not write (not the destination of a cpy or set_rows).
                let out_root = graph.root(last).0;
                let leaf = graph
                    .ids()
                    .find(|&id| graph.get(id).op == Op::None && id != out_root)
                    .expect("a case has inputs");
                let ld = graph.data_or_err(leaf)?;
                let mut b = [0u8];
                ld.buffer.get(ld.offset, &mut b)?;
                ld.buffer.set(ld.offset, &[b[0] ^ 0x10])
            }
            _ => Ok(()),
        }
    }

    fn synchronize(&mut self) -> Result<()> {
        self.inner.synchronize()
    }
}

/// A sample of cases over many ops and output types.
fn sample() -> Options {
    let mut filter =
        Filter::ops("ADD,MUL_MAT,SOFT_MAX,ARGMAX,CPY,GET_ROWS,SET_ROWS,ROPE,FLASH_ATTN_EXT,RMS_NORM,CONT,SUM,GELU");
    filter.skip_large = true;
    Options {
        filter,
        ..Options::default()
    }
}

fn run(inner: Arc<dyn Device>, fault: Fault) -> Summary {
    let dev: Arc<dyn Device> = Arc::new(Faulty { inner, fault });
    test(&dev, &Reference::F64, &sample(), &mut |_| {})
}

fn inners() -> Vec<Arc<dyn Device>> {
    vec![Arc::new(CpuDevice::new()), Arc::new(RefDevice)]
}

/// Every case that ran must have failed, with a reason containing one of `why`.
fn assert_all_fail(s: &Summary, why: &[&str]) {
    assert!(
        s.results.len() > 100,
        "only {} cases sampled",
        s.results.len()
    );
    let bad: Vec<&CaseResult> = s
        .results
        .iter()
        .filter(|r| match &r.status {
            Status::Failed(reason) => !why.iter().any(|w| reason.contains(w)),
            _ => true,
        })
        .collect();
    assert!(
        bad.is_empty(),
        "{} of {} cases did not fail as expected, e.g. {}",
        bad.len(),
        s.results.len(),
        bad[0]
    );
}

#[test]
fn a_corrupted_value_fails() {
    for inner in inners() {
        assert_all_fail(
            &run(inner, Fault::CorruptOne),
            &["NMSE", "differs", "NaN", "inf"],
        );
    }
}

#[test]
fn a_write_past_a_tensor_fails() {
    for inner in inners() {
        // In a strided destination the byte past the view is in its root, between rows.
        assert_all_fail(
            &run(inner, Fault::WritePast),
            &["past the end", "outside the destination view"],
        );
    }
}

#[test]
fn an_untouched_poisoned_output_fails() {
    for inner in inners() {
        // Poison decodes to NaN in most types, to infinities in some (MXFP4's scale).
        assert_all_fail(
            &run(inner, Fault::NoCompute),
            &["NaN", "inf mismatch", "differs", "NMSE"],
        );
    }
}

#[test]
fn a_modified_input_fails() {
    for inner in inners() {
        assert_all_fail(&run(inner, Fault::TouchInput), &["was modified"]);
    }
}

#[test]
fn unsupported_cases_are_skipped_never_passed() {
    let s = run(Arc::new(RefDevice), Fault::NoMulMat);
    for r in &s.results {
        match (&r.status, r.op.as_str()) {
            (Status::Skipped(why), "MUL_MAT") => {
                assert!(why.contains("does not support MUL_MAT"), "{r}")
            }
            (Status::Passed, op) => assert_ne!(op, "MUL_MAT", "{r}"),
            _ => panic!("unexpected {r}"),
        }
    }
    let s = run(Arc::new(RefDevice), Fault::ComputeUnsupported);
    assert_eq!(s.skipped(), s.results.len(), "{}", s.totals());
    let s = Summary::absent("cuda:0", "no CUDA driver");
    assert_eq!((s.passed(), s.failed(), s.skipped()), (0, 0, 1));
    assert!(s.to_string().ends_with("0 passed, 0 failed, 1 skipped\n"));
}

#[test]
fn the_reference_agrees_with_itself_exactly() {
    let dev: Arc<dyn Device> = Arc::new(RefDevice);
    let s = test(&dev, &Reference::F64, &sample(), &mut |_| {});
    assert_eq!(s.failed(), 0, "{}", s.totals());
    assert!(s.results.iter().all(|r| r.nmse == Some(0.0)), "{s}");
}
