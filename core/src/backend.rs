//! The backend traits: [`Device`], [`BufferType`], [`Buffer`], [`Backend`], [`Event`] and
//! [`Communicator`], and the [`BackendReg`] through which the [`crate::Registry`] finds devices.
//!
//! # Rules every backend keeps
//!
//! - **Who checks what.** Graph builders ([`crate::Graph`]) check shapes, strides and types
//!   when a node is made. A backend may assume a graph it is given is well formed, but must
//!   check that every tensor it touches has memory it can reach ([`Device::can_use_buffer`]) and
//!   return [`Error::Unsupported`] for an op or type it lacks; [`Device::supports_op`] lets the
//!   scheduler ask first. Buffers check every offset and length against their size.
//! - **Nothing panics.** A missing driver or library means the backend lists no devices and
//!   says why ([`BackendReg::devices`]); an allocation that fails is [`Error::OutOfMemory`]; a
//!   driver error is [`Error::Device`].
//! - **Optional capabilities are default methods** that fall back to something slower but
//!   always correct: async copies fall back to blocking ones, a 2-D copy to a loop of rows, a
//!   copy between devices to host staging, events to a full synchronize, an all-reduce to the
//!   meta layer's generic host path ([`Device::communicator`] returning `None`), a backend's
//!   own host staging ([`Backend::new_staging`]) to ordinary memory moved by the async copies.
//! - **Ordering.** Work submitted to one [`Backend`] runs in submission order. Blocking
//!   [`Buffer`] calls wait for nothing: before touching a buffer a backend writes
//!   asynchronously, call [`Backend::synchronize`] (or wait on an [`Event`]).
//! - **Memory.** A [`Buffer`] is shared (`Arc`) and written through `&self`: like device memory,
//!   it is the caller's job (the scheduler's) not to read and write one region concurrently.
//! - **Static names.** A device's name is its spec: `cpu`, `cuda:0`, `wgpu:1`; meta devices are
//!   `meta:<spec>,<spec>...`.

use std::any::Any;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::staging::{HostStaging, StagedView, Staging};
use crate::tensor::TensorId;

/// What sort of device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// The host processor.
    Cpu,
    /// A discrete GPU.
    Gpu,
    /// An integrated GPU (shares host memory).
    IGpu,
    /// A software or otherwise slow adapter (e.g. lavapipe).
    Software,
    /// A device made of other devices (the sharding layer).
    Meta,
}

impl DeviceKind {
    /// Lower-case name for listings.
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Gpu => "gpu",
            DeviceKind::IGpu => "igpu",
            DeviceKind::Software => "software",
            DeviceKind::Meta => "meta",
        }
    }
}

/// Bytes free and in total on a device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// Free bytes (as well as the device can tell).
    pub free: usize,
    /// All bytes.
    pub total: usize,
}

/// Host memory that a buffer may wrap without copying (a mapped file, say).
pub trait HostBytes: Send + Sync {
    /// The bytes.
    fn bytes(&self) -> &[u8];
}

