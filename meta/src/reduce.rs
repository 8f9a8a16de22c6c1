//! The generic all-reduce: sums one partial f32 (or bf16) tensor held by every part and leaves the sum in
//! every part, staging through host memory that each part's backend owns.
//!
//! Every part's tensor goes to the host through its backend's staging
//! ([`tessera_core::staging`]): page-locked memory that a CUDA GPU's copy engine reads and
//! writes; for a wgpu adapter, mapped readback and upload buffers that the host reads and writes
//! directly. The stagings are made at the first all-reduce that needs them and kept from call to
//! call, so a call allocates, registers and maps nothing. A part whose tensor already lies in host
//! memory (a CPU part) is read and written in place.
//!
//! The tensor moves in chunks over two stagings per part. Every part's read of chunk `c + 1` is
//! started before the host waits for chunk `c`, so the copies of all parts run at once and
//! keep running while the host adds chunk `c`; the sum is read straight from each part's
//! staging and written straight into each part's upload memory, and chunk `c` is then written
//! back, ordered before the part's next work. A staging is reused two chunks later, after the
//! write that emptied it (its backend's stream orders the two). Large tensors go in smaller
//! chunks, so that copying out, summing and copying back overlap, and their sum runs on several
//! threads. The sum adds the parts in part order, so every part gets the same bits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use half::bf16;
use rayon::prelude::*;

use tessera_core::backend::{Backend, Buffer};
use tessera_core::error::{Error, Result};
use tessera_core::staging::{StagedView, Staging};

/// The largest tensor moved in one chunk: below it, a call is one read, one wait and one
/// write back per part (a chunk more costs a wait on every part).
const ONE_CHUNK: usize = 1 << 20;
/// The chunk of larger tensors: at least [`ONE_CHUNK`], at most this, and about an eighth of
/// the tensor, so that the first read and the last write back (which overlap nothing) are a
/// small share of the whole.
const MAX_CHUNK: usize = 4 << 20;
/// Bytes per thread of a sum: below this a thread costs more to wake than it saves.
const SUM_PIECE: usize = 256 << 10;
/// Bytes the sum adds at a time: the partial sum of a block stays in the first-level cache
/// while every part's bytes are added to it and it is written to every part.
const SUM_BLOCK: usize = 16 << 10;

/// Where host all-reduces' time went, summed over the calls since the breakdown was turned on
/// ([`crate::MetaBackend::set_reduce_breakdown`]).
#[derive(Clone, Debug, Default)]
pub struct ReduceBreakdown {
    /// All-reduces measured.
    pub calls: usize,
    /// Each phase's name and its host time over all calls, in the order they first ran:
    /// `read <part>` (starting a part's copies to the host), `wait <part>` (waiting for them
    /// and mapping the memory), `sum` (adding the parts, from and into the staging), `write
    /// <part>` (starting the copies back), and `total` (whole calls).
    pub phases: Vec<(String, Duration)>,
}

impl ReduceBreakdown {
    fn add(&mut self, phase: &str, t: Duration) {
        match self.phases.iter_mut().find(|(p, _)| p == phase) {
            Some((_, sum)) => *sum += t,
            None => self.phases.push((phase.to_string(), t)),
        }
    }
}

/// Times phases into a breakdown, when there is one.
struct Laps<'a> {
    breakdown: Option<&'a mut ReduceBreakdown>,
    at: Instant,
}

impl Laps<'_> {
    /// Adds the time since the last lap to `phase` (a part's phases carry its name).
    fn lap(&mut self, phase: &str, part: Option<&dyn Backend>) {
        if let Some(b) = self.breakdown.as_deref_mut() {
            let now = Instant::now();
            let t = now - self.at;
            self.at = now;
            match part {
                Some(p) => b.add(&format!("{phase} {}", p.name()), t),
                None => b.add(phase, t),
            }
        }
    }
}

/// Host staging kept between all-reduces: two stagings per part (none for a part whose
/// tensors are host memory).
#[derive(Default)]
pub(crate) struct HostReduce {
    staging: Vec<[Option<Box<dyn Staging>>; 2]>,
    breakdown: Option<ReduceBreakdown>,
}

/// One part's staging slot `slot`, or an error where it was never made.
fn slot(
    staging: &mut [[Option<Box<dyn Staging>>; 2]],
    j: usize,
    slot: usize,
) -> Result<&mut (dyn Staging + 'static)> {
    match staging.get_mut(j).map(|s| &mut s[slot]) {
        Some(Some(s)) => Ok(s.as_mut()),
        _ => Err(Error::Invalid(format!(
            "all-reduce staging of part {j} missing"
        ))),
    }
}

