//! [`TView`]: a tensor's host bytes seen through its type, shape `ne` and byte strides `nb`.
//!
//! # Safety
//!
//! [`TView::new`] resolves a tensor's memory, refuses memory the CPU cannot reach and checks
//! that every byte the tensor's `ne`/`nb` can touch lies inside its buffer. After that, any
//! element whose indices are below `ne` is in bounds, which the accessors assert. The pointer
//! stays valid while the graph (which holds the buffer's `Arc`) is borrowed by `compute`.
//!
//! Ops read a source row into scratch memory before they write the same row of the result,
//! and different threads always work on different result rows. That is what makes the in-place
//! ops the graph allocator plans (`dst` sharing `src0`'s memory, same layout) correct: a row
//! is never borrowed for reading while it is written.

use half::f16;
use half::slice::HalfFloatSliceExt;
use tessera_core::graph::Graph;
use tessera_core::quant::dequantize_row;
use tessera_core::{DType, Error, Result, TensorId};

use crate::buffer::CpuBuffer;
use crate::quant::quantize_row;

/// A tensor's bytes in host memory, with its type and layout.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TView {
    /// Element type.
    pub dtype: DType,
    /// Elements along each axis.
    pub ne: [usize; 4],
    /// Byte stride of each axis.
    pub nb: [usize; 4],
    base: *mut u8,
    span: usize,
}

// SAFETY: a TView is a raw window into a buffer that outlives the compute call; which thread
// touches which bytes follows the rules in the module documentation.
unsafe impl Send for TView {}
// SAFETY: as for `Send`.
unsafe impl Sync for TView {}

impl TView {
    /// The memory of tensor `id` of `graph`; `write`: the op writes it (so it must not be a
    /// read-only buffer).
    pub fn new(graph: &Graph, id: TensorId, write: bool) -> Result<Self> {
        if id.index() >= graph.len() {
            return Err(Error::Invalid(format!(
                "tensor #{} is not in the graph",
                id.0
            )));
        }
        let t = graph.get(id);
        let data = graph.data_or_err(id)?;
        let buf = &data.buffer;
        let Some(ptr) = buf.host_ptr() else {
            return Err(Error::Unsupported {
                backend: "cpu".into(),
                what: format!(
                    "tensor '{}' in buffer {}, which is not host memory",
                    t.label(id),
                    buf.name()
                ),
            });
        };
        if write
            && buf
                .as_any()
                .downcast_ref::<CpuBuffer>()
                .is_some_and(CpuBuffer::is_read_only)
        {
            return Err(Error::Buffer {
                buffer: buf.name(),
                reason: format!(
                    "tensor '{}' would be written, but the buffer is read-only",
                    t.label(id)
                ),
            });
        }
        let span = t.nbytes();
        buf.check_range(data.offset, span)?;
        // SAFETY: offset + span lies inside the buffer, checked just above.
        let base = unsafe { ptr.add(data.offset) };
        Ok(TView {
            dtype: t.dtype,
            ne: t.ne,
            nb: t.nb,
            base,
            span,
        })
    }

    /// Rows (ne1 * ne2 * ne3).
    pub fn nrows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    /// The (i1, i2, i3) of flat row `r` (row-major over ne1, ne2, ne3).
    pub fn row_index(&self, r: usize) -> [usize; 3] {
        let i1 = r % self.ne[1];
        let i2 = (r / self.ne[1]) % self.ne[2];
        let i3 = r / (self.ne[1] * self.ne[2]);
        [i1, i2, i3]
    }

    /// Byte offset of row (i1, i2, i3).
    fn row_offset(&self, [i1, i2, i3]: [usize; 3]) -> usize {
        i1 * self.nb[1] + i2 * self.nb[2] + i3 * self.nb[3]
    }

    /// Byte offset of element (i0, i1, i2, i3) (i0 a block start for quantized types).
    fn offset(&self, [i0, i1, i2, i3]: [usize; 4]) -> usize {
        // Plain types (the per-element accesses) skip the division.
        let bs = self.dtype.block_size();
        let b0 = if bs == 1 { i0 } else { i0 / bs };
        b0 * self.nb[0] + self.row_offset([i1, i2, i3])
    }

    /// Bytes of a contiguous row.
    fn row_len(&self) -> usize {
        self.ne[0] / self.dtype.block_size() * self.dtype.type_size()
    }

    /// Whether each row's elements (or blocks) are adjacent.
    pub fn rows_contiguous(&self) -> bool {
        self.nb[0] == self.dtype.type_size()
    }

