//! The CPU's registry entry [`CpuBackendReg`] and its one device, [`CpuDevice`].

use std::any::Any;
use std::sync::Arc;

use tessera_core::backend::HostBytes;
use tessera_core::graph::Graph;
use tessera_core::{
    Backend, BackendReg, Buffer, BufferType, Device, DeviceKind, Memory, Result, TensorId,
};

use crate::backend::CpuBackend;
use crate::buffer::{CpuBuffer, CpuBufferType};
use crate::options::CpuOptions;
use crate::{host, ops};

/// The CPU backend's entry in the [`tessera_core::Registry`]: always one device, `cpu`, made
/// with the entry's options.
#[derive(Clone, Debug, Default)]
pub struct CpuBackendReg {
    options: CpuOptions,
}

impl CpuBackendReg {
    /// The entry whose device has the default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// The entry whose device runs as `options` say.
    pub fn with_options(options: CpuOptions) -> Self {
        CpuBackendReg { options }
    }
}

impl BackendReg for CpuBackendReg {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn devices(&self) -> std::result::Result<Vec<Arc<dyn Device>>, String> {
        Ok(vec![Arc::new(CpuDevice::with_options(&self.options))])
    }
}

/// The host processor as a device. Backends it opens run on `threads` threads and, when
/// `precise` is set, multiply quantized weights without quantizing the activations.
#[derive(Clone, Debug)]
pub struct CpuDevice {
    threads: usize,
    precise: bool,
}

impl Default for CpuDevice {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuDevice {
    /// The CPU with the default options: one thread per hardware thread and the fast
    /// (activation-quantizing) `mul_mat`.
    pub fn new() -> Self {
        Self::with_options(&CpuOptions::default())
    }

    /// The CPU running as `options` say.
    pub fn with_options(options: &CpuOptions) -> Self {
        CpuDevice {
            threads: host::threads_or_all(options.threads),
            precise: options.precise,
        }
    }

    /// The same device whose backends use `n` threads (0 means one per hardware thread).
    pub fn with_threads(mut self, n: usize) -> Self {
        self.threads = host::threads_or_all(n);
        self
    }

    /// The same device whose backends run `mul_mat` in precise mode (see
    /// [`CpuBackend::set_precise`]).
    pub fn with_precise(mut self, precise: bool) -> Self {
        self.precise = precise;
        self
    }

    /// Threads each backend opened on this device uses.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Whether backends opened on this device run `mul_mat` in precise mode.
    pub fn precise(&self) -> bool {
        self.precise
    }
}

impl Device for CpuDevice {
    fn name(&self) -> String {
        "cpu".into()
    }

    fn description(&self) -> String {
        format!("{} ({} threads)", host::cpu_model(), self.threads)
    }

    fn kind(&self) -> DeviceKind {
        DeviceKind::Cpu
    }

    fn memory(&self) -> Memory {
        host::memory()
    }

    fn buffer_type(&self) -> Arc<dyn BufferType> {
        Arc::new(CpuBufferType)
    }

    fn new_backend(&self) -> Result<Box<dyn Backend>> {
        Ok(Box::new(CpuBackend::new(self.threads, self.precise)?))
    }

    fn supports_op(&self, graph: &Graph, id: TensorId) -> bool {
        ops::check(graph, id).is_ok()
    }

    fn can_use_buffer(&self, buffer: &dyn Buffer) -> bool {
        buffer.is_host()
    }

    fn buffer_from_host(&self, bytes: Arc<dyn HostBytes>) -> Result<Option<Arc<dyn Buffer>>> {
        Ok(Some(Arc::new(CpuBuffer::from_host(bytes))))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