/// Starts every staged part's read of `len` bytes at `off` into its staging `which`.
#[allow(clippy::too_many_arguments)]
fn start_reads(
    backends: &mut [Box<dyn Backend>],
    staging: &mut [[Option<Box<dyn Staging>>; 2]],
    bufs: &[(Arc<dyn Buffer>, usize)],
    direct: &[Option<*mut u8>],
    which: usize,
    off: usize,
    len: usize,
    laps: &mut Laps<'_>,
) -> Result<()> {
    for (j, b) in backends.iter_mut().enumerate() {
        if direct[j].is_some() {
            continue;
        }
        let (buf, base) = &bufs[j];
        b.stage_read(slot(staging, j, which)?, buf.as_ref(), base + off, len)?;
        laps.lap("read", Some(b.as_ref()));
    }
    Ok(())
}

impl HostReduce {
    /// Turns the per-phase breakdown on (emptied) or off.
    pub(crate) fn set_breakdown(&mut self, on: bool) {
        self.breakdown = on.then(ReduceBreakdown::default);
    }

    /// The breakdown so far, while it is on.
    pub(crate) fn breakdown(&self) -> Option<&ReduceBreakdown> {
        self.breakdown.as_ref()
    }

    /// Makes part `j`'s two stagings (from its backend) hold at least `bytes` each.
    fn reserve(&mut self, j: usize, backend: &mut dyn Backend, bytes: usize) -> Result<()> {
        for s in &mut self.staging[j] {
            if s.as_ref().is_none_or(|s| s.capacity() < bytes) {
                // The old staging goes first, so that its memory can be reused.
                *s = None;
                *s = Some(backend.new_staging(bytes)?);
            }
        }
        Ok(())
    }

    /// Sums `count` f32 values (bf16 with `bf16`) at `bufs[j]` (one per part, in part order)
    /// into every one of them. After an error the stagings are let go (one may be left
    /// mid-transfer), and the next call makes new ones.
    pub(crate) fn all_reduce(
        &mut self,
        backends: &mut [Box<dyn Backend>],
        bufs: &[(Arc<dyn Buffer>, usize)],
        count: usize,
        bf16: bool,
    ) -> Result<()> {
        let r = self.reduce(backends, bufs, count, bf16);
        if r.is_err() {
            self.staging.clear();
        }
        r
    }

