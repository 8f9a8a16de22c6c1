//! [`WgpuBackendReg`] lists every adapter as a [`WgpuDevice`]; a device opens its adapter on
//! first use.

use std::any::Any;
use std::sync::{Arc, OnceLock};

use tessera_core::backend::{Backend, BackendReg, Buffer, BufferType, Device, DeviceKind, Memory};
use tessera_core::{Graph, Result, TensorId};

use crate::backend::WgpuBackend;
use crate::buffer::{WgpuBuffer, WgpuBufferType};
use crate::context::Gpu;
use crate::options::WgpuOptions;

/// The wgpu backend's registry entry: every adapter wgpu finds (Vulkan, Metal, DX12; GL only
/// when asked for with `WGPU_BACKEND`), discrete GPUs first, then integrated, then the rest,
/// then software adapters. Its devices, their buffers and backends run with its
/// [`WgpuOptions`].
#[derive(Default)]
pub struct WgpuBackendReg {
    options: WgpuOptions,
}

impl WgpuBackendReg {
    /// The registry entry with the options of the environment ([`WgpuOptions::from_env`]);
    /// an error names a variable set to something it does not take.
    pub fn new() -> Result<Self> {
        Ok(Self::with_options(WgpuOptions::from_env()?))
    }

    /// The registry entry with `options`.
    pub fn with_options(options: WgpuOptions) -> Self {
        WgpuBackendReg { options }
    }

    /// Its options.
    pub fn options(&self) -> WgpuOptions {
        self.options
    }
}

/// Sort rank of an adapter type: discrete first, software last.
fn rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu | wgpu::DeviceType::Other => 2,
        wgpu::DeviceType::Cpu => 3,
    }
}

impl BackendReg for WgpuBackendReg {
    fn name(&self) -> &'static str {
        "wgpu"
    }

    fn devices(&self) -> std::result::Result<Vec<Arc<dyn Device>>, String> {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = wgpu::Backends::PRIMARY;
        desc.flags = wgpu::InstanceFlags::empty();
        let desc = desc.with_env();
        let instance = wgpu::Instance::new(desc);
        let mut adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
        adapters.sort_by_key(|a| rank(a.get_info().device_type));
        if adapters.is_empty() {
            return Err("no wgpu adapter".into());
        }
        Ok(adapters
            .into_iter()
            .enumerate()
            .map(|(i, adapter)| {
                Arc::new(WgpuDevice {
                    index: i,
                    adapter,
                    options: self.options,
                    gpu: OnceLock::new(),
                }) as Arc<dyn Device>
            })
            .collect())
    }
}

/// One wgpu adapter as a tessera device (`wgpu:N`).
pub struct WgpuDevice {
    index: usize,
    adapter: wgpu::Adapter,
    options: WgpuOptions,
    gpu: OnceLock<std::result::Result<Arc<Gpu>, String>>,
}

impl WgpuDevice {
    /// A new stream on this device, as its own type (for [`WgpuBackend::set_fusion`] and
    /// [`WgpuBackend::last_dispatch_count`]; `Device::new_backend` gives the same, boxed).
    pub fn backend(&self) -> Result<WgpuBackend> {
        Ok(WgpuBackend::new(self.gpu()?))
    }

    /// The opened device (opened on first use).
    pub(crate) fn gpu(&self) -> Result<Arc<Gpu>> {
        self.gpu
            .get_or_init(|| {
                Gpu::open(self.name(), &self.adapter, self.options).map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|reason| tessera_core::Error::Device {
                device: self.name(),
                reason,
            })
    }

    /// Times bare transfers of `bytes` bytes between host memory and this device, each way,
    /// step by step ([`crate::TransferFloor`], `calls` calls each): what wgpu itself costs a
    /// host all-reduce, waiting as [`crate::WgpuOptions::spin_wait`] says.
    pub fn transfer_floor(&self, bytes: usize, calls: usize) -> Result<crate::TransferFloor> {
        let gpu = self.gpu()?;
        let spin = gpu.options.spin_wait;
        crate::staging::measure_floor(&gpu, bytes, calls, spin)
    }

    /// The adapter's description from wgpu.
    pub fn adapter_info(&self) -> wgpu::AdapterInfo {
        self.adapter.get_info()
    }
}

impl Device for WgpuDevice {
    fn name(&self) -> String {
        format!("wgpu:{}", self.index)
    }

