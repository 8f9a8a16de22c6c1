//! The generic all-reduce: sums one partial f32 (or bf16) tensor held by every part and leaves the sum in
//! every part, staging through host memory with each backend's async copies.
//!
//! The tensor moves in chunks, double-buffered: while the host adds chunk `c`, every part is
//! already copying chunk `c + 1` out, and the sum of chunk `c` goes back to every part with an
//! async write ordered before that part's next work. Parts of different kinds (a CPU, a CUDA
//! GPU, a wgpu adapter) each transfer at their own pace; nothing waits on one part while
//! another could be copying. A part without true async copies (the CPU) falls back to blocking
//! ones, which for host memory are plain memory copies.

use std::sync::Arc;

use half::bf16;

use tessera_core::backend::{Backend, Buffer};
use tessera_core::error::{Error, Result};

/// Bytes moved per chunk: large enough that each backend's fixed cost per transfer (a wgpu
/// readback maps a staging buffer) is small beside the bytes.
const CHUNK: usize = 8 << 20;

/// Host staging memory kept between all-reduces: two chunk buffers per part, held as 4-byte
/// words so that their bytes can be viewed as f32 or bf16 values. A chunk is summed in place in
/// part 0's buffer and written back to every part from there.
#[derive(Default)]
pub(crate) struct HostReduce {
    staging: Vec<[Vec<u32>; 2]>,
}

impl HostReduce {
    /// Sums `count` f32 values (bf16 with `bf16`) at `bufs[j]` (one per part, in part order)
    /// into every one of them.
    pub(crate) fn all_reduce(
        &mut self,
        backends: &mut [Box<dyn Backend>],
        bufs: &[(Arc<dyn Buffer>, usize)],
        count: usize,
        bf16: bool,
    ) -> Result<()> {
        let n = backends.len();
        if bufs.len() != n {
            return Err(Error::Invalid(format!(
                "an all-reduce over {n} parts was given {} buffers",
                bufs.len()
            )));
        }
        if n < 2 || count == 0 {
            return Ok(());
        }
        let esize = if bf16 { 2 } else { 4 };
        let total = count * esize;
        if self.staging.len() < n {
            self.staging.resize_with(n, Default::default);
        }
        let chunk = (CHUNK / esize * esize).min(total);
        for s in self.staging.iter_mut().take(n).flat_map(|s| s.iter_mut()) {
            if s.len() * 4 < chunk {
                s.resize(chunk.div_ceil(4), 0);
            }
        }
        let n_chunks = total.div_ceil(chunk);
        let span = |c: usize| (c * chunk, (total - c * chunk).min(chunk));
        let fetch = |c: usize,
                     staging: &mut [[Vec<u32>; 2]],
                     backends: &mut [Box<dyn Backend>]|
         -> Result<()> {
            let (off, len) = span(c);
            for (j, b) in backends.iter_mut().enumerate() {
                let (buf, base) = &bufs[j];
                let out = &mut bytemuck::cast_slice_mut(&mut staging[j][c % 2])[..len];
                b.get_async(buf.as_ref(), base + off, out)?;
            }
            Ok(())
        };
        fetch(0, &mut self.staging, backends)?;
        for c in 0..n_chunks {
            for b in backends.iter_mut() {
                b.synchronize()?;
            }
            if c + 1 < n_chunks {
                fetch(c + 1, &mut self.staging, backends)?;
            }
            let (off, len) = span(c);
            let (first, rest) = self.staging[..n].split_at_mut(1);
            // Whole words from a word boundary: the casts below cannot fail (`len` is a
            // multiple of the element size).
            let sum = &mut bytemuck::cast_slice_mut::<u32, u8>(&mut first[0][c % 2])[..len];
            for s in rest {
                let x = &bytemuck::cast_slice::<u32, u8>(&s[c % 2])[..len];
                if bf16 {
                    add_bf16(bytemuck::cast_slice_mut(sum), bytemuck::cast_slice(x));
                } else {
                    add_f32(bytemuck::cast_slice_mut(sum), bytemuck::cast_slice(x));
                }
            }
            // Part 0's buffer for chunk `c` is next written by the fetch of chunk `c + 2`,
            // after the synchronize that ends these writes.
            for (j, b) in backends.iter_mut().enumerate() {
                let (buf, base) = &bufs[j];
                b.set_async(buf.as_ref(), base + off, sum)?;
            }
        }
        Ok(())
    }
}

/// `acc += x` (vectorized by the compiler).
fn add_f32(acc: &mut [f32], x: &[f32]) {
    for (a, b) in acc.iter_mut().zip(x) {
        *a += b;
    }
}

/// `acc += x`, added in f32.
fn add_bf16(acc: &mut [bf16], x: &[bf16]) {
    for (a, b) in acc.iter_mut().zip(x) {
        *a = bf16::from_f32(a.to_f32() + b.to_f32());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_bf16_adds_in_f32() {
        let mut a = [1.0f32, 256.0].map(bf16::from_f32);
        add_bf16(&mut a, &[0.5f32, 1.0].map(bf16::from_f32));
        assert_eq!(a.map(bf16::to_f32), [1.5, 256.0]);
    }

    #[test]
    fn add_f32_adds_elementwise() {
        let mut a = [1.0f32, 2.0];
        add_f32(&mut a, &[0.5, -2.0]);
        assert_eq!(a, [1.5, 0.0]);
    }
}