    /// The address of the `len` bytes at `off`, checked against the tensor's span.
    fn at(&self, off: usize, len: usize) -> *mut u8 {
        assert!(
            off + len <= self.span,
            "tensor access {off}+{len} past its {} bytes",
            self.span
        );
        // SAFETY: inside the span checked against the buffer in `new`.
        unsafe { self.base.add(off) }
    }

    /// The bytes of row (i1, i2, i3); the rows must be contiguous.
    pub fn row(&self, i: [usize; 3]) -> &[u8] {
        debug_assert!(self.rows_contiguous());
        let len = self.row_len();
        // SAFETY: `at` checked the range; see the module rules on aliasing.
        unsafe { std::slice::from_raw_parts(self.at(self.row_offset(i), len), len) }
    }

    /// Row (i1, i2, i3) as mutable bytes; the rows must be contiguous and the view was made for
    /// writing. The caller is the only one touching this row (module rules).
    #[allow(clippy::mut_from_ref)]
    fn row_mut(&self, i: [usize; 3]) -> &mut [u8] {
        debug_assert!(self.rows_contiguous());
        let len = self.row_len();
        // SAFETY: `at` checked the range; see the module rules on aliasing.
        unsafe { std::slice::from_raw_parts_mut(self.at(self.row_offset(i), len), len) }
    }

    /// Converts row (i1, i2, i3) to f32 into `out` (ne0 values), following nb0 for plain types.
    pub fn load_row(&self, i: [usize; 3], out: &mut [f32]) -> Result<()> {
        if self.rows_contiguous() {
            return row_to_f32(self.dtype, self.row(i), out);
        }
        let base = self.row_offset(i);
        for (i0, o) in out.iter_mut().enumerate() {
            *o = self.read_plain(base + i0 * self.nb[0]);
        }
        Ok(())
    }

    /// Converts `vals` (ne0 values) to the tensor's type into row (i1, i2, i3).
    pub fn store_row(&self, i: [usize; 3], vals: &[f32]) -> Result<()> {
        if self.rows_contiguous() {
            return quantize_row(self.dtype, vals, self.row_mut(i));
        }
        let base = self.row_offset(i);
        for (i0, &v) in vals.iter().enumerate() {
            self.write_plain(base + i0 * self.nb[0], v);
        }
        Ok(())
    }

    /// Copies row `from` of `src` into row `to` of this tensor byte for byte; both have
    /// contiguous rows of the same byte length.
    pub fn copy_row_from(&self, to: [usize; 3], src: &TView, from: [usize; 3]) {
        let len = self.row_len();
        assert!(self.rows_contiguous() && src.rows_contiguous() && src.row_len() == len);
        let d = self.at(self.row_offset(to), len);
        let s = src.at(src.row_offset(from), len);
        // SAFETY: both ranges were checked by `at`; `copy` tolerates overlap.
        unsafe { std::ptr::copy(s, d, len) };
    }

