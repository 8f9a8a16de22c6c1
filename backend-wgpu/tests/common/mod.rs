//! The device the tests run on: the first wgpu adapter (lavapipe in CI), or none, with a
//! printed reason, when there is no adapter here.

use std::sync::Arc;

use tessera_core::backend::{BackendReg, Device};
use tessera_wgpu::WgpuBackendReg;

/// The first wgpu device, or `None` (printed as skipped) when there is none.
pub fn device() -> Option<Arc<dyn Device>> {
    // Vulkan only (skips a GL probe that prints EGL errors) and no Mesa device-select layer,
    // unless the caller chose otherwise.
    if std::env::var_os("WGPU_BACKEND").is_none() {
        std::env::set_var("WGPU_BACKEND", "vulkan");
    }
    if std::env::var_os("NODEVICE_SELECT").is_none() {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
    match WgpuBackendReg::new().devices() {
        Ok(d) => {
            println!("wgpu device: {} = {}", d[0].name(), d[0].description());
            Some(d[0].clone())
        }
        Err(why) => {
            println!("skipped: {why}");
            None
        }
    }
}
