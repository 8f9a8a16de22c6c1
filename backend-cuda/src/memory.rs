//! Buffers: device memory from the pool ([`CudaBuffer`]) and page-locked host memory
//! ([`PinnedBuffer`]) that the GPU copies from and to at full speed.

use std::any::Any;
use std::sync::Arc;

use cudarc::driver::sys;
use tessera_core::{Buffer, BufferType, Error, Result};

use crate::driver::DeviceShared;

/// Alignment of tensor offsets in CUDA buffers.
pub(crate) const ALIGNMENT: usize = 256;

/// A block of device memory on one GPU.
pub struct CudaBuffer {
    pub(crate) dev: Arc<DeviceShared>,
    pub(crate) ptr: u64,
    size: usize,
}

impl CudaBuffer {
    /// The device address of byte 0.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The device ordinal the memory is on.
    pub fn ordinal(&self) -> usize {
        self.dev.ordinal
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        // Work queued on any stream may still use the block: wait for it, then hand the block
        // back to the pool for reuse.
        if let Err(e) = self.dev.synchronize_all() {
            log::warn!("{}: {e}", self.dev.name);
        }
        let (dev, ptr) = (self.dev.clone(), self.ptr);
        let r = dev.blocking(|s| {
            dev.pool.free(&dev, ptr, s);
            Ok(())
        });
        if let Err(e) = r {
            log::warn!("{}: {e}", self.dev.name);
        }
    }
}

impl Buffer for CudaBuffer {
    fn name(&self) -> String {
        self.dev.name.clone()
    }

    fn size(&self) -> usize {
        self.size
    }

    fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        let dst = self.ptr + offset as u64;
        self.dev.blocking(|s| {
            // SAFETY: the range was checked; the stream is synchronized before `data` is released.
            unsafe { sys::cuMemcpyHtoDAsync_v2(dst, data.as_ptr().cast(), data.len(), s) }
                .result()
                .map_err(|e| self.dev.err("copying to the device", e))
        })
    }

    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        let src = self.ptr + offset as u64;
        self.dev.blocking(|s| {
            // SAFETY: the range was checked; the stream is synchronized before `out` is released.
            unsafe { sys::cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), src, out.len(), s) }
                .result()
                .map_err(|e| self.dev.err("copying from the device", e))
        })
    }

    fn clear(&self, value: u8) -> Result<()> {
        if self.size == 0 {
            return Ok(());
        }
        self.dev.blocking(|s| {
            // SAFETY: the whole allocation is written.
            unsafe { sys::cuMemsetD8Async(self.ptr, value, self.size, s) }
                .result()
                .map_err(|e| self.dev.err("clearing device memory", e))
        })
    }

    fn copy_from(
        &self,
        offset: usize,
        src: &dyn Buffer,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        self.check_range(offset, len)?;
        src.check_range(src_offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let dst = self.ptr + offset as u64;
        if let Some(s) = src.as_any().downcast_ref::<CudaBuffer>() {
            let from = s.ptr + src_offset as u64;
            return self.dev.blocking(|stream| {
                // SAFETY: both ranges were checked.
                let r = unsafe {
                    if s.dev.ordinal == self.dev.ordinal {
                        sys::cuMemcpyDtoDAsync_v2(dst, from, len, stream)
                    } else {
                        sys::cuMemcpyPeerAsync(
                            dst,
                            self.dev.ctx.cu_ctx(),
                            from,
                            s.dev.ctx.cu_ctx(),
                            len,
                            stream,
                        )
                    }
                };
                r.result()
                    .map_err(|e| self.dev.err("copying between buffers", e))
            });
        }
        if let Some(p) = src.host_ptr() {
            // SAFETY: host_ptr is the start of the source's host memory, checked to hold the range.
            let bytes = unsafe { std::slice::from_raw_parts(p.add(src_offset) as *const u8, len) };
            return self.set(offset, bytes);
        }
        let mut staging = vec![0u8; len];
        src.get(src_offset, &mut staging)?;
        self.set(offset, &staging)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Allocates [`CudaBuffer`]s on one GPU.
pub struct CudaBufferType {
    pub(crate) dev: Arc<DeviceShared>,
}

impl BufferType for CudaBufferType {
    fn name(&self) -> String {
        self.dev.name.clone()
    }

    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        let dev = self.dev.clone();
        let ptr = dev.blocking(|s| dev.pool.alloc(&dev, size, s))?;
        Ok(Arc::new(CudaBuffer { dev, ptr, size }))
    }

    fn alignment(&self) -> usize {
        ALIGNMENT
    }

    fn max_size(&self) -> usize {
        self.dev.total_mem
    }

    fn is_host(&self) -> bool {
        false
    }
}

/// Page-locked host memory: the CPU reads and writes it directly, and the GPU copies from and
/// to it asynchronously at full bus speed.
pub struct PinnedBuffer {
    dev: Arc<DeviceShared>,
    ptr: *mut u8,
    size: usize,
}

// SAFETY: the memory is plain host memory owned by this object; concurrent access follows the
// trait's rule that callers never read and write one region at once.
unsafe impl Send for PinnedBuffer {}
// SAFETY: as above.
unsafe impl Sync for PinnedBuffer {}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if self.ptr.is_null() {
            return;
        }
        // Copies into or out of the memory may still be queued.
        if let Err(e) = self.dev.synchronize_all() {
            log::warn!("{}: {e}", self.dev.name);
        }
        // SAFETY: ptr came from cuMemHostAlloc and is freed once.
        if let Err(e) = unsafe { sys::cuMemFreeHost(self.ptr.cast()) }.result() {
            log::warn!(
                "{}: freeing pinned memory failed: {}",
                self.dev.name,
                crate::driver::describe(e)
            );
        }
    }
}