    /// Copies the raw bytes of element or block `i` into `out` (type_size bytes).
    pub fn read_unit(&self, i: [usize; 4], out: &mut [u8]) {
        let ts = self.dtype.type_size();
        let p = self.at(self.offset(i), ts);
        // SAFETY: `at` checked the range; `out` is scratch memory of another allocation.
        unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), ts.min(out.len())) };
    }

    /// Writes the raw bytes of element or block `i` from `bytes` (type_size bytes).
    pub fn write_unit(&self, i: [usize; 4], bytes: &[u8]) {
        let ts = self.dtype.type_size();
        let p = self.at(self.offset(i), ts);
        // SAFETY: as in `read_unit`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, ts.min(bytes.len())) };
    }

    /// Element `i` of a plain type, as f32.
    pub fn get(&self, i: [usize; 4]) -> f32 {
        self.read_plain(self.offset(i))
    }

    /// Stores `v` as element `i` of a plain type.
    pub fn set(&self, i: [usize; 4], v: f32) {
        self.write_plain(self.offset(i), v)
    }

    /// Stores `vals` as elements `i0`, `i0 + 1`, ... of row (i1, i2, i3): with one range check
    /// and plain stores when the row holds adjacent F32 values, element by element otherwise.
    /// The run's length is a constant, so that the stores compile to a fixed-size copy rather
    /// than a call to `memcpy`. Inlined, so that the values go from registers to the result
    /// without a round trip through the stack (whose narrow stores a wide load cannot forward).
    #[inline]
    pub fn set_run<const N: usize>(&self, [i0, i1, i2, i3]: [usize; 4], vals: &[f32; N]) {
        if self.dtype == DType::F32 && self.nb[0] == 4 {
            let p = self.at(self.offset([i0, i1, i2, i3]), 4 * vals.len());
            for (k, v) in vals.iter().enumerate() {
                // SAFETY: `at` checked the whole run; unaligned writes are allowed.
                unsafe {
                    std::ptr::write_unaligned(p.add(4 * k).cast::<[u8; 4]>(), v.to_le_bytes())
                }
            }
            return;
        }
        for (k, &v) in vals.iter().enumerate() {
            self.set([i0 + k, i1, i2, i3], v);
        }
    }

    /// Element `i` of an I32 or I64 tensor (indices, positions).
    pub fn get_int(&self, i: [usize; 4]) -> i64 {
        let off = self.offset(i);
        match self.dtype {
            DType::I64 => i64::from_le_bytes(self.read_bytes(off)),
            _ => i64::from(i32::from_le_bytes(self.read_bytes(off))),
        }
    }

    /// Stores `v` as element `i` of an I32 or I64 tensor.
    pub fn set_int(&self, i: [usize; 4], v: i64) {
        let off = self.offset(i);
        match self.dtype {
            DType::I64 => self.write_bytes(off, v.to_le_bytes()),
            _ => self.write_bytes(off, (v as i32).to_le_bytes()),
        }
    }

    /// `N` bytes at byte offset `off`.
    fn read_bytes<const N: usize>(&self, off: usize) -> [u8; N] {
        let p = self.at(off, N);
        // SAFETY: `at` checked the range; unaligned reads are allowed.
        unsafe { std::ptr::read_unaligned(p.cast::<[u8; N]>()) }
    }

    /// Writes `N` bytes at byte offset `off`.
    fn write_bytes<const N: usize>(&self, off: usize, b: [u8; N]) {
        let p = self.at(off, N);
        // SAFETY: `at` checked the range; unaligned writes are allowed.
        unsafe { std::ptr::write_unaligned(p.cast::<[u8; N]>(), b) }
    }

    /// The plain element at byte offset `off`, as f32.
    fn read_plain(&self, off: usize) -> f32 {
        match self.dtype {
            DType::F16 => half::f16::from_le_bytes(self.read_bytes(off)).to_f32(),
            DType::BF16 => half::bf16::from_le_bytes(self.read_bytes(off)).to_f32(),
            DType::I32 => i32::from_le_bytes(self.read_bytes(off)) as f32,
            DType::I64 => i64::from_le_bytes(self.read_bytes(off)) as f32,
            _ => f32::from_le_bytes(self.read_bytes(off)),
        }
    }

    /// Stores `v` as the plain element at byte offset `off`.
    fn write_plain(&self, off: usize, v: f32) {
        match self.dtype {
            DType::F16 => self.write_bytes(off, half::f16::from_f32(v).to_le_bytes()),
            DType::BF16 => self.write_bytes(off, half::bf16::from_f32(v).to_le_bytes()),
            DType::I32 => self.write_bytes(off, (v as i32).to_le_bytes()),
            DType::I64 => self.write_bytes(off, (v as i64).to_le_bytes()),
            _ => self.write_bytes(off, v.to_le_bytes()),
        }
    }
}

/// Converts a contiguous row of `dtype` bytes to f32 (`out.len()` values), with SIMD
/// conversions for aligned F32 and F16 rows.
fn row_to_f32(dtype: DType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    match dtype {
        DType::F32 => {
            if let Ok(v) = bytemuck::try_cast_slice::<u8, f32>(bytes) {
                if v.len() == out.len() {
                    out.copy_from_slice(v);
                    return Ok(());
                }
            }
        }
        DType::F16 => {
            if let Ok(v) = bytemuck::try_cast_slice::<u8, f16>(bytes) {
                if v.len() == out.len() {
                    v.convert_to_f32_slice(out);
                    return Ok(());
                }
            }
        }
        _ => {}
    }
    dequantize_row(dtype, bytes, out)
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;

    #[test]
    fn rows_convert_whatever_their_alignment() {
        let vals = [1.5f32, -2.0, 0.25];
        let mut bytes = [0u8; 13];
        for (i, v) in vals.iter().enumerate() {
            bytes[1 + 4 * i..5 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        let mut out = [0f32; 3];
        row_to_f32(DType::F32, &bytes[1..], &mut out).unwrap();
        assert_eq!(out, vals);
        let h: Vec<u8> = vals
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect();
        row_to_f32(DType::F16, &h, &mut out).unwrap();
        assert_eq!(out, vals);
    }
}
