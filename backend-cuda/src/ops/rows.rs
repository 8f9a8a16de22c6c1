//! get_rows and set_rows (kernels/rows.cu).

use tessera_core::dtype::DType;
use tessera_core::{Result, TensorId};

use super::copy::{quant_readable, quant_supported};
use super::{params, Encoder};

/// Source types get_rows reads.
pub(super) fn gettable(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16 | DType::I32) || quant_readable(d)
}

/// Destination types set_rows writes.
pub(super) fn settable(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16) || quant_supported(d)
}

/// Rows of src0 at the indices in src1.
pub(super) fn get_rows(enc: &mut Encoder, id: TensorId) -> Result<()> {
    let t = enc.graph.get(id);
    let (a, idx) = (t.src[0], t.src[1]);
    let dt = enc.graph.get(a).dtype;
    let d = enc.arg(id)?;
    let p = params(d, &[enc.arg(a)?, enc.arg(idx)?]);
    let name = format!("get_rows_{}", dt.name());
    let mut shape = d.ne;
    if dt.is_quantized() {
        shape[0] /= 32;
    }
    enc.launch_elems("rows", &name, shape, p)
}

/// Rows of src1 written into src0 at the indices in src2.
pub(super) fn set_rows(enc: &mut Encoder, id: TensorId) -> Result<()> {
    let t = enc.graph.get(id);
    let (b, idx) = (t.src[1], t.src[2]);
    let it = enc.graph.get(idx).dtype;
    let d = enc.arg(id)?;
    let s = enc.arg(b)?;
    let p = params(d, &[s, enc.arg(idx)?]);
    let name = format!("set_rows_{}_{}", t.dtype.name(), it.name());
    let mut shape = s.ne;
    shape[0] /= t.dtype.block_size() as i64;
    enc.launch_elems("rows", &name, shape, p)
}
