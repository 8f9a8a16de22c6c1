//! [`CudaBackendReg`] (the registry's entry) and [`CudaDevice`] (one GPU).

use std::any::Any;
use std::sync::{Arc, OnceLock};

use tessera_core::{
    Backend, BackendReg, Buffer, BufferType, Device, DeviceKind, Graph, Memory, Result, TensorId,
};

use crate::backend::CudaBackend;
use crate::driver::{describe, driver_version, probe_libraries, DeviceShared};
use crate::kernels::Build;
use crate::memory::{CudaBuffer, CudaBufferType, PinnedBufferType};
use crate::CudaOptions;

/// The CUDA backend's registry entry: one device per GPU the driver reports, each configured
/// by the entry's [`CudaOptions`].
#[derive(Clone, Debug, Default)]
pub struct CudaBackendReg {
    options: CudaOptions,
}

impl CudaBackendReg {
    /// The registry entry with the default options (devices are found when the registry asks
    /// for them).
    pub fn new() -> Self {
        CudaBackendReg::default()
    }

    /// The registry entry whose devices and streams use `options`.
    pub fn with_options(options: CudaOptions) -> Self {
        CudaBackendReg { options }
    }
}

/// Opens every GPU once per process; later calls share the devices (their contexts, kernel
/// caches and memory pools), whatever options the device objects made over them carry.
fn open_all() -> std::result::Result<Vec<Arc<DeviceShared>>, String> {
    static DEVICES: OnceLock<std::result::Result<Vec<Arc<DeviceShared>>, String>> = OnceLock::new();
    DEVICES
        .get_or_init(|| {
            probe_libraries()?;
            // cudarc panics on a missing symbol; every symbol used was probed above, so a panic
            // here would be a bug, but it must still not escape to the caller.
            std::panic::catch_unwind(|| {
                cudarc::driver::result::init()
                    .map_err(|e| format!("no CUDA devices: cuInit failed: {}", describe(e)))?;
                let version =
                    driver_version().map_err(|e| format!("no CUDA devices: {}", describe(e)))?;
                let count = cudarc::driver::result::device::get_count().map_err(|e| {
                    format!("no CUDA devices: counting devices failed: {}", describe(e))
                })?;
                if count <= 0 {
                    return Err("no CUDA devices: the driver found no GPU".to_string());
                }
                (0..count as usize)
                    .map(|i| {
                        DeviceShared::open(i, version).map_err(|e| format!("no CUDA devices: {e}"))
                    })
                    .collect()
            })
            .unwrap_or_else(|_| {
                Err("no CUDA devices: the CUDA libraries failed while loading".into())
            })
        })
        .clone()
}

impl BackendReg for CudaBackendReg {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn devices(&self) -> std::result::Result<Vec<Arc<dyn Device>>, String> {
        Ok(open_all()?
            .into_iter()
            .map(|d| Arc::new(CudaDevice::new(d, self.options.clone())) as Arc<dyn Device>)
            .collect())
    }
}

/// One NVIDIA GPU (`cuda:N`) and the [`CudaOptions`] of the streams made on it. Several device
/// objects over one GPU (from registry entries with other options, or
/// [`CudaDevice::with_options`]) share its memory and compiled kernels.
pub struct CudaDevice {
    shared: Arc<DeviceShared>,
    options: CudaOptions,
    buffer_type: Arc<dyn BufferType>,
    pinned: Arc<dyn BufferType>,
}

impl CudaDevice {
    fn new(shared: Arc<DeviceShared>, options: CudaOptions) -> CudaDevice {
        let buffer_type = Arc::new(CudaBufferType {
            dev: shared.clone(),
        });
        let pinned = Arc::new(PinnedBufferType {
            dev: shared.clone(),
        });
        CudaDevice {
            shared,
            options,
            buffer_type,
            pinned,
        }
    }

    /// The same GPU with other options (its memory and compiled kernels shared): e.g. a stream
    /// without fusion to check the fused kernels against, beside the default ones.
    pub fn with_options(&self, options: CudaOptions) -> CudaDevice {
        CudaDevice::new(self.shared.clone(), options)
    }