impl HostBytes for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl HostBytes for memmap2::Mmap {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// A device: something with memory that runs graphs.
pub trait Device: Send + Sync {
    /// The spec that names it: `cpu`, `cuda:0`, `wgpu:0`, `meta:cpu,cpu`.
    fn name(&self) -> String;
    /// A human description (model, driver).
    fn description(&self) -> String;
    /// The sort of device.
    fn kind(&self) -> DeviceKind;
    /// Memory free and in total.
    fn memory(&self) -> Memory;
    /// The default buffer type (device memory).
    fn buffer_type(&self) -> Arc<dyn BufferType>;
    /// A host buffer type the device reads fast from (pinned memory), if it has one.
    fn host_buffer_type(&self) -> Option<Arc<dyn BufferType>> {
        None
    }
    /// Opens a stream on the device.
    fn new_backend(&self) -> Result<Box<dyn Backend>>;
    /// Whether the device can run node `id` of `graph` (op and types).
    fn supports_op(&self, graph: &Graph, id: TensorId) -> bool;
    /// Whether the device's kernels can read and write this buffer directly.
    fn can_use_buffer(&self, buffer: &dyn Buffer) -> bool;
    /// A buffer over host memory, without copying, where the device can use host memory
    /// directly (the CPU, integrated GPUs). `Ok(None)`: not supported, copy instead.
    fn buffer_from_host(&self, _bytes: Arc<dyn HostBytes>) -> Result<Option<Arc<dyn Buffer>>> {
        Ok(None)
    }
    /// The devices this one is made of (a meta device); empty for a plain device.
    fn parts(&self) -> Vec<Arc<dyn Device>> {
        Vec::new()
    }
    /// Does now the work the device would otherwise do at the first use of its ops (compiling
    /// and loading GPU kernels), calling `progress(done, total)` as steps finish, so that a
    /// caller can show it and the first computation starts at full speed. Nothing to do by
    /// default; a meta device prepares its parts one after another (each counting from 0).
    fn prepare(&self, _progress: &mut dyn FnMut(usize, usize)) -> Result<()> {
        Ok(())
    }
    /// A communicator that all-reduces over `devices` (all of this device's backend kind),
    /// where the backend has one (NCCL for CUDA). `Ok(None)`: use the generic path.
    fn communicator(&self, _devices: &[Arc<dyn Device>]) -> Result<Option<Box<dyn Communicator>>> {
        Ok(None)
    }
    /// The device as `Any`, for backends that need their own concrete type back.
    fn as_any(&self) -> &dyn Any;
}

/// Allocates buffers of one kind of memory.
pub trait BufferType: Send + Sync {
    /// A name for listings and errors (`cpu`, `cuda:0`, `cuda:0 pinned`).
    fn name(&self) -> String;
    /// Allocates `size` bytes; [`Error::OutOfMemory`] when it cannot.
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>>;
    /// Alignment of tensor offsets in its buffers.
    fn alignment(&self) -> usize {
        64
    }
    /// Largest single buffer.
    fn max_size(&self) -> usize {
        usize::MAX
    }
    /// Whether its memory is host memory the CPU can read directly.
    fn is_host(&self) -> bool;
}

/// A block of memory on a device holding tensors at offsets.
pub trait Buffer: Send + Sync + Any {
    /// Name of the buffer's type and device, for errors.
    fn name(&self) -> String;
    /// Size in bytes.
    fn size(&self) -> usize;
    /// Whether the CPU can read its bytes through [`Buffer::host_ptr`].
    fn is_host(&self) -> bool {
        self.host_ptr().is_some()
    }
    /// The address of byte 0 where the memory is host memory.
    fn host_ptr(&self) -> Option<*mut u8> {
        None
    }
    /// Writes `data` at `offset` (blocking).
    fn set(&self, offset: usize, data: &[u8]) -> Result<()>;
    /// Reads `out.len()` bytes from `offset` (blocking).
    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()>;
    /// Fills the buffer with one byte value.
    fn clear(&self, value: u8) -> Result<()>;
    /// Copies `len` bytes from `src` at `src_offset` into this buffer at `offset`. The default
    /// stages through host memory; backends override it for copies they can do directly.
    fn copy_from(
        &self,
        offset: usize,
        src: &dyn Buffer,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        let mut staging = vec![0u8; len];
        src.get(src_offset, &mut staging)?;
        self.set(offset, &staging)
    }
    /// Writes `rows` rows of `row_len` bytes from `data` (rows `src_pitch` apart) to rows
    /// `dst_pitch` apart from `offset`. The default loops over rows.
    fn set_2d(
        &self,
        offset: usize,
        dst_pitch: usize,
        data: &[u8],
        src_pitch: usize,
        row_len: usize,
        rows: usize,
    ) -> Result<()> {
        for r in 0..rows {
            let s = r * src_pitch;
            let row = data
                .get(s..s + row_len)
                .ok_or_else(|| self.range_error(s, row_len))?;
            self.set(offset + r * dst_pitch, row)?;
        }
        Ok(())
    }
    /// Reads `rows` rows of `row_len` bytes, `src_pitch` apart from `offset`, into `out` rows
    /// `dst_pitch` apart. The default loops over rows.
    fn get_2d(
        &self,
        offset: usize,
        src_pitch: usize,
        out: &mut [u8],
        dst_pitch: usize,
        row_len: usize,
        rows: usize,
    ) -> Result<()> {
        for r in 0..rows {
            let d = r * dst_pitch;
            let len = out.len();
            let row = out.get_mut(d..d + row_len).ok_or_else(|| Error::Buffer {
                buffer: "(host)".into(),
                reason: format!("row {r} at {d}+{row_len} past the {len}-byte destination"),
            })?;
            self.get(offset + r * src_pitch, row)?;
        }
        Ok(())
    }
    /// The buffer as `Any`, for a backend to reach its own type.
    fn as_any(&self) -> &dyn Any;
    /// An error for an access past the end (helper for implementations).
    fn range_error(&self, offset: usize, len: usize) -> Error {
        Error::Buffer {
            buffer: self.name(),
            reason: format!(
                "access {offset}..{} is past its {} bytes",
                offset.saturating_add(len),
                self.size()
            ),
        }
    }
    /// Checks `offset..offset+len` lies inside the buffer.
    fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size() => Ok(()),
            _ => Err(self.range_error(offset, len)),
        }
    }
}

/// A point in a backend's stream that another backend (or the host) can wait for.
pub trait Event: Send + Sync {
    /// Blocks the host until the event has happened.
    fn synchronize(&self) -> Result<()>;
    /// The event as `Any`.
    fn as_any(&self) -> &dyn Any;
}

