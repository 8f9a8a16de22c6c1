//! The f64 reference: an independent, plain implementation of every op, written as a
//! [`Device`] over host memory so that the runner treats it like any backend.
//!
//! Each op reads its sources as f64 through their strides (quantized sources dequantized with
//! `tessera_core::quant::dequantize_row`), computes in f64 with plain loops, and stores the
//! result in the result's type, as a backend does; no effort is spent on speed. One file per op
//! family.

mod attn;
mod buffer;
mod copy;
mod elementwise;
mod io;
mod matmul;
mod moe;
mod norm;
mod reduce;
mod rope;
mod rows;
mod shape;
mod softmax;
mod sort;

use std::any::Any;
use std::sync::Arc;

use tessera_core::{
    Backend, Buffer, BufferType, Device, DeviceKind, Error, Graph, Memory, Op, Result, TensorId,
};

use buffer::{HostBuffer, HostBufferType};

/// The f64 reference device (`ref-f64`).
#[derive(Clone, Copy, Debug, Default)]
pub struct RefDevice;

impl Device for RefDevice {
    fn name(&self) -> String {
        "ref-f64".into()
    }
    fn description(&self) -> String {
        "tessera-conformance f64 reference implementation".into()
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cpu
    }
    fn memory(&self) -> Memory {
        Memory::default()
    }
    fn buffer_type(&self) -> Arc<dyn BufferType> {
        Arc::new(HostBufferType)
    }
    fn new_backend(&self) -> Result<Box<dyn Backend>> {
        Ok(Box::new(RefBackend))
    }
    fn supports_op(&self, _graph: &Graph, _id: TensorId) -> bool {
        true
    }
    fn can_use_buffer(&self, buffer: &dyn Buffer) -> bool {
        buffer.as_any().is::<HostBuffer>()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The reference's stream: computes synchronously.
struct RefBackend;

impl Backend for RefBackend {
    fn name(&self) -> String {
        "ref-f64".into()
    }

    fn compute(&mut self, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
        for &id in nodes {
            let op = &graph.get(id).op;
            if *op != Op::None && !op.is_view() {
                eval(graph, id)?;
            }
        }
        Ok(())
    }

    fn synchronize(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Computes node `id`.
fn eval(g: &Graph, id: TensorId) -> Result<()> {
    match &g.get(id).op {
        Op::Cpy | Op::Cont | Op::Dup => copy::copy(g, id),
        Op::GetRows => rows::get_rows(g, id),
        Op::SetRows => rows::set_rows(g, id),
        Op::MulMat => matmul::mul_mat(g, id),
        Op::MulMatId { first } => moe::mul_mat_id(g, id, *first),
        Op::AddId => moe::add_id(g, id),
        Op::Binary(op) => elementwise::binary(g, id, *op),
        Op::Scale { scale, bias } => elementwise::map(g, id, |x| x * *scale as f64 + *bias as f64),
        Op::Unary(op) => elementwise::map(g, id, |x| elementwise::unary(*op, x)),
        Op::Clamp { min, max } => elementwise::map(g, id, |x| x.clamp(*min as f64, *max as f64)),
        Op::Glu { op, swapped } => elementwise::glu(g, id, *op, *swapped),
        Op::SwigluOai { alpha, limit } => {
            elementwise::swiglu_oai(g, id, *alpha as f64, *limit as f64)
        }
        Op::RmsNorm { eps } => norm::rms_norm(g, id, *eps as f64),
        Op::Norm { eps } => norm::norm(g, id, *eps as f64),
        Op::SoftMax { scale, max_bias } => {
            softmax::soft_max(g, id, *scale as f64, *max_bias as f64)
        }
        Op::DiagMaskInf(n_past) => softmax::diag_mask_inf(g, id, *n_past),
        Op::Rope(p) => rope::rope(g, id, p),
        Op::FlashAttnExt {
            scale,
            max_bias,
            logit_softcap,
            sinks,
        } => attn::flash_attn_ext(
            g,
            id,
            *scale as f64,
            *max_bias as f64,
            *logit_softcap as f64,
            *sinks,
        ),
        Op::Concat(dim) => shape::concat(g, id, *dim),
        Op::Repeat => shape::repeat(g, id),
        Op::Pad(_) => shape::pad(g, id),
        Op::Arange { start, step, .. } => shape::arange(g, id, *start as f64, *step as f64),
        Op::Sum => reduce::sum(g, id),
        Op::SumRows => reduce::rows(g, id, |row| row.iter().sum()),
        Op::Mean => reduce::rows(g, id, |row| {
            row.iter().sum::<f64>() / row.len().max(1) as f64
        }),
        Op::Argmax => reduce::argmax(g, id),
        Op::Argsort { descending } => sort::sorted(g, id, *descending),
        Op::TopK(_) => sort::sorted(g, id, true),
        op => Err(Error::Unsupported {
            backend: "ref-f64".into(),
            what: op.name().into(),
        }),
    }
}
