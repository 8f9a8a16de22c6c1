//! Host staging: a range of a device buffer read into host memory that its backend owns,
//! changed there by the host, and written back (a host all-reduce's round trip), with no copy
//! between the backend's memory and the caller's.
//!
//! A [`Staging`] is made by one backend ([`Backend::new_staging`]) and kept by the caller from
//! transfer to transfer, so that nothing is allocated, registered or mapped per call. A round
//! trip is three calls on that backend:
//!
//! 1. [`Backend::stage_read`] starts copying the range into the staging, ordered after the
//!    work already submitted to the stream, and waits for nothing (a caller with several
//!    devices starts every read before it waits on any);
//! 2. [`Backend::staged`] waits for that read and hands out a [`StagedView`]: the bytes read,
//!    and the memory the host writes the bytes to send back into (the same memory, or a
//!    separate mapped upload area);
//! 3. [`Backend::stage_write`] starts copying the bytes written into the view back into a
//!    buffer, ordered after that read and before the work submitted later. It need not wait
//!    for work submitted between the read and the write (a backend may run it beside that
//!    work), so that work must not touch the range written.
//!
//! A staging is busy from a read until the write after it has run: the next read into it is
//! ordered after that write, so a caller may start it at once. Two stagings of one backend are
//! independent, so a caller pipelines chunks by alternating two: the read of chunk `c + 1`
//! started before chunk `c` is written.
//!
//! [`HostStaging`] is the default: ordinary host memory moved by the backend's
//! [`Backend::get_async`] and [`Backend::set_async`], correct on every backend.

use std::any::Any;

use crate::backend::{Backend, Buffer};
use crate::error::{Error, Result};

/// Host memory of one backend for staged transfers (see the module docs).
pub trait Staging: Send {
    /// The most bytes one transfer moves.
    fn capacity(&self) -> usize;
    /// The staging as `Any`, for its backend to reach its own type.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// The host side of a staged read ([`Backend::staged`]); each slice has the read's length.
pub enum StagedView<'a> {
    /// One range of host memory: it holds the bytes read, and the bytes to send back are
    /// written over them.
    InPlace(&'a mut [u8]),
    /// The bytes read, and separate memory for the bytes to send back. That memory may be
    /// mapped, write-combined device memory, slow to read: write it, do not read it.
    Split {
        /// The bytes read.
        read: &'a [u8],
        /// Where the bytes to send back go.
        write: &'a mut [u8],
    },
}

impl StagedView<'_> {
    /// Bytes in the view.
    pub fn len(&self) -> usize {
        match self {
            StagedView::InPlace(b) => b.len(),
            StagedView::Split { read, .. } => read.len(),
        }
    }

    /// Whether the view holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes read.
    pub fn read(&self) -> &[u8] {
        match self {
            StagedView::InPlace(b) => b,
            StagedView::Split { read, .. } => read,
        }
    }

    /// Where the bytes to send back go (write only: see [`StagedView::Split`]).
    pub fn write(&mut self) -> &mut [u8] {
        match self {
            StagedView::InPlace(b) => b,
            StagedView::Split { write, .. } => write,
        }
    }
}

/// The default [`Staging`]: ordinary host memory (4-byte words, so that its bytes can be
/// viewed as f32 or bf16) filled by [`Backend::get_async`] and sent by [`Backend::set_async`].
pub struct HostStaging {
    words: Vec<u32>,
    /// Bytes of the last read.
    len: usize,
}

impl HostStaging {
    /// Staging of `bytes` bytes.
    pub fn new(bytes: usize) -> HostStaging {
        HostStaging {
            words: vec![0; bytes.div_ceil(4)],
            len: 0,
        }
    }

    fn bytes(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(&mut self.words)
    }

    /// [`Backend::stage_read`] through `backend`'s `get_async`.
    pub fn read<B: Backend + ?Sized>(
        &mut self,
        backend: &mut B,
        buffer: &dyn Buffer,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        check_capacity(self, len)?;
        // The bytes are filled by the next synchronize, which `view` runs; until then the
        // memory is the backend's (this staging stays put: it is owned by the caller).
        backend.get_async(buffer, offset, &mut self.bytes()[..len])?;
        self.len = len;
        Ok(())
    }

    /// [`Backend::staged`]: a synchronize of `backend`, then the bytes read, in place.
    pub fn view<B: Backend + ?Sized>(&mut self, backend: &mut B) -> Result<StagedView<'_>> {
        backend.synchronize()?;
        let len = self.len;
        Ok(StagedView::InPlace(&mut self.bytes()[..len]))
    }

    /// [`Backend::stage_write`] through `backend`'s `set_async`: the bytes must stay unchanged
    /// until the next synchronize, which the next read's view runs before the host touches them.
    pub fn write<B: Backend + ?Sized>(
        &mut self,
        backend: &mut B,
        buffer: &dyn Buffer,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        if len > self.len {
            return Err(staged_too_short(len, self.len));
        }
        backend.set_async(buffer, offset, &self.bytes()[..len])
    }
}

impl Staging for HostStaging {
    fn capacity(&self) -> usize {
        self.words.len() * 4
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// The [`HostStaging`] behind a staging handed to a backend that made none of its own.
pub fn host_staging(staging: &mut dyn Staging) -> Result<&mut HostStaging> {
    staging
        .as_any_mut()
        .downcast_mut::<HostStaging>()
        .ok_or_else(|| foreign_staging("a backend without staging of its own"))
}

/// The error for a staging handed to a backend other than the one that made it.
pub fn foreign_staging(backend: &str) -> Error {
    Error::Invalid(format!(
        "{backend} was handed staging that another backend made"
    ))
}

/// Checks a transfer of `len` bytes fits `staging`.
pub fn check_capacity(staging: &dyn Staging, len: usize) -> Result<()> {
    if len > staging.capacity() {
        return Err(Error::Invalid(format!(
            "a staged transfer of {len} bytes is past its staging's {} bytes",
            staging.capacity()
        )));
    }
    Ok(())
}

/// The error for a write of `len` bytes after a read of only `read` bytes.
pub fn staged_too_short(len: usize, read: usize) -> Error {
    Error::Invalid(format!(
        "a staged write of {len} bytes after a read of {read} bytes"
    ))
}
