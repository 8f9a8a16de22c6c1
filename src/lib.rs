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

use tessera_core::BackendReg;

/// The compiled-in backends, most preferred first for this platform. The CPU comes last: it
/// runs everything, so it is the scheduler's fallback.
pub fn backend_regs() -> Vec<Box<dyn BackendReg>> {
    let mut regs: Vec<Box<dyn BackendReg>> = Vec::new();
    cfg_if::cfg_if! {
        if #[cfg(target_os = "macos")] {
            // Metal through wgpu is the GPU path on Apple machines.
            add_wgpu(&mut regs);
            add_cuda(&mut regs);
        } else {
            // Elsewhere NVIDIA GPUs are fastest through CUDA; every other GPU through wgpu.
            add_cuda(&mut regs);
            add_wgpu(&mut regs);
        }
    }
    regs.push(Box::new(tessera_cpu::CpuBackendReg));
    regs
}

#[allow(unused_variables)]
fn add_cuda(regs: &mut Vec<Box<dyn BackendReg>>) {
    #[cfg(feature = "cuda")]
    regs.push(Box::new(tessera_cuda::CudaBackendReg::new()));
}

#[allow(unused_variables)]
fn add_wgpu(regs: &mut Vec<Box<dyn BackendReg>>) {
    #[cfg(feature = "wgpu")]
    regs.push(Box::new(tessera_wgpu::WgpuBackendReg::new()));
}

/// A registry of every device of every compiled-in backend.
pub fn registry() -> Registry {
    Registry::new(backend_regs())
}

/// The device a spec names (`cpu`, `cuda:0`, `wgpu:1`), or the best one present for `auto`.
pub fn device(registry: &Registry, spec: &str) -> Result<Arc<dyn Device>> {
    if spec.trim() == "auto" {
        registry.best()
    } else {
        registry.find(spec)
    }
}
