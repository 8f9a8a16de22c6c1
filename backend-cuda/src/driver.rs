//! The driver layer: finding the CUDA libraries without panicking, one shared context per GPU,
//! the stream-ordered memory pool, and turning driver errors into [`tessera_core::Error`].
//!
//! cudarc loads libcuda, libnvrtc and libcublas at their first use and panics when a library
//! or one of its symbols is missing. [`probe`] therefore checks every library and every symbol
//! this crate calls before anything else touches them, and turns absence into a sentence.
//!
//! Programmatic dependent launch (PDL): on GPUs of compute capability 9.0 or later and a driver
//! that has `cuLaunchKernelEx` ([`DeviceShared::launch_ex`]), kernels are launched with
//! programmatic stream serialization (`cmd` module): a kernel's blocks may be scheduled while
//! the kernel before it is still finishing, and inside CUDA graphs kernel-to-kernel edges become
//! programmatic. Every kernel waits for its predecessors' results first (`pdl_wait()` in
//! `kernels/common.cuh`), so results do not change. A GPU used alone also lets each kernel
//! release the next one as soon as it has passed its own wait (early release, the
//! `PDL_EARLY_RELEASE` build of the kernels, `kernels::Build`); the parts of a multi-GPU group
//! do not ([`crate::CudaOptions::grouped`]): there the ranks wait on each other inside the
//! all-reduce, and kernels released early only took SM time from the ones they waited for
//! (BENCHMARKS.md). An older GPU or driver simply launches the ordinary way.

use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{result, sys, CudaContext, CudaStream, DriverError};
use tessera_core::{Error, Result};

use crate::kernels::KernelSet;

/// Driver entry points this crate calls (directly or through cudarc's safe layer).
const DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceTotalMem_v2",
    "cuDriverGetVersion",
    "cuDevicePrimaryCtxRetain",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuCtxSynchronize",
    "cuMemGetInfo_v2",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemAllocFromPoolAsync",
    "cuMemFreeAsync",
    "cuDeviceGetDefaultMemPool",
    "cuMemPoolSetAttribute",
    "cuMemPoolTrimTo",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyPeerAsync",
    "cuMemsetD8Async",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuFuncSetAttribute",
    "cuLaunchKernel",
    "cuGraphInstantiateWithFlags",
    "cuGraphExecUpdate_v2",
    "cuGraphLaunch",
    "cuGraphUpload",
    "cuGraphDestroy",
    "cuGraphExecDestroy",
];

/// The driver entry point of launches with attributes (programmatic dependent launch,
/// thread-block clusters): checked on its own, since a driver without it still runs everything
/// else.
const LAUNCH_EX_SYMBOL: &str = "cuLaunchKernelEx";

/// NVRTC entry points this crate calls.
const NVRTC_SYMBOLS: &[&str] = &[
    "nvrtcVersion",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcDestroyProgram",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcGetCUBINSize",
    "nvrtcGetCUBIN",
];

/// cuBLAS entry points this crate calls.
const CUBLAS_SYMBOLS: &[&str] = &[
    "cublasCreate_v2",
    "cublasDestroy_v2",
    "cublasSetStream_v2",
    "cublasSetWorkspace_v2",
    "cublasSetMathMode",
    "cublasGemmStridedBatchedEx",
    "cublasGemmBatchedEx",
];

