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

use crate::backend::{Backend, Buffer};
use crate::error::{Error, Result};

/// Bytes moved per chunk: large enough that each backend's fixed cost per transfer (a wgpu
/// readback maps a staging buffer) is small beside the bytes.
const CHUNK: usize = 8 << 20;

/// Host staging memory kept between all-reduces: two chunk buffers per part and two sums.
#[derive(Default)]
pub(crate) struct HostReduce {
    staging: Vec<[Vec<u8>; 2]>,
    sums: [Vec<u8>; 2],
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
        for s in self
            .staging
            .iter_mut()
            .take(n)
            .flat_map(|s| s.iter_mut())
            .chain(self.sums.iter_mut())
        {
            if s.len() < chunk {
                s.resize(chunk, 0);
            }
        }
        let n_chunks = total.div_ceil(chunk);
        let span = |c: usize| (c * chunk, (total - c * chunk).min(chunk));
        let fetch = |c: usize,
                     staging: &mut [[Vec<u8>; 2]],
                     backends: &mut [Box<dyn Backend>]|
         -> Result<()> {
            let (off, len) = span(c);
            for (j, b) in backends.iter_mut().enumerate() {
                let (buf, base) = &bufs[j];
                b.get_async(buf.as_ref(), base + off, &mut staging[j][c % 2][..len])?;
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
            let sum = &mut self.sums[c % 2][..len];
            sum.copy_from_slice(&self.staging[0][c % 2][..len]);
            for s in self.staging.iter().take(n).skip(1) {
                if bf16 {
                    add_bf16(sum, &s[c % 2][..len]);
                } else {
                    add_f32(sum, &s[c % 2][..len]);
                }
            }
            for (j, b) in backends.iter_mut().enumerate() {
                let (buf, base) = &bufs[j];
                b.set_async(buf.as_ref(), base + off, sum)?;
            }
        }
        Ok(())
    }
}

/// `acc += x`, both little-endian f32 bytes.
fn add_f32(acc: &mut [u8], x: &[u8]) {
    for (a, b) in acc.chunks_exact_mut(4).zip(x.chunks_exact(4)) {
        let s = f32::from_le_bytes([a[0], a[1], a[2], a[3]])
            + f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        a.copy_from_slice(&s.to_le_bytes());
    }
}

/// `acc += x`, both little-endian bf16 bytes, added in f32.
fn add_bf16(acc: &mut [u8], x: &[u8]) {
    for (a, b) in acc.chunks_exact_mut(2).zip(x.chunks_exact(2)) {
        let s =
            bf16::from_le_bytes([a[0], a[1]]).to_f32() + bf16::from_le_bytes([b[0], b[1]]).to_f32();
        a.copy_from_slice(&bf16::from_f32(s).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_bf16_adds_in_f32() {
        let mut a: Vec<u8> = [1.0f32, 256.0]
            .iter()
            .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
            .collect();
        let b: Vec<u8> = [0.5f32, 1.0]
            .iter()
            .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
            .collect();
        add_bf16(&mut a, &b);
        let out: Vec<f32> = a
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect();
        assert_eq!(out, vec![1.5, 256.0]);
    }

    #[test]
    fn add_f32_adds_elementwise() {
        let mut a: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let b: Vec<u8> = [0.5f32, -2.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        add_f32(&mut a, &b);
        let out: Vec<f32> = a
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(out, vec![1.5, 0.0]);
    }
}
