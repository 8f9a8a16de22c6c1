//! Reading and writing a tensor's elements as f64, by its type, shape and byte strides, from a
//! host copy of the bytes it spans.

use half::{bf16, f16};
use tessera_core::quant::{dequantize_row, quantize_row};
use tessera_core::{DType, Error, Result, Tensor};

/// Index of element (i0, i1, i2, i3) in a contiguous f64 array of shape `ne`.
pub(crate) fn flat(ne: [usize; 4], i0: usize, i1: usize, i2: usize, i3: usize) -> usize {
    i0 + ne[0] * (i1 + ne[1] * (i2 + ne[2] * i3))
}

/// Calls `f(i1, i2, i3, byte offset of the row)` for every row of a tensor.
fn for_rows(t: &Tensor, mut f: impl FnMut(usize, usize, usize, usize) -> Result<()>) -> Result<()> {
    for i3 in 0..t.ne[3] {
        for i2 in 0..t.ne[2] {
            for i1 in 0..t.ne[1] {
                f(i1, i2, i3, i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3])?;
            }
        }
    }
    Ok(())
}

fn slice<'a>(bytes: &'a [u8], at: usize, len: usize, t: &Tensor) -> Result<&'a [u8]> {
    bytes.get(at..at + len).ok_or_else(|| {
        Error::Invalid(format!(
            "{} tensor {:?} reads bytes {at}..{} of a {}-byte span",
            t.dtype,
            t.ne,
            at + len,
            bytes.len()
        ))
    })
}

/// One plain (non-quantized) element at `bytes[0..]`.
fn scalar(dtype: DType, b: &[u8]) -> f64 {
    match dtype {
        DType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        DType::F16 => f16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::BF16 => bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        _ => i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f64,
    }
}

/// Every element of `t`, in logical order, from `bytes` (which start at its element 0).
pub(crate) fn read(t: &Tensor, bytes: &[u8]) -> Result<Vec<f64>> {
    let mut out = Vec::with_capacity(t.nelements());
    if t.dtype.is_quantized() {
        if !t.rows_contiguous() {
            return Err(Error::Invalid(format!(
                "{} tensor with strided rows",
                t.dtype
            )));
        }
        let row_bytes = t.dtype.row_size(t.ne[0])?;
        let mut row = vec![0f32; t.ne[0]];
        for_rows(t, |_, _, _, at| {
            dequantize_row(t.dtype, slice(bytes, at, row_bytes, t)?, &mut row)?;
            out.extend(row.iter().map(|&v| v as f64));
            Ok(())
        })?;
    } else {
        let size = t.dtype.type_size();
        for_rows(t, |_, _, _, at| {
            for i0 in 0..t.ne[0] {
                out.push(scalar(t.dtype, slice(bytes, at + i0 * t.nb[0], size, t)?));
            }
            Ok(())
        })?;
    }
    Ok(out)
}

/// Encodes one row of values into `dst` (exactly the row's bytes, rows contiguous).
pub(crate) fn encode_row(dtype: DType, values: &[f64], dst: &mut [u8]) -> Result<()> {
    match dtype {
        DType::F32 => each(values, dst, |v| (v as f32).to_le_bytes()),
        DType::F16 => each(values, dst, |v| f16::from_f64(v).to_le_bytes()),
        DType::BF16 => each(values, dst, |v| bf16::from_f64(v).to_le_bytes()),
        DType::I32 => each(values, dst, |v| (v as i32).to_le_bytes()),
        DType::I64 => each(values, dst, |v| (v as i64).to_le_bytes()),
        _ => {
            let row: Vec<f32> = values.iter().map(|&v| v as f32).collect();
            return quantize_row(dtype, &row, dst);
        }
    }
    Ok(())
}

fn each<const N: usize>(values: &[f64], dst: &mut [u8], f: impl Fn(f64) -> [u8; N]) {
    for (d, &v) in dst.chunks_exact_mut(N).zip(values) {
        d.copy_from_slice(&f(v));
    }
}

/// Writes every element of `t` (values in logical order) into `bytes` (which start at its
/// element 0); bytes between strided elements are left as they are.
pub(crate) fn write(t: &Tensor, bytes: &mut [u8], values: &[f64]) -> Result<()> {
    if values.len() != t.nelements() {
        return Err(Error::Invalid(format!(
            "{} values for a {:?} tensor",
            values.len(),
            t.ne
        )));
    }
    let n0 = t.ne[0];
    let size = t.dtype.type_size();
    let row_bytes = t.dtype.row_size(n0)?;
    let mut k = 0;
    for_rows(t, |_, _, _, at| {
        let row = &values[k..k + n0];
        k += n0;
        if t.dtype.is_quantized() || t.nb[0] == size {
            let len = bytes.len();
            let dst = bytes
                .get_mut(at..at + row_bytes)
                .ok_or_else(|| span_error(at + row_bytes, len))?;
            return encode_row(t.dtype, row, dst);
        }
        for (i0, &v) in row.iter().enumerate() {
            let p = at + i0 * t.nb[0];
            let len = bytes.len();
            let dst = bytes
                .get_mut(p..p + size)
                .ok_or_else(|| span_error(p + size, len))?;
            encode_row(t.dtype, &[v], dst)?;
        }
        Ok(())
    })
}

fn span_error(end: usize, len: usize) -> Error {
    Error::Invalid(format!("write to byte {end} of a {len}-byte span"))
}
