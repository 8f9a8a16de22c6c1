//! The device the tests run on: the first wgpu adapter (lavapipe in CI), or none, with a
//! printed reason, when there is no adapter here.

use std::sync::Arc;

use tessera_core::backend::{BackendReg, Device};
use tessera_wgpu::{WgpuBackendReg, WgpuOptions};

/// The first wgpu device with the options of the environment, or `None` (printed as skipped)
/// when there is none.
#[allow(dead_code)]
pub fn device() -> Option<Arc<dyn Device>> {
    device_with(WgpuOptions::from_env().expect("the TESSERA_WGPU_* variables"))
}

/// The first wgpu device with `options`, or `None` (printed as skipped) when there is none.
#[allow(dead_code)]
pub fn device_with(options: WgpuOptions) -> Option<Arc<dyn Device>> {
    // Vulkan only (skips a GL probe that prints EGL errors) and no Mesa device-select layer,
    // unless the caller chose otherwise.
    if std::env::var_os("WGPU_BACKEND").is_none() {
        std::env::set_var("WGPU_BACKEND", "vulkan");
    }
    if std::env::var_os("NODEVICE_SELECT").is_none() {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
    match WgpuBackendReg::with_options(options).devices() {
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
