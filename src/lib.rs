//! tessera: tensor graphs on any mix of devices.
//!
//! This facade re-exports the core ([`core`]), the meta device ([`meta`]) and the backends
//! compiled in: the CPU always, CUDA with the `cuda` feature, wgpu (Vulkan, Metal, DX12) with
//! the `wgpu` feature. [`registry`] lists every device found at run time; [`device`] resolves a
//! spec such as `cpu`, `cuda:0`, `wgpu:1` or `meta:cpu,cuda:0`. [`Options`] holds every
//! compiled-in backend's settings ([`registry_with`], [`device`] and [`meta_device`] open
//! devices with them).
//!
//! ```no_run
//! let reg = tessera::registry();
//! let dev = reg.best().expect("the CPU is always there");
//! println!("running on {}", dev.name());
//! ```

pub use tessera_core as core;
pub use tessera_core::{DType, Device, Error, Graph, Registry, Result, TensorId};
pub use tessera_cpu as cpu;
#[cfg(feature = "cuda")]
pub use tessera_cuda as cuda;
pub use tessera_meta as meta;
#[cfg(feature = "wgpu")]
pub use tessera_wgpu as wgpu;

use std::sync::Arc;

use tessera_core::BackendReg;
use tessera_cpu::CpuOptions;
use tessera_meta::{MetaDevice, MetaOptions, SplitRatios};

/// The settings of every compiled-in backend and of the meta device. `Default` is each one's
/// tuned default; [`Options::from_env`] reads every crate's environment variables.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The CPU backend's.
    pub cpu: CpuOptions,
    /// The meta device's.
    pub meta: MetaOptions,
}

impl Options {
    /// Each crate's options from its environment variables (each crate's `from_env`); the
    /// first value that does not parse is an error naming its variable.
    pub fn from_env() -> Result<Options> {
        Ok(Options {
            cpu: CpuOptions::from_env()?,
            meta: MetaOptions::from_env()?,
        })
    }

    /// The same options with the CPU backend's replaced.
    pub fn with_cpu(mut self, cpu: CpuOptions) -> Options {
        self.cpu = cpu;
        self
    }

    /// The same options with the meta device's replaced.
    pub fn with_meta(mut self, meta: MetaOptions) -> Options {
        self.meta = meta;
        self
    }

    /// The options of devices that are parts of a meta device of several parts: they run one
    /// graph together and wait on each other, which a backend may run differently (CUDA keeps
    /// its kernels from releasing their successors early). The CPU and the meta device run the
    /// same either way.
    pub fn for_group(&self) -> Options {
        self.clone()
    }
}

/// The compiled-in backends, most preferred first for this platform, made with `options`. The
/// CPU comes last: it runs everything, so it is the scheduler's fallback.
pub fn backend_regs(options: &Options) -> Vec<Box<dyn BackendReg>> {
    cfg_if::cfg_if! {
        if #[cfg(target_os = "macos")] {
            // Metal through wgpu is the GPU path on Apple machines.
            let gpus = [wgpu_reg(), cuda_reg()];
        } else {
            // Elsewhere NVIDIA GPUs are fastest through CUDA; every other GPU through wgpu.
            let gpus = [cuda_reg(), wgpu_reg()];
        }
    }
    let mut regs: Vec<Box<dyn BackendReg>> = gpus.into_iter().flatten().collect();
    regs.push(Box::new(tessera_cpu::CpuBackendReg::with_options(
        options.cpu.clone(),
    )));
    regs
}

/// The CUDA backend's entry, when the `cuda` feature compiled it in.
fn cuda_reg() -> Option<Box<dyn BackendReg>> {
    #[cfg(feature = "cuda")]
    return Some(Box::new(tessera_cuda::CudaBackendReg::new()));
    #[cfg(not(feature = "cuda"))]
    None
}

/// The wgpu backend's entry, when the `wgpu` feature compiled it in.
fn wgpu_reg() -> Option<Box<dyn BackendReg>> {
    #[cfg(feature = "wgpu")]
    return Some(Box::new(tessera_wgpu::WgpuBackendReg::new()));
    #[cfg(not(feature = "wgpu"))]
    None
}

/// A registry of every device of every compiled-in backend, with the default options.
pub fn registry() -> Registry {
    registry_with(&Options::default())
}

/// A registry of every device of every compiled-in backend, made with `options`.
pub fn registry_with(options: &Options) -> Registry {
    Registry::new(backend_regs(options))
}

/// The device a spec names (`cpu`, `cuda:0`, `wgpu:1`, or a meta device `meta:cpu,wgpu:0` with
/// automatic split ratios), or the best one present for `auto`, opened with `options`.
pub fn device(options: &Options, spec: &str) -> Result<Arc<dyn Device>> {
    let spec = spec.trim();
    if spec == "auto" {
        registry_with(options).best()
    } else if spec.starts_with("meta:") {
        meta_device(options, spec, &SplitRatios::Auto)
    } else {
        registry_with(options).find(spec)
    }
}

/// A meta device (`meta:cpu,cuda:0`: tensor parallelism over the parts) dividing work by
/// `ratios`, running as `options.meta` says. Its parts are opened with `options`, made
/// [`Options::for_group`] where there are several.
pub fn meta_device(options: &Options, spec: &str, ratios: &SplitRatios) -> Result<Arc<dyn Device>> {
    let specs = tessera_meta::parse_spec(spec)?;
    let registry = if specs.len() > 1 {
        registry_with(&options.for_group())
    } else {
        registry_with(options)
    };
    let parts = specs
        .iter()
        .map(|p| {
            registry.find(p).map_err(|e| match e {
                Error::NoSuchDevice(what) => {
                    Error::NoSuchDevice(format!("{what}, a part of {spec}"))
                }
                other => other,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Arc::new(MetaDevice::with_options(
        parts,
        ratios,
        options.meta.clone(),
    )?))
}