    /// The options of the streams made on this device.
    pub fn options(&self) -> CudaOptions {
        self.options.clone()
    }

    /// What every object of this GPU shares.
    pub(crate) fn shared(&self) -> &Arc<DeviceShared> {
        &self.shared
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.shared.ordinal
    }

    /// Compute capability (major, minor).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.shared.cc
    }

    /// A new stream on the device, as its concrete type (for [`CudaBackend::graph_mode`] and
    /// the command names of the last computation).
    pub fn cuda_backend(&self) -> Result<CudaBackend> {
        CudaBackend::new(self.shared.clone(), &self.options())
    }
}

impl Device for CudaDevice {
    fn name(&self) -> String {
        self.shared.name.clone()
    }

    fn description(&self) -> String {
        let s = &self.shared;
        format!(
            "{} ({} MiB, compute capability {}.{}, {} SMs)",
            s.model,
            s.total_mem >> 20,
            s.cc.0,
            s.cc.1,
            s.sm_count
        )
    }

    fn kind(&self) -> DeviceKind {
        DeviceKind::Gpu
    }

    fn memory(&self) -> Memory {
        match self.shared.mem_info() {
            Ok((free, total)) => Memory { free, total },
            Err(_) => Memory {
                free: 0,
                total: self.shared.total_mem,
            },
        }
    }

    fn buffer_type(&self) -> Arc<dyn BufferType> {
        self.buffer_type.clone()
    }

    fn host_buffer_type(&self) -> Option<Arc<dyn BufferType>> {
        Some(self.pinned.clone())
    }

    fn new_backend(&self) -> Result<Box<dyn Backend>> {
        Ok(Box::new(self.cuda_backend()?))
    }

    fn supports_op(&self, graph: &Graph, id: TensorId) -> bool {
        crate::ops::supports(graph, id)
    }

    fn can_use_buffer(&self, buffer: &dyn Buffer) -> bool {
        buffer
            .as_any()
            .downcast_ref::<CudaBuffer>()
            .is_some_and(|b| b.ordinal() == self.shared.ordinal)
    }

    /// Peer memory inside graphs and NCCL between them ([`crate::CudaComm`]), as this device's
    /// [`CudaOptions::all_reduce`] allows; `Ok(None)` where neither works, where the options say
    /// `host`, or where a device is not a CUDA device.
    fn communicator(
        &self,
        devices: &[Arc<dyn Device>],
    ) -> Result<Option<Box<dyn tessera_core::Communicator>>> {
        let Some(devs) = crate::comm::shared_of(devices) else {
            return Ok(None);
        };
        Ok(crate::CudaComm::new(devs, &self.options)?
            .map(|c| Box::new(c) as Box<dyn tessera_core::Communicator>))
    }

    /// Compiles (or reads from the disk cache) and loads every kernel file of the build this
    /// device's streams launch, several files at a time; `progress` counts files.
    fn prepare(&self, progress: &mut dyn FnMut(usize, usize)) -> Result<()> {
        let files: Vec<&'static str> = crate::kernels::kernel_files().collect();
        let build = Build::of(&self.options());
        let build = &build;
        let total = files.len();
        progress(0, total);
        let shared = &self.shared;
        let next = std::sync::atomic::AtomicUsize::new(0);
        let workers = std::thread::available_parallelism()
            .map_or(4, |n| n.get())
            .min(total);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            for _ in 0..workers {
                let (tx, files, next) = (tx.clone(), &files, &next);
                s.spawn(move || loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&f) = files.get(i) else { break };
                    if tx.send(shared.kernels.load(&shared.ctx, build, f)).is_err() {
                        break;
                    }
                });
            }
            drop(tx);
            let mut first_err = None;
            for (done, r) in rx.iter().enumerate() {
                progress(done + 1, total);
                if let Err(e) = r {
                    first_err.get_or_insert(e);
                }
            }
            first_err.map_or(Ok(()), Err)
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
