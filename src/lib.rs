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
    /// The CUDA backend's.
    #[cfg(feature = "cuda")]
    pub cuda: tessera_cuda::CudaOptions,
    /// The wgpu backend's.
    #[cfg(feature = "wgpu")]
    pub wgpu: tessera_wgpu::WgpuOptions,
}

impl Options {
    /// Each crate's options from its environment variables (each crate's `from_env`); the
    /// first value that does not parse is an error naming its variable.
    pub fn from_env() -> Result<Options> {
        Ok(Options {
            cpu: CpuOptions::from_env()?,
            meta: MetaOptions::from_env()?,
            #[cfg(feature = "cuda")]
            cuda: tessera_cuda::CudaOptions::from_env()?,
            #[cfg(feature = "wgpu")]
            wgpu: tessera_wgpu::WgpuOptions::from_env()?,
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

    /// The same options with the CUDA backend's replaced.
    #[cfg(feature = "cuda")]
    pub fn with_cuda(mut self, cuda: tessera_cuda::CudaOptions) -> Options {
        self.cuda = cuda;
        self
    }

    /// The same options with the wgpu backend's replaced.
    #[cfg(feature = "wgpu")]
    pub fn with_wgpu(mut self, wgpu: tessera_wgpu::WgpuOptions) -> Options {
        self.wgpu = wgpu;
        self
    }

    /// The options of devices that are parts of a meta device of several parts: they run one
    /// graph together and wait on each other, so CUDA keeps its kernels from releasing their
    /// successors early (a kernel that started early would hold SMs a part's peer needs). The
    /// CPU, wgpu and the meta device run the same either way.
    pub fn for_group(&self) -> Options {
        #[allow(unused_mut)] // changed only where CUDA is compiled in
        let mut o = self.clone();
        #[cfg(feature = "cuda")]
        {
            o.cuda = o.cuda.grouped(true);
        }
        o
    }
}

/// The compiled-in backends, most preferred first for this platform, made with `options`. The
/// CPU comes last: it runs everything, so it is the scheduler's fallback.
pub fn backend_regs(options: &Options) -> Vec<Box<dyn BackendReg>> {
    cfg_if::cfg_if! {
        if #[cfg(target_os = "macos")] {
            // Metal through wgpu is the GPU path on Apple machines.
            let gpus = [wgpu_reg(options), cuda_reg(options)];
        } else {
            // Elsewhere NVIDIA GPUs are fastest through CUDA; every other GPU through wgpu.
            let gpus = [cuda_reg(options), wgpu_reg(options)];
        }
    }
    let mut regs: Vec<Box<dyn BackendReg>> = gpus.into_iter().flatten().collect();
    regs.push(Box::new(tessera_cpu::CpuBackendReg::with_options(
        options.cpu.clone(),
    )));
    regs
}

/// The CUDA backend's entry, when the `cuda` feature compiled it in.
#[allow(unused_variables)] // `options` is read only where CUDA is compiled in
fn cuda_reg(options: &Options) -> Option<Box<dyn BackendReg>> {
    #[cfg(feature = "cuda")]
    return Some(Box::new(tessera_cuda::CudaBackendReg::with_options(
        options.cuda.clone(),
    )));
    #[cfg(not(feature = "cuda"))]
    None
}

/// The wgpu backend's entry, when the `wgpu` feature compiled it in.
#[allow(unused_variables)] // `options` is read only where wgpu is compiled in
fn wgpu_reg(options: &Options) -> Option<Box<dyn BackendReg>> {
    #[cfg(feature = "wgpu")]
    return Some(Box::new(tessera_wgpu::WgpuBackendReg::with_options(
        options.wgpu,
    )));
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

/// A meta device (`meta:cpu,cuda:0`) dividing work by `ratios`, running as `options.meta` says
/// (tensor parallelism or a layer split: [`tessera_meta::SplitMode`]). Its parts are opened
/// with `options`, made [`Options::for_group`] where there are several. A part in brackets
/// (`meta:[cuda:0,cuda:1],cpu`) is a group of its own, tensor parallel inside with automatic
/// ratios, and the outer device splits by layers.
pub fn meta_device(options: &Options, spec: &str, ratios: &SplitRatios) -> Result<Arc<dyn Device>> {
    let specs = tessera_meta::parse_spec(spec)?;
    // Parts split by layers never wait on each other inside a graph: only tensor parallelism
    // (or the automatic mode, which may choose it) needs the group's options.
    let layers = options.meta.split_mode == tessera_meta::SplitMode::Layer;
    let registry = if specs.len() > 1 && !layers {
        registry_with(&options.for_group())
    } else {
        registry_with(options)
    };
    let parts = specs
        .iter()
        .map(|p| {
            if p.starts_with("meta:") {
                let inner = options.clone().with_meta(
                    options
                        .meta
                        .clone()
                        .with_split_mode(tessera_meta::SplitMode::Tensor),
                );
                return meta_device(&inner, p, &SplitRatios::Auto);
            }
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
