//! Device memory: [`WgpuBufferType`] allocates [`WgpuBuffer`]s, wgpu storage buffers written
//! through queue writes and read through mapped staging buffers.
//!
//! wgpu copies only 4-byte-aligned ranges; a write that starts or ends inside a word first
//! reads the partial words back and merges them. A tensor is bound to a shader as a window of
//! at most the adapter's largest storage binding ([`WgpuBuffer::window`]), so a buffer may be
//! larger than one binding (a file of weights) as long as each tensor fits in one.

use std::any::Any;
use std::sync::Arc;

use tessera_core::backend::{Buffer, BufferType};
use tessera_core::{Error, Result};

use crate::context::{Gpu, Window};

/// Bytes past the end of every allocation, so that shaders reading a whole word (or the word
/// after an unaligned one) at a tensor's last byte stay inside the buffer.
const TAIL: u64 = 16;

/// Allocates storage buffers on one wgpu device.
pub struct WgpuBufferType {
    pub(crate) gpu: Arc<Gpu>,
}

impl BufferType for WgpuBufferType {
    fn name(&self) -> String {
        self.gpu.name.clone()
    }

    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        Ok(Arc::new(WgpuBuffer::new(&self.gpu, size)?))
    }

    fn alignment(&self) -> usize {
        self.gpu.limits.min_storage_buffer_offset_alignment.max(64) as usize
    }

    fn max_size(&self) -> usize {
        usize::try_from(self.gpu.limits.max_buffer_size.saturating_sub(TAIL)).unwrap_or(usize::MAX)
    }

    fn is_host(&self) -> bool {
        false
    }
}

/// A wgpu storage buffer holding tensors.
pub struct WgpuBuffer {
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) buffer: wgpu::Buffer,
    pub(crate) id: u64,
    size: usize,
}