    fn description(&self) -> String {
        let i = self.adapter.get_info();
        let driver = if i.driver_info.is_empty() {
            i.driver.clone()
        } else {
            format!("{} {}", i.driver, i.driver_info)
        };
        format!(
            "{} ({:?}, {:?}, driver {})",
            i.name,
            i.backend,
            i.device_type,
            driver.trim()
        )
    }

    fn kind(&self) -> DeviceKind {
        match self.adapter.get_info().device_type {
            wgpu::DeviceType::DiscreteGpu => DeviceKind::Gpu,
            wgpu::DeviceType::IntegratedGpu => DeviceKind::IGpu,
            wgpu::DeviceType::VirtualGpu | wgpu::DeviceType::Other => DeviceKind::Gpu,
            wgpu::DeviceType::Cpu => DeviceKind::Software,
        }
    }

    /// `total` is the largest device-local memory heap where the adapter is a Vulkan one (wgpu
    /// has no memory query of its own), else the adapter's largest buffer (a lower bound);
    /// `free` is that less what tessera has allocated. [`WgpuOptions::memory_limit`] caps both.
    fn memory(&self) -> Memory {
        let total = vulkan_heap(&self.adapter)
            .or_else(|| usize::try_from(self.adapter.limits().max_buffer_size).ok())
            .unwrap_or(usize::MAX)
            .min(self.options.memory_limit.unwrap_or(usize::MAX));
        let used = self.gpu.get().and_then(|g| g.as_ref().ok()).map_or(0, |g| {
            g.allocated.load(std::sync::atomic::Ordering::Relaxed)
        });
        Memory {
            free: total.saturating_sub(used),
            total,
        }
    }

    fn buffer_type(&self) -> Arc<dyn BufferType> {
        match self.gpu() {
            Ok(gpu) => Arc::new(WgpuBufferType { gpu }),
            Err(e) => Arc::new(crate::buffer::UnopenedBufferType {
                name: self.name(),
                reason: e.to_string(),
            }),
        }
    }

    fn new_backend(&self) -> Result<Box<dyn Backend>> {
        Ok(Box::new(WgpuBackend::new(self.gpu()?)))
    }

    fn supports_op(&self, graph: &Graph, id: TensorId) -> bool {
        match self.gpu() {
            Ok(gpu) => crate::ops::supported(&gpu, graph, id).is_ok(),
            Err(_) => false,
        }
    }

    fn can_use_buffer(&self, buffer: &dyn Buffer) -> bool {
        match (buffer.as_any().downcast_ref::<WgpuBuffer>(), self.gpu()) {
            (Some(b), Ok(gpu)) => Arc::ptr_eq(&b.gpu, &gpu),
            _ => false,
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The size of the largest device-local memory heap of a Vulkan adapter.
#[cfg(any(target_os = "linux", target_os = "windows", target_os = "android"))]
fn vulkan_heap(adapter: &wgpu::Adapter) -> Option<usize> {
    // SAFETY: the hal adapter is only read (a property query of its physical device, through
    // the instance that created it) while the guard keeps it alive.
    unsafe {
        let hal = adapter.as_hal::<wgpu::hal::api::Vulkan>()?;
        let props = hal
            .shared_instance()
            .raw_instance()
            .get_physical_device_memory_properties(hal.raw_physical_device());
        let heaps = props.memory_heaps.get(..props.memory_heap_count as usize)?;
        // Bit 0 of a heap's flags is VK_MEMORY_HEAP_DEVICE_LOCAL_BIT.
        let best = heaps
            .iter()
            .filter(|h| h.flags.as_raw() & 1 != 0)
            .map(|h| h.size)
            .max()?;
        usize::try_from(best).ok()
    }
}

/// Elsewhere wgpu has no Vulkan adapters to ask.
#[cfg(not(any(target_os = "linux", target_os = "windows", target_os = "android")))]
fn vulkan_heap(_adapter: &wgpu::Adapter) -> Option<usize> {
    None
}
