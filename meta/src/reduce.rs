//! The generic all-reduce: sums one partial f32 (or bf16) tensor held by every part and leaves the sum in
//! every part, staging through host memory with each backend's async copies.
//!
//! The tensor moves in chunks, double-buffered: while the host adds chunk `c`, every part is
//! already copying chunk `c + 1` out, and the sum of chunk `c` goes back to every part with an
//! async write ordered before that part's next work. Parts of different kinds (a CPU, a CUDA
//! GPU, a wgpu adapter) each transfer at their own pace; nothing waits on one part while
//! another could be copying.
//!
//! Staging is kept from call to call, two chunks per part, in the memory the part's device
//! copies fastest from and to ([`Device::host_buffer_type`]: page-locked memory for a CUDA GPU,
//! which its copy engines reach without the driver's own bounce buffer); a part whose tensor
//! already lies in host memory (a CPU part) is read and written in place, with no copy at all.
//! Each part's staging is touched only by that part's stream and by the host after that part
//! was synchronized, so a chunk's write back may still be reading it while another part
//! fetches the next chunk. Large tensors go in smaller chunks, so that copying out, summing
//! and copying back overlap, and their sum runs on several threads.

use std::sync::Arc;

use half::bf16;
use rayon::prelude::*;

use tessera_core::backend::{Backend, Buffer, Device};
use tessera_core::error::{Error, Result};

/// The largest tensor moved in one chunk: below it, a call is one fetch, one wait and one
/// write back per part (a chunk more costs a wait on every part).
const ONE_CHUNK: usize = 1 << 20;
/// The chunk of larger tensors: at least [`ONE_CHUNK`], at most this, and about an eighth of
/// the tensor, so that the first fetch and the last write back (which overlap nothing) are a
/// small share of the whole.
const MAX_CHUNK: usize = 4 << 20;
/// Bytes per thread of a sum: below this a thread costs more to wake than it saves.
const SUM_PIECE: usize = 256 << 10;

/// Host memory for one chunk of one part.
enum Slot {
    /// A buffer of the part's host buffer type (its address is 4-byte aligned), kept alive
    /// while the device may copy from or to it.
    Device(Arc<dyn Buffer>),
    /// Ordinary memory, as 4-byte words so that its bytes can be viewed as f32 or bf16.
    Plain(Vec<u32>),
}

impl Slot {
    fn len(&self) -> usize {
        match self {
            Slot::Device(b) => b.size(),
            Slot::Plain(v) => v.len() * 4,
        }
    }

    fn bytes(&mut self) -> &mut [u8] {
        match self {
            Slot::Device(b) => match b.host_ptr() {
                // SAFETY: the buffer is host memory of `size()` bytes owned by `b`, which
                // lives as long as this borrow of `self`; nothing else reads or writes it
                // while the host holds it (the module's ordering rule).
                Some(p) => unsafe { std::slice::from_raw_parts_mut(p, b.size()) },
                None => &mut [],
            },
            Slot::Plain(v) => bytemuck::cast_slice_mut(v),
        }
    }
}

/// Host staging memory kept between all-reduces: two chunk slots per part (unused for a part
/// whose tensors are host memory).
pub(crate) struct HostReduce {
    parts: Vec<Arc<dyn Device>>,
    staging: Vec<[Slot; 2]>,
}

impl HostReduce {
    /// Staging for the all-reduces of `parts` (allocated at the first one that needs it).
    pub(crate) fn new(parts: Vec<Arc<dyn Device>>) -> HostReduce {
        HostReduce {
            parts,
            staging: Vec::new(),
        }
    }

