//! cpy, cont and dup: copies with type conversion (kernels/copy.cu; into and out of the block
//! types kernels/quantize.cu).

use tessera_core::dtype::DType;
use tessera_core::{Result, Tensor, TensorId};

use super::{flat4, params, Encoder};
use crate::cmd::{Cmd, TArg};

/// Quantized types the GPU reads (get_rows, mul_mat, cpy to f32) and writes (cpy from the
/// float types, set_rows).
pub(super) fn quant_supported(d: DType) -> bool {
    matches!(
        d,
        DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::Q2_K
            | DType::Q3_K
            | DType::Q4_K
            | DType::Q5_K
            | DType::Q6_K
    )
}

/// Quantized types the GPU reads but does not write: the i-quants, ternary types and MXFP4
/// (get_rows, cpy to f32, and mul_mat through dequantization to f16 and the GEMM).
pub(super) fn quant_readable(d: DType) -> bool {
    quant_supported(d) || DType::QUANTIZED_IQ.contains(&d)
}

/// Whether copying `a` into `d` (the result's type and layout) is implemented.
pub(super) fn supported(a: &Tensor, d: &Tensor) -> bool {
    let same_shape = a.ne == d.ne;
    if a.dtype == d.dtype {
        return !a.dtype.is_quantized() || (a.rows_contiguous() && d.rows_contiguous());
    }
    if a.dtype.is_float() && d.dtype.is_float() {
        return true;
    }
    if a.dtype.is_float() && quant_supported(d.dtype) {
        return d.is_contiguous() && (same_shape || a.is_contiguous());
    }
    if quant_readable(a.dtype) && d.dtype == DType::F32 {
        return a.rows_contiguous() && (same_shape || d.is_contiguous());
    }
    false
}

/// A quantized tensor described as rows of bytes (for same-type copies).
fn as_bytes(t: &Tensor, mut a: TArg) -> TArg {
    a.ne[0] = t.row_bytes() as i64;
    a.nb[0] = 1;
    a
}

/// Encodes a copy of `src` into `dst` (dst is the node for cont/dup, the view of src1 for cpy).
pub(super) fn copy(enc: &mut Encoder, id: TensorId) -> Result<()> {
    let t = enc.graph.get(id);
    let src = t.src[0];
    let s = enc.graph.get(src);
    let (sa, da) = (enc.arg(src)?, enc.arg(id)?);
    let same_shape = s.ne == t.ne;
    // A dense copy of the same type is one memcpy.
    if s.dtype == t.dtype && s.is_contiguous() && t.is_contiguous() {
        let len = t.nbytes();
        if len > 0 && sa.ptr != da.ptr {
            enc.cmds.push(Cmd::Copy {
                dst: da.ptr,
                src: sa.ptr,
                len,
            });
        }
        return Ok(());
    }
    if s.dtype == t.dtype {
        let (sa, da) = if s.dtype.is_quantized() {
            (as_bytes(s, sa), as_bytes(t, da))
        } else {
            (sa, da)
        };
        let size = if s.dtype.is_quantized() {
            1
        } else {
            s.dtype.type_size()
        };
        let mut p = params(da, &[sa]);
        p.i[0] = i32::from(sa.ne == da.ne);
        let name = format!("cpy_raw{size}");
        return launch_copy(enc, &name, p);
    }
    let mut p = params(da, &[sa]);
    p.i[0] = i32::from(same_shape);
    if s.dtype.is_float() && t.dtype.is_float() {
        return launch_copy(
            enc,
            &format!("cpy_{}_{}", s.dtype.name(), t.dtype.name()),
            p,
        );
    }
    if t.dtype.is_quantized() {
        let blocks = (t.nelements() / t.dtype.block_size()) as i64;
        return enc.launch_flat(
            "quantize",
            &format!("quantize_{}_{}", t.dtype.name(), s.dtype.name()),
            blocks,
            p,
        );
    }
    // What is left (checked by `supported`): a quantized source into f32.
    enc.launch_flat(
        "quantize",
        &format!("dequantize_{}", s.dtype.name()),
        (s.nelements() / 32) as i64,
        p,
    )
}

/// Launches a cpy kernel: by coordinates over the destination when shapes match, else flat.
fn launch_copy(enc: &mut Encoder, name: &str, p: crate::cmd::KParams) -> Result<()> {
    if p.i[0] == 1 {
        enc.launch_elems("copy", name, p.t[0].ne, p)
    } else {
        let n: i64 = p.t[0].ne.iter().product();
        enc.launch_flat("copy", name, n, p)
    }
}

/// Converts `src` (any float type, any strides) into a contiguous tensor of type `to` in
/// scratch memory; returns the new view.
pub(super) fn to_contiguous(enc: &mut Encoder, src: TArg, from: DType, to: DType) -> Result<TArg> {
    if let Some((s, d, end)) = enc.f16 {
        if to == DType::F16 && s == src {
            enc.node_scratch = enc.node_scratch.max(end);
            return Ok(d);
        }
    }
    let n: i64 = src.ne.iter().product();
    let size = to.type_size() as i64;
    let ptr = enc.scratch((n * size) as usize);
    let mut d = TArg {
        ptr,
        ne: src.ne,
        nb: [0; 4],
    };
    d.nb[0] = size;
    for i in 1..4 {
        d.nb[i] = d.nb[i - 1] * d.ne[i - 1];
    }
    let mut p = params(d, &[src]);
    p.i[0] = 1;
    if from == DType::F32 && matches!(to, DType::F16 | DType::BF16) && flat4(&src, 4) {
        enc.launch_flat("copy", &format!("cpy_flat_f32_{}", to.name()), n / 4, p)?;
    } else {
        enc.launch_elems(
            "copy",
            &format!("cpy_{}_{}", from.name(), to.name()),
            d.ne,
            p,
        )?;
    }
    if to == DType::F16 {
        enc.f16 = Some((src, d, enc.node_scratch));
    }
    Ok(d)
}
