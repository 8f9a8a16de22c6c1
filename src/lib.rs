//! tessera: tensor graphs on any mix of devices.
//!
//! This facade re-exports the core ([`core`]) and the backends compiled in: the CPU always,
//! CUDA with the `cuda` feature, wgpu (Vulkan, Metal, DX12) with the `wgpu` feature.
//! [`registry`] lists every device found at run time; [`device`] resolves a spec such as
//! `cpu`, `cuda:0`, `wgpu:1`.
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
#[cfg(feature = "wgpu")]
pub use tessera_wgpu as wgpu;

use std::sync::Arc;

use tessera_core::meta::{MetaDevice, SplitRatios};
use tessera_core::BackendReg;

/// The compiled-in backends, most preferred first for this platform. The CPU comes last: it
/// runs everything, so it is the scheduler's fallback.
pub fn backend_regs() -> Vec<Box<dyn BackendReg>> {
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
    regs.push(Box::new(tessera_cpu::CpuBackendReg));
    regs
}

/// The CUDA backend's entry, when the `cuda` feature compiled it in.
fn cuda_reg() -> Option<Box<dyn BackendReg>> {
    #[cfg(feature = "cuda")]
    return Some(Box::new(tessera_cuda::CudaBackendReg::with_options(
        tessera_cuda::CudaOptions::from_env().unwrap_or_else(|e| {
            log::warn!("{e}; using the default CUDA options");
            tessera_cuda::CudaOptions::default()
        }),
    )));
    #[cfg(not(feature = "cuda"))]
    None
}

/// The wgpu backend's entry, when the `wgpu` feature compiled it in, with the options of the
/// environment (`tessera_wgpu::WgpuOptions::from_env`); a variable set to something it does
/// not take leaves the entry without devices, its error the reason given for each.
fn wgpu_reg() -> Option<Box<dyn BackendReg>> {
    #[cfg(feature = "wgpu")]
    return Some(match tessera_wgpu::WgpuBackendReg::new() {
        Ok(reg) => Box::new(reg),
        Err(e) => Box::new(Unavailable {
            name: "wgpu",
            why: e.to_string(),
        }),
    });
    #[cfg(not(feature = "wgpu"))]
    None
}

/// A backend's entry that could not be made (its settings are wrong): no devices, and why.
#[cfg(feature = "wgpu")]
struct Unavailable {
    name: &'static str,
    why: String,
}

#[cfg(feature = "wgpu")]
impl BackendReg for Unavailable {
    fn name(&self) -> &'static str {
        self.name
    }

    fn devices(&self) -> std::result::Result<Vec<Arc<dyn Device>>, String> {
        Err(self.why.clone())
    }
}

/// A registry of every device of every compiled-in backend.
pub fn registry() -> Registry {
    Registry::new(backend_regs())
}

/// The device a spec names (`cpu`, `cuda:0`, `wgpu:1`, or a meta device `meta:cpu,wgpu:0` with
/// automatic split ratios), or the best one present for `auto`.
pub fn device(registry: &Registry, spec: &str) -> Result<Arc<dyn Device>> {
    let spec = spec.trim();
    if spec == "auto" {
        registry.best()
    } else if spec.starts_with("meta:") {
        meta_device(registry, spec, &SplitRatios::Auto)
    } else {
        registry.find(spec)
    }
}

/// A meta device (`meta:cpu,cuda:0`: tensor parallelism over the parts, found in `registry`)
/// dividing work by `ratios`.
pub fn meta_device(
    registry: &Registry,
    spec: &str,
    ratios: &SplitRatios,
) -> Result<Arc<dyn Device>> {
    let parts = tessera_core::meta::parse_spec(spec)?
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
    Ok(Arc::new(MetaDevice::new(parts, ratios)?))
}
