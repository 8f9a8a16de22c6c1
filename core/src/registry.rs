//! The registry: every device of every compiled-in backend, found at run time.

use std::sync::Arc;

use crate::backend::{BackendReg, Device, DeviceKind};
use crate::error::{Error, Result};

/// One backend's devices, or why it has none.
pub struct BackendDevices {
    /// The backend's name.
    pub backend: &'static str,
    /// Its devices, or the reason it is unusable here.
    pub devices: std::result::Result<Vec<Arc<dyn Device>>, String>,
}

/// Lists devices across backends and finds them by spec.
pub struct Registry {
    backends: Vec<BackendDevices>,
}

impl Registry {
    /// A registry over the given backends, in priority order (most preferred first; the facade
    /// picks the order per platform). Each backend is asked for its devices once.
    pub fn new(regs: Vec<Box<dyn BackendReg>>) -> Self {
        let backends = regs
            .iter()
            .map(|r| BackendDevices {
                backend: r.name(),
                devices: r.devices(),
            })
            .collect();
        Registry { backends }
    }

    /// Every backend, with its devices or why it has none.
    pub fn backends(&self) -> &[BackendDevices] {
        &self.backends
    }

    /// Every usable device, in backend priority order.
    pub fn devices(&self) -> Vec<Arc<dyn Device>> {
        self.backends
            .iter()
            .filter_map(|b| b.devices.as_ref().ok())
            .flatten()
            .cloned()
            .collect()
    }

    /// The device a plain spec names (`cpu`, `cuda:0`, `wgpu:1`, or a backend name alone for
    /// its first device).
    pub fn find(&self, spec: &str) -> Result<Arc<dyn Device>> {
        let spec = spec.trim();
        let devices = self.devices();
        if let Some(d) = devices.iter().find(|d| d.name() == spec) {
            return Ok(d.clone());
        }
        if let Some(b) = self.backends.iter().find(|b| b.backend == spec) {
            return match &b.devices {
                Ok(ds) if !ds.is_empty() => Ok(ds[0].clone()),
                Ok(_) => Err(Error::NoSuchDevice(format!(
                    "{spec} (the backend found no devices)"
                ))),
                Err(why) => Err(Error::NoSuchDevice(format!("{spec} ({why})"))),
            };
        }
        if let Some((backend, _)) = spec.split_once(':') {
            if let Some(b) = self.backends.iter().find(|b| b.backend == backend) {
                if let Err(why) = &b.devices {
                    return Err(Error::NoSuchDevice(format!("{spec} ({why})")));
                }
            }
        }
        Err(Error::NoSuchDevice(spec.to_string()))
    }

    /// The best device present: the first discrete GPU, else the first integrated GPU, else
    /// the first CPU, else whatever comes first (software adapters last).
    pub fn best(&self) -> Result<Arc<dyn Device>> {
        let devices = self.devices();
        for kind in [
            DeviceKind::Gpu,
            DeviceKind::IGpu,
            DeviceKind::Cpu,
            DeviceKind::Software,
        ] {
            if let Some(d) = devices.iter().find(|d| d.kind() == kind) {
                return Ok(d.clone());
            }
        }
        devices
            .first()
            .cloned()
            .ok_or_else(|| Error::NoSuchDevice("(any)".into()))
    }
}