impl Buffer for PinnedBuffer {
    fn name(&self) -> String {
        format!("{} pinned", self.dev.name)
    }

    fn size(&self) -> usize {
        self.size
    }

    fn host_ptr(&self) -> Option<*mut u8> {
        Some(self.ptr)
    }

    fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len())?;
        if !data.is_empty() {
            // SAFETY: the range lies inside the allocation (checked).
            unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(offset), data.len())
            };
        }
        Ok(())
    }

    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len())?;
        if !out.is_empty() {
            // SAFETY: the range lies inside the allocation (checked).
            unsafe {
                std::ptr::copy_nonoverlapping(self.ptr.add(offset), out.as_mut_ptr(), out.len())
            };
        }
        Ok(())
    }

    fn clear(&self, value: u8) -> Result<()> {
        if self.size > 0 {
            // SAFETY: the whole allocation is written.
            unsafe { std::ptr::write_bytes(self.ptr, value, self.size) };
        }
        Ok(())
    }

    fn copy_from(
        &self,
        offset: usize,
        src: &dyn Buffer,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        self.check_range(offset, len)?;
        // SAFETY: the range lies inside the allocation (checked).
        let out = unsafe { std::slice::from_raw_parts_mut(self.ptr.add(offset), len) };
        src.get(src_offset, out)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Allocates [`PinnedBuffer`]s for one GPU.
pub struct PinnedBufferType {
    pub(crate) dev: Arc<DeviceShared>,
}

impl BufferType for PinnedBufferType {
    fn name(&self) -> String {
        format!("{} pinned", self.dev.name)
    }

    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        let dev = self.dev.clone();
        let mut ptr: *mut std::ffi::c_void = std::ptr::null_mut();
        if size > 0 {
            dev.bind()?;
            // SAFETY: ptr is a valid out-pointer. Flag 1 = CU_MEMHOSTALLOC_PORTABLE (usable
            // from every context).
            let r = unsafe { sys::cuMemHostAlloc(&mut ptr, size, 1) }.result();
            match r {
                Ok(()) => {}
                Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                    return Err(Error::OutOfMemory {
                        device: format!("{} pinned", dev.name),
                        bytes: size,
                    })
                }
                Err(e) => return Err(dev.err("allocating pinned memory", e)),
            }
        }
        Ok(Arc::new(PinnedBuffer {
            dev,
            ptr: ptr.cast(),
            size,
        }))
    }

    fn alignment(&self) -> usize {
        ALIGNMENT
    }

    fn is_host(&self) -> bool {
        true
    }
}
