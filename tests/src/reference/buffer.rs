//! Host memory for the reference device.

use std::any::Any;
use std::sync::{Arc, Mutex, MutexGuard};

use tessera_core::{Buffer, BufferType, Error, Result};

/// Allocates [`HostBuffer`]s.
pub(crate) struct HostBufferType;

impl BufferType for HostBufferType {
    fn name(&self) -> String {
        "ref-f64".into()
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        let mut v = Vec::new();
        v.try_reserve_exact(size).map_err(|_| Error::OutOfMemory {
            device: "ref-f64".into(),
            bytes: size,
        })?;
        v.resize(size, 0);
        Ok(Arc::new(HostBuffer(Mutex::new(v))))
    }
    fn is_host(&self) -> bool {
        true
    }
}

/// Bytes in host memory behind a lock (the reference never hands out raw pointers).
pub(crate) struct HostBuffer(Mutex<Vec<u8>>);

impl HostBuffer {
    fn bytes(&self) -> MutexGuard<'_, Vec<u8>> {
        // A poisoned lock only means another thread panicked mid-copy; the bytes are still bytes.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Buffer for HostBuffer {
    fn name(&self) -> String {
        "ref-f64".into()
    }
    fn size(&self) -> usize {
        self.bytes().len()
    }
    fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len())?;
        self.bytes()[offset..offset + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len())?;
        out.copy_from_slice(&self.bytes()[offset..offset + out.len()]);
        Ok(())
    }
    fn clear(&self, value: u8) -> Result<()> {
        self.bytes().fill(value);
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
