//! Host memory: [`CpuBufferType`] allocates 64-byte aligned blocks; [`CpuBuffer`] owns such a
//! block or wraps caller-provided bytes (a mapped GGUF file, say) read-only, without copying.
//!
//! # Safety
//!
//! An owned buffer's pointer comes from `std::alloc::alloc_zeroed` with the layout stored next
//! to it and is freed with that layout on drop; every access goes through [`Buffer::check_range`]
//! first. Like device memory, a buffer is written through `&self`: the backend rules
//! (`tessera_core::backend`) make it the caller's job not to read and write one region at once.

use std::alloc::Layout;
use std::any::Any;
use std::ptr::NonNull;
use std::sync::Arc;

use tessera_core::backend::HostBytes;
use tessera_core::{Buffer, BufferType, Error, Result};

/// Alignment of every owned CPU buffer and of tensor offsets in it (a cache line; enough for
/// any SIMD load).
pub const CPU_ALIGNMENT: usize = 64;

/// Allocates [`CpuBuffer`]s of host memory.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBufferType;

impl BufferType for CpuBufferType {
    fn name(&self) -> String {
        "cpu".into()
    }

    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        Ok(Arc::new(CpuBuffer::new(size)?))
    }

    fn alignment(&self) -> usize {
        CPU_ALIGNMENT
    }

    fn max_size(&self) -> usize {
        isize::MAX as usize - CPU_ALIGNMENT
    }

    fn is_host(&self) -> bool {
        true
    }
}

/// Where a buffer's bytes live.
enum Storage {
    /// Memory this buffer allocated (`None` for a zero-size buffer).
    Owned {
        ptr: Option<NonNull<u8>>,
        layout: Layout,
    },
    /// Caller-provided bytes, read-only.
    Host(Arc<dyn HostBytes>),
}

/// A block of host memory: owned and writable, or wrapped caller bytes that are read-only.
pub struct CpuBuffer {
    storage: Storage,
}

// SAFETY: the owned pointer is uniquely owned by this buffer and freed only on drop; concurrent
// access to the bytes follows the backend rules (callers never read and write one region at
// once), exactly as for a `Vec<u8>` shared through raw pointers. `HostBytes` is `Send + Sync`.
unsafe impl Send for CpuBuffer {}
// SAFETY: see `Send` above.
unsafe impl Sync for CpuBuffer {}

impl CpuBuffer {
    /// Allocates `size` zeroed bytes aligned to [`CPU_ALIGNMENT`]; [`Error::OutOfMemory`] when
    /// the system refuses (never an abort). A zero-size buffer allocates nothing.
    pub fn new(size: usize) -> Result<Self> {
        let oom = || Error::OutOfMemory {
            device: "cpu".into(),
            bytes: size,
        };
        let layout = Layout::from_size_align(size, CPU_ALIGNMENT).map_err(|_| oom())?;
        if size == 0 {
            return Ok(CpuBuffer {
                storage: Storage::Owned { ptr: None, layout },
            });
        }
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(oom)?;
        Ok(CpuBuffer {
            storage: Storage::Owned {
                ptr: Some(ptr),
                layout,
            },
        })
    }

    /// Wraps caller bytes without copying; the buffer is read-only.
    pub fn from_host(bytes: Arc<dyn HostBytes>) -> Self {
        CpuBuffer {
            storage: Storage::Host(bytes),
        }
    }

    /// Whether writes are refused (the buffer wraps caller bytes).
    pub fn is_read_only(&self) -> bool {
        matches!(self.storage, Storage::Host(_))
    }

    /// The start address (dangling but aligned for an empty owned buffer).
    fn base(&self) -> *mut u8 {
        match &self.storage {
            Storage::Owned { ptr, .. } => ptr.map_or(NonNull::dangling().as_ptr(), NonNull::as_ptr),
            Storage::Host(b) => b.bytes().as_ptr().cast_mut(),
        }
    }

    /// An error for a write into read-only bytes.
    fn read_only_error(&self) -> Error {
        Error::Buffer {
            buffer: self.name(),
            reason: "it wraps read-only host bytes and cannot be written".into(),
        }
    }

    /// The writable start address, or an error for a read-only buffer.
    fn writable_base(&self) -> Result<*mut u8> {
        if self.is_read_only() {
            return Err(self.read_only_error());
        }
        Ok(self.base())
    }
}

impl Drop for CpuBuffer {
    fn drop(&mut self) {
        if let Storage::Owned {
            ptr: Some(p),
            layout,
        } = &self.storage
        {
            // SAFETY: `p` was allocated in `new` with exactly this layout and is freed once.
            unsafe { std::alloc::dealloc(p.as_ptr(), *layout) };
        }
    }
}

impl Buffer for CpuBuffer {
    fn name(&self) -> String {
        if self.is_read_only() {
            "cpu (read-only host bytes)".into()
        } else {
            "cpu".into()
        }
    }

    fn size(&self) -> usize {
        match &self.storage {
            Storage::Owned { layout, .. } => layout.size(),
            Storage::Host(b) => b.bytes().len(),
        }
    }

    fn host_ptr(&self) -> Option<*mut u8> {
        Some(self.base())
    }

    fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len())?;
        let base = self.writable_base()?;
        // SAFETY: the range was checked above; `data` is a distinct borrow, so a plain copy is
        // correct unless the caller passes this buffer's own bytes, which `copy` tolerates.
        unsafe { std::ptr::copy(data.as_ptr(), base.add(offset), data.len()) };
        Ok(())
    }

    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len())?;
        // SAFETY: the range was checked above.
        unsafe { std::ptr::copy(self.base().add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn clear(&self, value: u8) -> Result<()> {
        let base = self.writable_base()?;
        // SAFETY: writes exactly the buffer's own bytes.
        unsafe { std::ptr::write_bytes(base, value, self.size()) };
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
        let Some(sp) = src.host_ptr() else {
            let mut staging = vec![0u8; len];
            src.get(src_offset, &mut staging)?;
            return self.set(offset, &staging);
        };
        src.check_range(src_offset, len)?;
        let base = self.writable_base()?;
        // SAFETY: both ranges were checked; `copy` allows them to overlap (same buffer).
        unsafe { std::ptr::copy(sp.add(src_offset), base.add(offset), len) };
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