/// The first of `names` that the library object `lib` lacks, if any (used inside `unsafe`:
/// only the symbol's presence is checked; the pointer is never called).
macro_rules! missing_symbol {
    ($lib:expr, $names:expr) => {
        $names
            .iter()
            .copied()
            .find(|n: &&'static str| $lib.get::<*const std::ffi::c_void>(n.as_bytes()).is_err())
    };
}

/// Checks that the driver, NVRTC and cuBLAS libraries and every symbol used are present.
/// `Err` holds the sentence `devices()` reports ("no CUDA devices: ...").
pub(crate) fn probe_libraries() -> std::result::Result<(), String> {
    // SAFETY: the is_culib_present probes only try to open the libraries; culib() is called
    // only after a probe succeeded, so it cannot panic.
    unsafe {
        if !sys::is_culib_present() {
            return Err("no CUDA devices: libcuda.so.1 not found (no NVIDIA driver)".into());
        }
        if let Some(s) = missing_symbol!(sys::culib(), DRIVER_SYMBOLS) {
            return Err(format!(
                "no CUDA devices: the NVIDIA driver library lacks {s} (driver too old)"
            ));
        }
        if !cudarc::nvrtc::sys::is_culib_present() {
            return Err("no CUDA devices: libnvrtc not found (NVRTC compiles tessera's kernels; install the CUDA runtime libraries)".into());
        }
        if let Some(s) = missing_symbol!(cudarc::nvrtc::sys::culib(), NVRTC_SYMBOLS) {
            return Err(format!("no CUDA devices: libnvrtc lacks {s}"));
        }
        if !cudarc::cublas::sys::is_culib_present() {
            return Err(
                "no CUDA devices: libcublas not found (install the CUDA runtime libraries)".into(),
            );
        }
        if let Some(s) = missing_symbol!(cudarc::cublas::sys::culib(), CUBLAS_SYMBOLS) {
            return Err(format!("no CUDA devices: libcublas lacks {s}"));
        }
    }
    Ok(())
}

/// Whether the driver library has `cuLaunchKernelEx` (called only after [`probe_libraries`]
/// succeeded).
fn has_launch_kernel_ex() -> bool {
    // SAFETY: the library was found by probe_libraries, so culib() does not panic; only the
    // symbol's presence is checked.
    unsafe { missing_symbol!(sys::culib(), [LAUNCH_EX_SYMBOL]).is_none() }
}

/// An [`Error::Device`] for a failed driver call.
pub(crate) fn drv(device: &str, what: &str, e: DriverError) -> Error {
    Error::Device {
        device: device.to_string(),
        reason: format!("{what}: {}", describe(e)),
    }
}

/// The driver's name and text for an error code.
pub(crate) fn describe(e: DriverError) -> String {
    match (e.error_name(), e.error_string()) {
        (Ok(n), Ok(s)) => format!("{} ({})", n.to_string_lossy(), s.to_string_lossy()),
        _ => format!("{:?}", e.0),
    }
}

/// Whether a driver error is an out-of-memory.
fn is_oom(e: &DriverError) -> bool {
    e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

/// A device's memory pool. Device memory comes from CUDA's stream-ordered allocator
/// (`cuMemAllocFromPoolAsync`) on the device's default pool, whose release threshold is raised
/// so that freed blocks stay with the process and are handed out again without a new
/// `cudaMalloc`. Devices without memory pools fall back to plain `cuMemAlloc`.
pub(crate) struct Pool {
    pool: Option<sys::CUmemoryPool>,
}

// SAFETY: a CUmemoryPool handle may be used from any thread.
unsafe impl Send for Pool {}
// SAFETY: as above; the driver synchronizes access to the pool.
unsafe impl Sync for Pool {}

impl Pool {
    fn new(ctx: &CudaContext) -> Pool {
        if !ctx.has_async_alloc() {
            return Pool { pool: None };
        }
        // SAFETY: the device handle is valid; the attribute is a u64 as the driver expects.
        unsafe {
            let Ok(pool) = result::device::get_default_mem_pool(ctx.cu_device()) else {
                return Pool { pool: None };
            };
            let mut threshold = u64::MAX;
            let set = sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            );
            if set != sys::CUresult::CUDA_SUCCESS {
                log::debug!("cuda: could not raise the pool's release threshold: {set:?}");
            }
            Pool { pool: Some(pool) }
        }
    }

    /// Allocates `bytes` ordered on `stream` (the memory may be used on `stream` at once, on
    /// other streams after `stream` is synchronized).
    pub(crate) fn alloc(
        &self,
        dev: &DeviceShared,
        bytes: usize,
        stream: sys::CUstream,
    ) -> Result<u64> {
        if bytes == 0 {
            return Ok(0);
        }
        dev.bind()?;
        let attempt = || -> std::result::Result<u64, DriverError> {
            let mut ptr: sys::CUdeviceptr = 0;
            // SAFETY: ptr is a valid out-pointer; the pool and stream belong to this context.
            unsafe {
                match self.pool {
                    Some(pool) => {
                        sys::cuMemAllocFromPoolAsync(&mut ptr, bytes, pool, stream).result()?
                    }
                    None => sys::cuMemAlloc_v2(&mut ptr, bytes).result()?,
                }
            }
            Ok(ptr)
        };
        match attempt() {
            Ok(p) => Ok(p),
            Err(e) if is_oom(&e) => {
                // Give cached blocks back to the driver and try once more.
                if let Some(pool) = self.pool {
                    // SAFETY: all work is finished before trimming, so no block is in use by
                    // a stream that still needs it.
                    unsafe {
                        let _ = sys::cuCtxSynchronize();
                        let _ = sys::cuMemPoolTrimTo(pool, 0);
                    }
                }
                attempt().map_err(|e| {
                    if is_oom(&e) {
                        Error::OutOfMemory {
                            device: dev.name.clone(),
                            bytes,
                        }
                    } else {
                        drv(&dev.name, "allocating device memory", e)
                    }
                })
            }
            Err(e) => Err(drv(&dev.name, "allocating device memory", e)),
        }
    }

    /// Returns a block to the pool, ordered on `stream`.
    pub(crate) fn free(&self, dev: &DeviceShared, ptr: u64, stream: sys::CUstream) {
        if ptr == 0 || dev.bind().is_err() {
            return;
        }
        // SAFETY: ptr came from `alloc` of this pool and is freed once.
        let r = unsafe {
            match self.pool {
                Some(_) => sys::cuMemFreeAsync(ptr, stream).result(),
                None => sys::cuMemFree_v2(ptr).result(),
            }
        };
        if let Err(e) = r {
            log::warn!(
                "{}: freeing device memory failed: {}",
                dev.name,
                describe(e)
            );
        }
    }
}

/// What every object of one GPU shares: the context, a stream for blocking transfers, the
/// memory pool and the compiled kernels.
pub(crate) struct DeviceShared {
    /// `cuda:N`.
    pub name: String,
    /// The GPU's model name.
    pub model: String,
    /// The device ordinal.
    pub ordinal: usize,
    /// The primary context.
    pub ctx: Arc<CudaContext>,
    /// Compute capability (major, minor).
    pub cc: (i32, i32),
    /// Number of streaming multiprocessors.
    pub sm_count: u32,
    /// Total memory in bytes.
    pub total_mem: usize,
    /// Whether kernels are launched with attributes: programmatic stream serialization
    /// (programmatic dependent launch; see the module docs) and thread-block clusters. Compute
    /// capability 9.0 or later and a driver with `cuLaunchKernelEx`.
    pub launch_ex: bool,
    /// Stream used by blocking buffer calls, one caller at a time.
    transfer: Mutex<Arc<CudaStream>>,
    /// The memory pool.
    pub pool: Pool,
    /// Kernels compiled for this device.
    pub kernels: KernelSet,
}

impl DeviceShared {
    /// Opens device `ordinal` (the libraries are known to be present).
    pub(crate) fn open(ordinal: usize, driver_version: i32) -> Result<Arc<DeviceShared>> {
        let name = format!("cuda:{ordinal}");
        let ctx = CudaContext::new(ordinal).map_err(|e| drv(&name, "creating a context", e))?;
        let model = ctx.name().map_err(|e| drv(&name, "reading the name", e))?;
        let cc = ctx
            .compute_capability()
            .map_err(|e| drv(&name, "reading the compute capability", e))?;
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| drv(&name, "reading the SM count", e))? as u32;
        let total_mem = ctx
            .total_mem()
            .map_err(|e| drv(&name, "reading the memory size", e))?;
        let transfer = ctx
            .new_stream()
            .map_err(|e| drv(&name, "creating a stream", e))?;
        let pool = Pool::new(&ctx);
        let kernels = KernelSet::new(&name, cc, driver_version);
        let why_no_launch_ex = if cc.0 < 9 {
            Some("it needs compute capability 9.0")
        } else if !has_launch_kernel_ex() {
            Some("the driver lacks cuLaunchKernelEx")
        } else {
            None
        };
        let launch_ex = why_no_launch_ex.is_none();
        match why_no_launch_ex {
            None => log::info!("{name}: programmatic dependent launch on"),
            Some(w) => log::info!("{name}: programmatic dependent launch off: {w}"),
        }
        Ok(Arc::new(DeviceShared {
            name,
            model,
            ordinal,
            ctx,
            cc,
            sm_count,
            total_mem,
            launch_ex,
            transfer: Mutex::new(transfer),
            pool,
            kernels,
        }))
    }

    /// Makes the context current on this thread.
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| drv(&self.name, "binding the context", e))
    }

    /// An [`Error::Device`] for a failed call on this device.
    pub(crate) fn err(&self, what: &str, e: DriverError) -> Error {
        drv(&self.name, what, e)
    }

    /// Runs `f` on the transfer stream and waits for it: the blocking buffer calls.
    pub(crate) fn blocking<R>(&self, f: impl FnOnce(sys::CUstream) -> Result<R>) -> Result<R> {
        let guard: MutexGuard<'_, Arc<CudaStream>> =
            self.transfer.lock().unwrap_or_else(|p| p.into_inner());
        self.bind()?;
        let r = f(guard.cu_stream())?;
        guard
            .synchronize()
            .map_err(|e| self.err("waiting for a transfer", e))?;
        Ok(r)
    }

    /// Waits for all work on the device (every stream).
    pub(crate) fn synchronize_all(&self) -> Result<()> {
        self.bind()?;
        self.ctx
            .synchronize()
            .map_err(|e| self.err("synchronizing the device", e))
    }

    /// Free and total memory.
    pub(crate) fn mem_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        self.ctx
            .mem_get_info()
            .map_err(|e| self.err("reading free memory", e))
    }
}

/// The driver's version (e.g. 13000 for CUDA 13.0).
pub(crate) fn driver_version() -> std::result::Result<i32, DriverError> {
    let mut v = 0;
    // SAFETY: v is a valid out-pointer; the library is present (probed).
    unsafe { sys::cuDriverGetVersion(&mut v) }.result()?;
    Ok(v)
}