impl WgpuBuffer {
    /// Allocates `size` bytes (plus a small tail); out-of-memory and sizes past the limits are
    /// errors.
    pub(crate) fn new(gpu: &Arc<Gpu>, size: usize) -> Result<WgpuBuffer> {
        let alloc = (size as u64).div_ceil(4) * 4 + TAIL;
        if alloc > gpu.limits.max_buffer_size {
            return Err(Error::Buffer {
                buffer: gpu.name.clone(),
                reason: format!(
                    "{size} bytes is past the adapter's largest buffer ({} bytes)",
                    gpu.limits.max_buffer_size
                ),
            });
        }
        if let Some(limit) = gpu.options.memory_limit {
            let used = gpu.allocated.load(std::sync::atomic::Ordering::Relaxed);
            if used.saturating_add(alloc as usize) > limit {
                return Err(Error::OutOfMemory {
                    device: format!("{} (limited to {limit} bytes)", gpu.name),
                    bytes: size,
                });
            }
        }
        let buffer = gpu.scoped(
            || {
                gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("tessera"),
                    size: alloc,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_DST
                        | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                })
            },
            || Error::OutOfMemory {
                device: gpu.name.clone(),
                bytes: size,
            },
            |e| Error::Buffer {
                buffer: gpu.name.clone(),
                reason: format!("allocating {size} bytes: {e}"),
            },
        )?;
        gpu.allocated
            .fetch_add(alloc as usize, std::sync::atomic::Ordering::Relaxed);
        Ok(WgpuBuffer {
            gpu: gpu.clone(),
            buffer,
            id: gpu.next_id(),
            size,
        })
    }

    /// The window to bind for a tensor at `offset` spanning `len` bytes, and the tensor's byte
    /// offset inside it. The whole buffer when it fits one binding; otherwise a window of the
    /// largest binding size starting at the aligned offset at or below the tensor.
    pub(crate) fn window(&self, offset: usize, len: usize, what: &str) -> Result<(Window, u32)> {
        let total = self.buffer.size();
        let max = self.gpu.max_binding();
        let (base, size) = if total <= max {
            (0, total)
        } else {
            let align = u64::from(self.gpu.limits.min_storage_buffer_offset_alignment.max(4));
            let base = offset as u64 / align * align;
            (base, max.min(total - base))
        };
        let end = (offset + len) as u64 + if base + size == total { 0 } else { 8 };
        if end > base + size {
            return Err(Error::Buffer {
                buffer: self.name(),
                reason: format!(
                    "{what} spans {len} bytes from byte {offset}, past the adapter's largest storage binding ({max} bytes); split the tensor"
                ),
            });
        }
        Ok((
            Window {
                id: self.id,
                base,
                size,
            },
            (offset as u64 - base) as u32,
        ))
    }

    /// Starts reading `len` bytes (at least one) from `offset` into host memory: copies the
    /// 4-byte words that hold them into `staging` (a buffer of [`staging_buffer`] of at least
    /// [`read_size`] bytes) after the commands already in `enc`, submits `enc` and asks for
    /// `staging` to be mapped. The bytes are ready once the device has been waited on
    /// ([`Readback::finish`]).
    pub(crate) fn start_read(
        &self,
        offset: usize,
        len: usize,
        staging: wgpu::Buffer,
        mut enc: wgpu::CommandEncoder,
    ) -> Result<Readback> {
        let start = offset as u64 / 4 * 4;
        let size = read_size(offset, len);
        enc.copy_buffer_to_buffer(&self.buffer, start, &staging, 0, size);
        self.gpu.queue.submit([enc.finish()]);
        let (tx, mapped) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, ..size, move |r| {
            let _ = tx.send(r);
        });
        Ok(Readback {
            staging,
            size,
            skip: (offset as u64 - start) as usize,
            mapped,
        })
    }

    /// Reads `out.len()` bytes (at least one) from `offset`, waiting for them; the bytes may
    /// lie in the words past [`Buffer::size`] (the partial words of [`Buffer::set`]).
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let staging = staging_buffer(&self.gpu, read_size(offset, out.len()))?;
        let enc = self
            .gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        let r = self.start_read(offset, out.len(), staging, enc)?;
        self.gpu.wait()?;
        r.finish(&self.gpu, out).map(drop)
    }

    /// Writes 4-byte-aligned `data` at aligned `start`, and flushes the write to the queue.
    fn write_aligned(&self, start: u64, data: &[u8]) -> Result<()> {
        self.gpu.queue.write_buffer(&self.buffer, start, data);
        self.gpu.queue.submit([]);
        self.gpu.check()
    }
}

impl Drop for WgpuBuffer {
    fn drop(&mut self) {
        self.gpu.forget_buffer(self.id);
        self.gpu.allocated.fetch_sub(
            self.buffer.size() as usize,
            std::sync::atomic::Ordering::Relaxed,
        );
    }
}

impl Buffer for WgpuBuffer {
    fn name(&self) -> String {
        format!("{} buffer", self.gpu.name)
    }

    fn size(&self) -> usize {
        self.size
    }

    fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        let start = offset as u64 / 4 * 4;
        let end = (offset + data.len()) as u64;
        let aend = end.div_ceil(4) * 4;
        if start == offset as u64 && aend == end {
            return self.write_aligned(start, data);
        }
        // Merge the partial words at either end with what the buffer holds.
        let mut words = vec![0u8; (aend - start) as usize];
        self.read(start as usize, &mut words[..4])?;
        let n = words.len();
        self.read(aend as usize - 4, &mut words[n - 4..])?;
        let at = (offset as u64 - start) as usize;
        words[at..at + data.len()].copy_from_slice(data);
        self.write_aligned(start, &words)
    }

    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        self.read(offset, out)
    }

    fn clear(&self, value: u8) -> Result<()> {
        if value == 0 {
            let mut enc = self
                .gpu
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
            enc.clear_buffer(&self.buffer, 0, None);
            self.gpu.queue.submit([enc.finish()]);
            return self.gpu.check();
        }
        const CHUNK: usize = 1 << 22;
        let total = self.buffer.size() as usize;
        let fill = vec![value; CHUNK.min(total)];
        let mut at = 0;
        while at < total {
            let n = CHUNK.min(total - at);
            self.gpu
                .queue
                .write_buffer(&self.buffer, at as u64, &fill[..n]);
            at += n;
        }
        self.gpu.queue.submit([]);
        self.gpu.check()
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
        let direct = src.as_any().downcast_ref::<WgpuBuffer>().filter(|s| {
            Arc::ptr_eq(&s.gpu, &self.gpu)
                && s.id != self.id
                && (offset | src_offset | len) & 3 == 0
        });
        match direct {
            Some(s) => {
                let mut enc = self
                    .gpu
                    .device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
                enc.copy_buffer_to_buffer(
                    &s.buffer,
                    src_offset as u64,
                    &self.buffer,
                    offset as u64,
                    len as u64,
                );
                self.gpu.queue.submit([enc.finish()]);
                self.gpu.check()
            }
            None => {
                let mut staging = vec![0u8; len];
                src.get(src_offset, &mut staging)?;
                self.set(offset, &staging)
            }
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Bytes of staging a read of `len` bytes from `offset` copies: the 4-byte words that hold them.
pub(crate) fn read_size(offset: usize, len: usize) -> u64 {
    ((offset + len) as u64).div_ceil(4) * 4 - offset as u64 / 4 * 4
}

/// Bytes a copy out of mapped memory moves per thread: larger reads (a host all-reduce's
/// chunks, a step's logits) go on several threads, which together reach more of the host's
/// memory bandwidth than one.
const COPY_PIECE: usize = 1 << 20;

/// `out.copy_from_slice(src)`, on several threads when large.
pub(crate) fn copy_out(out: &mut [u8], src: &[u8]) {
    use rayon::prelude::*;
    if out.len() <= COPY_PIECE {
        out.copy_from_slice(src);
        return;
    }
    out.par_chunks_mut(COPY_PIECE)
        .zip(src.par_chunks(COPY_PIECE))
        .for_each(|(o, s)| o.copy_from_slice(s));
}

/// A mappable buffer of `size` bytes that reads are copied into.
pub(crate) fn staging_buffer(gpu: &Gpu, size: u64) -> Result<wgpu::Buffer> {
    let usage = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
    gpu.new_buffer("tessera staging", size, usage)
}

/// A read started by [`WgpuBuffer::start_read`]: its staging buffer being mapped.
pub(crate) struct Readback {
    staging: wgpu::Buffer,
    /// Bytes copied into `staging`.
    size: u64,
    /// Bytes before the ones asked for.
    skip: usize,
    /// The mapping's outcome, sent once the device is polled.
    mapped: std::sync::mpsc::Receiver<std::result::Result<(), wgpu::BufferAsyncError>>,
}

impl Readback {
    /// After the device has been waited on: copies the bytes read into `out` (as many as were
    /// asked for) and returns the staging buffer, unmapped, for another read.
    pub(crate) fn finish(self, gpu: &Gpu, out: &mut [u8]) -> Result<wgpu::Buffer> {
        if !matches!(self.mapped.try_recv(), Ok(Ok(()))) {
            return Err(gpu.err(format!(
                "mapping {} bytes of staging for reading failed",
                self.size
            )));
        }
        {
            let view = self
                .staging
                .get_mapped_range(..self.size)
                .map_err(|e| gpu.err(format!("reading a mapped buffer: {e}")))?;
            copy_out(out, &view[self.skip..self.skip + out.len()]);
        }
        self.staging.unmap();
        Ok(self.staging)
    }
}

/// The buffer type of a device whose adapter could not be opened: every allocation fails
/// with the reason.
pub(crate) struct UnopenedBufferType {
    pub(crate) name: String,
    pub(crate) reason: String,
}

impl BufferType for UnopenedBufferType {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn alloc(&self, _size: usize) -> Result<Arc<dyn Buffer>> {
        Err(Error::Device {
            device: self.name.clone(),
            reason: self.reason.clone(),
        })
    }

    fn is_host(&self) -> bool {
        false
    }
}
