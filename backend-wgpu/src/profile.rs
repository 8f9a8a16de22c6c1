//! GPU time per shader variant ([`crate::WgpuOptions::profile`], or
//! [`crate::WgpuBackend::set_profile`]).
//!
//! While a backend profiles, each graph it runs is recorded with every dispatch in a compute
//! pass of its own, timed by timestamp queries at the pass's beginning and end, and the backend
//! waits for the graph and reads the times back before returning (so a profiled run is slower
//! and its passes add barriers; use it to see where the time goes, not for throughput). The
//! times are summed per variant name; when the backend is dropped the table is logged at debug
//! level (`RUST_LOG=tessera_wgpu=debug`), the costliest variants first, in the form the CUDA
//! backend's profile uses. Adapters without TIMESTAMP_QUERY are not profiled.

use std::collections::HashMap;
use std::time::Duration;

use tessera_core::Result;

use crate::context::Gpu;
use crate::shader::Variant;
use crate::timing::{Timer, CAP};

/// The per-variant GPU times of one backend's profiled graphs.
pub(crate) struct Profile {
    timer: Timer,
    /// Graphs profiled, and dispatches in them.
    runs: usize,
    dispatches: usize,
    /// Nanoseconds and dispatches per variant name.
    by_name: HashMap<String, (f64, usize)>,
}

/// Variant names shown in the log, at most.
const SHOWN: usize = 16;

impl Profile {
    /// A profile on `gpu` (which has TIMESTAMP_QUERY).
    pub fn new(gpu: &Gpu) -> Profile {
        Profile {
            timer: Timer::new(gpu),
            runs: 0,
            dispatches: 0,
            by_name: HashMap::new(),
        }
    }

    /// Records `n` dispatches into `enc`, each in its own timed pass (`record(pass, i)` sets
    /// dispatch i), submits them in groups of at most [`CAP`], waits for each group and adds
    /// its times under `names[i]`.
    pub fn run(
        &mut self,
        gpu: &Gpu,
        names: &[&str],
        mut record: impl FnMut(&mut wgpu::ComputePass<'_>, usize),
    ) -> Result<()> {
        let n = names.len();
        for start in (0..n).step_by(CAP as usize) {
            let end = (start + CAP as usize).min(n);
            let mut enc = gpu
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("tessera profiled graph"),
                });
            for i in start..end {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: self.timer.next(),
                });
                record(&mut pass, i);
            }
            gpu.queue.submit([enc.finish()]);
            let times = self.timer.read_back(gpu)?;
            for (name, ns) in names[start..end].iter().zip(times) {
                let e = self.by_name.entry((*name).to_string()).or_default();
                e.0 += ns;
                e.1 += 1;
            }
        }
        self.runs += 1;
        self.dispatches += n;
        Ok(())
    }

    /// The variants' names with their total GPU time and dispatch count, the costliest first.
    pub fn table(&self) -> Vec<(String, Duration, usize)> {
        let mut t: Vec<(String, Duration, usize)> = self
            .by_name
            .iter()
            .map(|(k, &(ns, c))| (k.clone(), Duration::from_secs_f64(ns * 1e-9), c))
            .collect();
        t.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        t
    }

    /// Logs the table (debug level) for device `name`.
    pub fn log(&self, name: &str) {
        if self.runs == 0 {
            return;
        }
        let runs = self.runs as f64;
        let total: f64 = self.by_name.values().map(|v| v.0).sum();
        log::debug!(
            "{name}: profile of {} runs: {:.1} us GPU and {:.1} dispatches per run",
            self.runs,
            total / runs / 1e3,
            self.dispatches as f64 / runs
        );
        for (k, d, c) in self.table().into_iter().take(SHOWN) {
            let us = d.as_secs_f64() * 1e6;
            log::debug!(
                "  {k:<40} {:>9.1} us/run {:>6.1} per run {:>8.2} us each",
                us / runs,
                c as f64 / runs,
                us / c as f64
            );
        }
    }
}

/// A short name of a variant for the profile: its entry point (its family's file where the
/// entry is `main`), the type of its first source (T0) where that is not f32, and the
/// fused-dispatch defines it sets (MUL, ADD, W2, GLU, PAIR, QKV, ROPE, NORM, MMPAIR), and SPLIT
/// (the split flash attention decode, whose merge is `decode_combine`).
pub(crate) fn variant_name(v: &Variant) -> String {
    let mut name = if v.entry() == "main" {
        v.family().name().to_string()
    } else {
        v.entry().to_string()
    };
    if let Some(t) = v
        .get("T0")
        .filter(|&id| id != 0)
        .and_then(|id| tessera_core::DType::ALL.iter().find(|d| d.gguf_id() == id))
    {
        name.push('_');
        name.push_str(t.name());
    }
    for flag in [
        "MUL", "ADD", "W2", "GLU", "PAIR", "QKV", "ROPE", "NORM", "MMPAIR", "SPLIT", "PQ",
    ] {
        if v.get(flag).is_some_and(|x| x != 0) {
            name.push('+');
            name.push_str(&flag.to_lowercase());
        }
    }
    name
}