    /// Makes part `j`'s two slots hold at least `bytes` each.
    fn reserve(&mut self, j: usize, bytes: usize) {
        while self.staging.len() <= j {
            self.staging
                .push([Slot::Plain(Vec::new()), Slot::Plain(Vec::new())]);
        }
        let host_type = self.parts.get(j).and_then(|d| d.host_buffer_type());
        for slot in &mut self.staging[j] {
            if slot.len() >= bytes {
                continue;
            }
            // Page-locked memory where the device has it; ordinary memory where it has none
            // or none is left (the copies are then only slower).
            let fast = host_type.as_ref().and_then(|t| match t.alloc(bytes) {
                Ok(b) if b.host_ptr().is_some_and(|p| (p as usize).is_multiple_of(4)) => Some(b),
                Ok(_) => None,
                Err(e) => {
                    log::debug!("all-reduce staging in ordinary memory ({e})");
                    None
                }
            });
            *slot = match fast {
                Some(b) => Slot::Device(b),
                None => Slot::Plain(vec![0; bytes.div_ceil(4)]),
            };
        }
    }

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
        for (buf, base) in bufs {
            buf.check_range(*base, total)?;
        }
        // A part whose tensor is host memory, aligned for its elements, is summed in place.
        let direct: Vec<Option<*mut u8>> = bufs
            .iter()
            .map(|(buf, base)| {
                buf.host_ptr()
                    // SAFETY: the range was checked above.
                    .map(|p| unsafe { p.add(*base) })
                    .filter(|p| (*p as usize).is_multiple_of(esize))
            })
            .collect();
        // Slices of host memory are handed out mutably per part: they must not overlap.
        let mut spans: Vec<usize> = direct.iter().flatten().map(|p| *p as usize).collect();
        spans.sort_unstable();
        if spans.windows(2).any(|w| w[1] - w[0] < total) {
            return Err(Error::Invalid(
                "an all-reduce was given overlapping host memory for two parts".into(),
            ));
        }
        let chunk = chunk_bytes(total);
        for (j, d) in direct.iter().enumerate() {
            if d.is_none() {
                self.reserve(j, chunk);
            }
        }
        let n_chunks = total.div_ceil(chunk);
        let span = |c: usize| (c * chunk, (total - c * chunk).min(chunk));
        let fetch = |c: usize, staging: &mut [[Slot; 2]], backends: &mut [Box<dyn Backend>]| {
            let (off, len) = span(c);
            for (j, b) in backends.iter_mut().enumerate() {
                if direct[j].is_some() {
                    continue;
                }
                let (buf, base) = &bufs[j];
                let out = &mut staging[j][c % 2].bytes()[..len];
                b.get_async(buf.as_ref(), base + off, out)?;
            }
            Ok::<(), Error>(())
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
            let mut views: Vec<&mut [u8]> = Vec::with_capacity(n);
            for (j, slots) in self.staging.iter_mut().enumerate().take(n) {
                if direct[j].is_none() {
                    views.push(&mut slots[c % 2].bytes()[..len]);
                }
            }
            let mut views_iter = views.into_iter();
            let views: Vec<&mut [u8]> = direct
                .iter()
                .map(|d| match d {
                    // SAFETY: the part's tensor is host memory holding `total` bytes from
                    // `d` (checked above), its stream was synchronized, and only this call
                    // reads or writes it until it returns.
                    Some(p) => Ok(unsafe { std::slice::from_raw_parts_mut(p.add(off), len) }),
                    None => views_iter
                        .next()
                        .ok_or_else(|| Error::Invalid("all-reduce staging missing".into())),
                })
                .collect::<Result<_>>()?;
            sum_into_all(views, esize, bf16);
            for (j, b) in backends.iter_mut().enumerate() {
                if direct[j].is_some() {
                    continue;
                }
                let (buf, base) = &bufs[j];
                // The slot is next written by the fetch two chunks on, after the synchronize
                // that ends this write (or, from the next call, by this part's stream after
                // this write, in stream order).
                b.set_async(
                    buf.as_ref(),
                    base + off,
                    &self.staging[j][c % 2].bytes()[..len],
                )?;
            }
        }
        Ok(())
    }
}

/// Bytes per chunk for a tensor of `total` bytes: a multiple of 256 (so that every chunk but
/// the last keeps word-aligned copies), at least [`ONE_CHUNK`] where the tensor is larger.
fn chunk_bytes(total: usize) -> usize {
    if total <= ONE_CHUNK {
        return total;
    }
    (total / 8).clamp(ONE_CHUNK, MAX_CHUNK) / 256 * 256
}