    /// [`HostReduce::all_reduce`], keeping the stagings whatever happens.
    fn reduce(
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
        while self.staging.len() < n {
            self.staging.push([None, None]);
        }
        for (j, b) in backends.iter_mut().enumerate() {
            if direct[j].is_none() {
                self.reserve(j, b.as_mut(), chunk)?;
            }
        }
        let started = Instant::now();
        let mut laps = Laps {
            breakdown: self.breakdown.as_mut(),
            at: started,
        };
        let staging = &mut self.staging;
        let n_chunks = total.div_ceil(chunk);
        let span = |c: usize| (c * chunk, (total - c * chunk).min(chunk));
        let (off, len) = span(0);
        start_reads(backends, staging, bufs, &direct, 0, off, len, &mut laps)?;
        for c in 0..n_chunks {
            if c + 1 < n_chunks {
                let (off, len) = span(c + 1);
                start_reads(
                    backends,
                    staging,
                    bufs,
                    &direct,
                    (c + 1) % 2,
                    off,
                    len,
                    &mut laps,
                )?;
            }
            let (off, len) = span(c);
            let mut views: Vec<StagedView<'_>> = Vec::with_capacity(n);
            for (j, (b, slots)) in backends.iter_mut().zip(staging.iter_mut()).enumerate() {
                match direct[j] {
                    // SAFETY: the part's tensor is host memory holding `total` bytes from
                    // `p` (checked above), apart from every other part's (checked above), and
                    // only this call reads or writes it until it returns (the caller ordered
                    // it after the part's work).
                    Some(p) => views.push(StagedView::InPlace(unsafe {
                        std::slice::from_raw_parts_mut(p.add(off), len)
                    })),
                    None => {
                        let Some(s) = slots[c % 2].as_deref_mut() else {
                            return Err(Error::Invalid(format!(
                                "all-reduce staging of part {j} missing"
                            )));
                        };
                        let v = b.staged(s)?;
                        let aligned = |p: *const u8| (p as usize).is_multiple_of(esize);
                        if !aligned(v.read().as_ptr()) {
                            return Err(Error::Invalid(format!(
                                "{}'s staging is not aligned for {esize}-byte values",
                                b.name()
                            )));
                        }
                        if v.len() != len {
                            return Err(Error::Invalid(format!(
                                "{}'s staging held {} bytes for a read of {len}",
                                b.name(),
                                v.len()
                            )));
                        }
                        views.push(v);
                        laps.lap("wait", Some(b.as_ref()));
                    }
                }
            }
            sum_into_all(views, esize, bf16);
            laps.lap("sum", None);
            for (j, b) in backends.iter_mut().enumerate() {
                if direct[j].is_some() {
                    continue;
                }
                let (buf, base) = &bufs[j];
                b.stage_write(slot(staging, j, c % 2)?, buf.as_ref(), base + off, len)?;
                laps.lap("write", Some(b.as_ref()));
            }
        }
        if let Some(b) = laps.breakdown {
            b.calls += 1;
            b.add("total", started.elapsed());
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

/// Adds the bytes read of every view (f32, or bf16 added in f32 with `bf16`), in part order,
/// and writes the sum into every view; on several threads for large views.
fn sum_into_all(views: Vec<StagedView<'_>>, esize: usize, bf16: bool) {
    let len = views.first().map_or(0, StagedView::len);
    if len <= SUM_PIECE {
        sum_piece(views, bf16);
        return;
    }
    let piece = SUM_PIECE / esize * esize;
    let mut pieces: Vec<Vec<StagedView<'_>>> =
        (0..len.div_ceil(piece)).map(|_| Vec::new()).collect();
    for v in views {
        match v {
            StagedView::InPlace(b) => {
                for (i, p) in b.chunks_mut(piece).enumerate() {
                    pieces[i].push(StagedView::InPlace(p));
                }
            }
            StagedView::Split { read, write } => {
                for (i, (r, w)) in read.chunks(piece).zip(write.chunks_mut(piece)).enumerate() {
                    pieces[i].push(StagedView::Split { read: r, write: w });
                }
            }
        }
    }
    pieces.into_par_iter().for_each(|p| sum_piece(p, bf16));
}

/// [`sum_into_all`] on one thread, a block at a time: the first view's block is copied into a
/// partial sum in cache, the others added to it, and the sum written to every view (a view's
/// write memory is only written, never read).
fn sum_piece(mut views: Vec<StagedView<'_>>, bf16: bool) {
    let mut acc = [0u32; SUM_BLOCK / 4];
    let len = views.first().map_or(0, StagedView::len);
    let mut at = 0;
    while at < len {
        let end = (at + SUM_BLOCK).min(len);
        let acc = &mut bytemuck::cast_slice_mut::<u32, u8>(&mut acc)[..end - at];
        let mut parts = views.iter();
        if let Some(first) = parts.next() {
            acc.copy_from_slice(&first.read()[at..end]);
        }
        for x in parts {
            let x = &x.read()[at..end];
            if bf16 {
                add_bf16(bytemuck::cast_slice_mut(acc), bytemuck::cast_slice(x));
            } else {
                add_f32(bytemuck::cast_slice_mut(acc), bytemuck::cast_slice(x));
            }
        }
        for v in &mut views {
            v.write()[at..end].copy_from_slice(acc);
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
    /// tail shorter than a piece: every part ends with the same sum, added in part order, in
    /// place or in a separate upload.
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
        // The middle part reads from one place and writes to another (a mapped upload).
        let mut upload = vec![0f32; len];
        let [a, b, c] = &mut parts[..] else {
            unreachable!("three parts")
        };
        sum_into_all(
            vec![
                StagedView::InPlace(bytemuck::cast_slice_mut(a)),
                StagedView::Split {
                    read: bytemuck::cast_slice(b),
                    write: bytemuck::cast_slice_mut(&mut upload),
                },
                StagedView::InPlace(bytemuck::cast_slice_mut(c)),
            ],
            4,
            false,
        );
        assert_eq!(parts[0], want);
        assert_eq!(parts[2], want);
        assert_eq!(upload, want);
        assert_ne!(
            parts[1], want,
            "the read side of a split view is left as it was"
        );

        let mut halves: Vec<Vec<bf16>> = (0..2)
            .map(|_| (0..len).map(|_| bf16::from_f32(next())).collect())
            .collect();
        let want: Vec<bf16> = (0..len)
            .map(|i| bf16::from_f32(halves[0][i].to_f32() + halves[1][i].to_f32()))
            .collect();
        sum_into_all(
            halves
                .iter_mut()
                .map(|p| StagedView::InPlace(bytemuck::cast_slice_mut(p)))
                .collect(),
            2,
            true,
        );
        for p in &halves {
            assert_eq!(p, &want);
        }
    }
}