/// A stream of work on one device.
pub trait Backend: Send {
    /// The device's name.
    fn name(&self) -> String;
    /// Runs the nodes `nodes` of `graph` (in order; views and leaves among them are skipped).
    /// May return before the work is done; [`Backend::synchronize`] waits for it.
    fn compute(&mut self, graph: &Graph, nodes: &[TensorId]) -> Result<()>;
    /// Waits for everything submitted so far.
    fn synchronize(&mut self) -> Result<()>;
    /// Writes host bytes into a buffer, ordered with this stream. Default: blocking, after a
    /// synchronize.
    fn set_async(&mut self, buffer: &dyn Buffer, offset: usize, data: &[u8]) -> Result<()> {
        self.synchronize()?;
        buffer.set(offset, data)
    }
    /// Reads bytes of a buffer, ordered with this stream. Default: blocking, after a synchronize.
    /// With a true async implementation the bytes are valid only after the next synchronize.
    fn get_async(&mut self, buffer: &dyn Buffer, offset: usize, out: &mut [u8]) -> Result<()> {
        self.synchronize()?;
        buffer.get(offset, out)
    }
    /// Copies between buffers (possibly of another backend kind), ordered with this stream.
    /// Default: a synchronize, then [`Buffer::copy_from`].
    fn copy_async(
        &mut self,
        src: &dyn Buffer,
        src_offset: usize,
        dst: &dyn Buffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        self.synchronize()?;
        dst.copy_from(dst_offset, src, src_offset, len)
    }
    /// Staging for round trips of up to `bytes` between this backend's buffers and host
    /// memory (see [`crate::staging`]), kept by the caller between transfers. Default:
    /// [`HostStaging`], ordinary memory moved by [`Backend::get_async`] and
    /// [`Backend::set_async`].
    fn new_staging(&mut self, bytes: usize) -> Result<Box<dyn Staging>> {
        Ok(Box::new(HostStaging::new(bytes)))
    }
    /// Starts reading `len` bytes of `buffer` from `offset` into `staging` (made by this
    /// backend's [`Backend::new_staging`]), ordered after the work submitted so far; waits for
    /// nothing.
    fn stage_read(
        &mut self,
        staging: &mut dyn Staging,
        buffer: &dyn Buffer,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        crate::staging::host_staging(staging)?.read(self, buffer, offset, len)
    }
    /// Waits for the read last started into `staging` and hands out its host view.
    fn staged<'a>(&mut self, staging: &'a mut dyn Staging) -> Result<StagedView<'a>> {
        crate::staging::host_staging(staging)?.view(self)
    }
    /// Starts writing the first `len` bytes written into `staging`'s view (at most the read's
    /// length) into `buffer` at `offset`, ordered after the read into `staging` and before the
    /// work submitted later (work submitted between that read and this write must not touch
    /// the range); the view must not be used again.
    fn stage_write(
        &mut self,
        staging: &mut dyn Staging,
        buffer: &dyn Buffer,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        crate::staging::host_staging(staging)?.write(self, buffer, offset, len)
    }
    /// Records an event after the work submitted so far. Default: `None` (callers then
    /// synchronize the whole backend instead).
    fn record_event(&mut self) -> Result<Option<Arc<dyn Event>>> {
        Ok(None)
    }
    /// Makes later work on this stream wait for an event of another stream. Default: wait on
    /// the host.
    fn wait_event(&mut self, event: &dyn Event) -> Result<()> {
        event.synchronize()
    }
    /// The backend as `Any`, for a communicator of its own kind to reach its stream. Default:
    /// `None`.
    fn as_any_mut(&mut self) -> Option<&mut dyn Any> {
        None
    }
}

/// Element type of an all-reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceType {
    /// Sum in f32.
    F32,
    /// Sum in bf16 (large tensors, when asked).
    BF16,
}

/// A backend-provided all-reduce over a fixed set of devices (one rank per device), ordered on
/// the ranks' streams: it runs after the work already submitted to each rank's backend and
/// before work submitted later, and the host does not wait for it.
pub trait Communicator: Send {
    /// What carries the sums (`nccl`, `peer`), for logs and reports.
    fn name(&self) -> String;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// Sums `count` elements at each `(buffer, offset)` (one per rank, in rank order) and
    /// leaves the sum in every one, in place, ordered on `backends[j]`'s stream for rank `j`.
    /// The backends are streams of the ranks' devices, in rank order.
    fn all_reduce(
        &mut self,
        backends: &mut [Box<dyn Backend>],
        bufs: &[(Arc<dyn Buffer>, usize)],
        count: usize,
        dtype: ReduceType,
    ) -> Result<()>;
    /// Lets the ranks' backends (in rank order) run [`crate::Op::AllReduce`] nodes of f32
    /// tensors inside their own graphs, with no host step between the ranks; returns the most
    /// elements one such node may hold, 0 where the communicator cannot do it (the default).
    fn attach(&mut self, _backends: &mut [Box<dyn Backend>]) -> Result<usize> {
        Ok(0)
    }
}

/// A backend's entry in the registry.
pub trait BackendReg: Send + Sync {
    /// The backend's name: `cpu`, `cuda`, `wgpu`.
    fn name(&self) -> &'static str;
    /// Its devices, or the reason it has none here (a missing driver or library).
    fn devices(&self) -> std::result::Result<Vec<Arc<dyn Device>>, String>;
}

impl HostBytes for crate::gguf::GgufBytes {
    fn bytes(&self) -> &[u8] {
        self.as_slice()
    }
}
