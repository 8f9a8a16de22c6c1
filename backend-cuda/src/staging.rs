//! The CUDA backend's host staging ([`tessera_core::staging`]): page-locked memory that the
//! GPU's copy engines read into and write out of asynchronously, and an event recorded after
//! each read, so that the host waits for that read alone (not for the write queued after it).
//! The host reads and writes the memory in place ([`StagedView::InPlace`]).
//!
//! Reads run on the backend's stream; writes run on a stream of the staging's own, after the
//! read they follow, and the backend's stream waits for each write before its later work. The
//! GPU has separate copy engines for the two directions, so a pipelined caller's write of one
//! chunk runs while the next chunk is read, instead of after it.

use std::any::Any;
use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaStream};
use tessera_core::staging::{check_capacity, staged_too_short, StagedView, Staging};
use tessera_core::{Buffer, BufferType, Result};

use crate::driver::DeviceShared;
use crate::memory::PinnedBufferType;

/// A CUDA backend's staging (see the module docs).
pub(crate) struct CudaStaging {
    pub(crate) ordinal: usize,
    /// Page-locked memory of `capacity` bytes.
    pinned: Arc<dyn Buffer>,
    /// Recorded on the backend's stream after the last read.
    pub(crate) event: CudaEvent,
    /// The stream writes run on, and the event recorded there after the last one.
    pub(crate) up: Arc<CudaStream>,
    pub(crate) written: CudaEvent,
    /// Bytes of the last read, while one was started.
    pub(crate) len: Option<usize>,
}

impl CudaStaging {
    /// Staging of `bytes` bytes on `dev`.
    pub(crate) fn new(dev: &Arc<DeviceShared>, bytes: usize) -> Result<CudaStaging> {
        let pinned = PinnedBufferType { dev: dev.clone() }.alloc(bytes.max(1))?;
        dev.bind()?;
        let event = || {
            dev.ctx
                .new_event(None)
                .map_err(|e| dev.err("creating an event", e))
        };
        let up = dev
            .ctx
            .new_stream()
            .map_err(|e| dev.err("creating a stream", e))?;
        Ok(CudaStaging {
            ordinal: dev.ordinal,
            pinned,
            event: event()?,
            up,
            written: event()?,
            len: None,
        })
    }

    /// The first `len` bytes of the page-locked memory (at most the capacity).
    pub(crate) fn bytes(&mut self, len: usize) -> Result<&mut [u8]> {
        check_capacity(self, len)?;
        let p = self.pinned.host_ptr().unwrap_or(std::ptr::null_mut());
        if len == 0 || p.is_null() {
            return Ok(&mut []);
        }
        // SAFETY: the pinned buffer is host memory of at least `len` bytes (checked), owned
        // by `self` and borrowed through `&mut self`; the stream reads or writes it only
        // between a copy's start and the event or synchronize the host waits on before it
        // hands the memory out again (the staging module's rule).
        Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
    }

    /// The view of the last read, after its event.
    pub(crate) fn view(&mut self) -> Result<StagedView<'_>> {
        let Some(len) = self.len else {
            return Err(tessera_core::Error::Invalid(
                "a staged view without a read".into(),
            ));
        };
        Ok(StagedView::InPlace(self.bytes(len)?))
    }

    /// Checks a write of `len` bytes follows a read of at least as many.
    pub(crate) fn check_write(&self, len: usize) -> Result<()> {
        let read = self.len.unwrap_or(0);
        if len > read {
            return Err(staged_too_short(len, read));
        }
        Ok(())
    }
}

impl Staging for CudaStaging {
    fn capacity(&self) -> usize {
        self.pinned.size()
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