/// Adds the values of every view (f32, or bf16 added in f32 with `bf16`), in part order, and
/// writes the sum into every one; on several threads for large views.
fn sum_into_all(views: Vec<&mut [u8]>, esize: usize, bf16: bool) {
    let len = views.first().map_or(0, |v| v.len());
    if len <= SUM_PIECE {
        sum_piece(views, bf16);
        return;
    }
    let piece = SUM_PIECE / esize * esize;
    let mut pieces: Vec<Vec<&mut [u8]>> = (0..len.div_ceil(piece)).map(|_| Vec::new()).collect();
    for v in views {
        for (i, p) in v.chunks_mut(piece).enumerate() {
            pieces[i].push(p);
        }
    }
    pieces.into_par_iter().for_each(|p| sum_piece(p, bf16));
}

/// [`sum_into_all`] on one thread: the sum goes into the first view, then is copied into the
/// others, a block at a time while it is in cache.
fn sum_piece(mut views: Vec<&mut [u8]>, bf16: bool) {
    const BLOCK: usize = 16 << 10;
    let Some((first, rest)) = views.split_first_mut() else {
        return;
    };
    let len = first.len();
    let mut at = 0;
    while at < len {
        let end = (at + BLOCK).min(len);
        let acc = &mut first[at..end];
        for x in rest.iter() {
            let x = &x[at..end];
            if bf16 {
                add_bf16(bytemuck::cast_slice_mut(acc), bytemuck::cast_slice(x));
            } else {
                add_f32(bytemuck::cast_slice_mut(acc), bytemuck::cast_slice(x));
            }
        }
        for x in rest.iter_mut() {
            x[at..end].copy_from_slice(acc);
        }
        at = end;
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

    #[test]
    fn chunks_are_whole_words_and_cover_large_tensors_in_several() {
        assert_eq!(chunk_bytes(6), 6);
        assert_eq!(chunk_bytes(ONE_CHUNK), ONE_CHUNK);
        for total in [ONE_CHUNK + 2, 3 << 20, 64 << 20, (1 << 30) + 6] {
            let c = chunk_bytes(total);
            assert_eq!(c % 256, 0);
            assert!((ONE_CHUNK..=MAX_CHUNK).contains(&c), "{total}: {c}");
            assert!(total.div_ceil(c) >= 2);
        }
    }

    /// Three parts of random values, large enough for several threads and blocks and with a
    /// tail shorter than a piece: every part ends with the same sum, added in part order.
    #[test]
    fn sum_into_all_leaves_the_sum_in_every_view() {
        let len = SUM_PIECE / 4 * 3 + 37;
        let mut seed = 0x9e37_79b9u32;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed as f32 / u32::MAX as f32) * 2.0 - 1.0
        };
        let mut parts: Vec<Vec<f32>> = (0..3).map(|_| (0..len).map(|_| next()).collect()).collect();
        let want: Vec<f32> = (0..len)
            .map(|i| parts[0][i] + parts[1][i] + parts[2][i])
            .collect();
        sum_into_all(
            parts
                .iter_mut()
                .map(|p| bytemuck::cast_slice_mut(p))
                .collect(),
            4,
            false,
        );
        for p in &parts {
            assert_eq!(p, &want);
        }

        let mut halves: Vec<Vec<bf16>> = (0..2)
            .map(|_| (0..len).map(|_| bf16::from_f32(next())).collect())
            .collect();
        let want: Vec<bf16> = (0..len)
            .map(|i| bf16::from_f32(halves[0][i].to_f32() + halves[1][i].to_f32()))
            .collect();
        sum_into_all(
            halves
                .iter_mut()
                .map(|p| bytemuck::cast_slice_mut(p))
                .collect(),
            2,
            true,
        );
        for p in &halves {
            assert_eq!(p, &want);
        }
    }
}
