//! GPU time of graphs from timestamp queries, for `tessera ops perf`.
//!
//! Timing is off by default and switched on for the whole process with [`set_gpu_timing`].
//! While it is on, every backend on a device that has TIMESTAMP_QUERY writes a timestamp at the
//! beginning and the end of each graph's compute pass (one pass per graph), into a query set
//! of [`CAP`] pairs; graphs past that many are not timed. Nothing is read back while graphs
//! run: the pairs are resolved and read when the backend is dropped, and each graph's time is
//! appended to a process-wide list that [`take_gpu_times`] returns and empties. A caller that
//! times one case per backend (the perf mode does) gets that case's GPU time per graph from
//! the list (its median leaves out a warm-up run); where no device has timestamps the list
//! stays empty and the caller keeps its wall time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tessera_core::Result;

use crate::context::{lock, Gpu};

/// Whether timing is on.
static ON: AtomicBool = AtomicBool::new(false);
/// The GPU time of each graph timed since the last [`take_gpu_times`], in nanoseconds.
static TIMES: Mutex<Vec<f64>> = Mutex::new(Vec::new());

/// Graphs one backend times at most (each takes two queries; wgpu allows 4096 per set).
pub(crate) const CAP: u32 = 2048;

/// Switches GPU timing of graphs on or off for every wgpu backend of the process (see the
/// module docs). Backends on adapters without TIMESTAMP_QUERY are not timed.
pub fn set_gpu_timing(on: bool) {
    ON.store(on, Ordering::SeqCst);
}

/// Whether GPU timing is on ([`set_gpu_timing`]; each backend also logs the median GPU time
/// of its graphs at debug level when it is dropped).
pub(crate) fn timing_on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The GPU time of each graph timed since the last call (from the beginning to the end of its
/// compute pass), in the order each backend ran them, backend after backend as they were
/// dropped; empty when none was timed (timing off, no adapter with TIMESTAMP_QUERY, or the
/// backends that timed them not yet dropped).
pub fn take_gpu_times() -> Vec<Duration> {
    std::mem::take(&mut *lock(&TIMES))
        .into_iter()
        .map(|ns| Duration::from_secs_f64(ns * 1e-9))
        .collect()
}

/// One backend's timestamp queries.
pub(crate) struct Timer {
    set: wgpu::QuerySet,
    /// Where the queries are resolved, and the mappable copy read back.
    resolve: wgpu::Buffer,
    read: wgpu::Buffer,
    /// Pairs written so far.
    used: u32,
}

impl Timer {
    /// A timer on `gpu` (which has TIMESTAMP_QUERY).
    pub fn new(gpu: &Gpu) -> Timer {
        let bytes = u64::from(2 * CAP) * 8;
        let set = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("tessera timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count: 2 * CAP,
        });
        let buffer = |usage, label| {
            gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })
        };
        let resolve = buffer(
            wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            "tessera timestamps resolve",
        );
        let read = buffer(
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            "tessera timestamps read",
        );
        Timer {
            set,
            resolve,
            read,
            used: 0,
        }
    }

    /// The timestamp writes of the next graph's pass (`None` once [`CAP`] graphs are timed).
    pub fn next(&mut self) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        if self.used >= CAP {
            return None;
        }
        let i = self.used;
        self.used += 1;
        Some(wgpu::ComputePassTimestampWrites {
            query_set: &self.set,
            beginning_of_pass_write_index: Some(2 * i),
            end_of_pass_write_index: Some(2 * i + 1),
        })
    }

    /// Waits for the timed graphs, reads their timestamps and appends their times to the list.
    pub fn flush(&mut self, gpu: &Gpu) -> Result<()> {
        let times = self.read_back(gpu)?;
        if !times.is_empty() {
            let mut sorted = times.clone();
            sorted.sort_by(f64::total_cmp);
            log::debug!(
                "{}: {} graphs timed, median {:.1} us GPU each, {:.1} us in all",
                gpu.name,
                times.len(),
                sorted[sorted.len() / 2] / 1e3,
                sorted.iter().sum::<f64>() / 1e3
            );
        }
        lock(&TIMES).extend(times);
        Ok(())
    }

    /// Waits for the passes timed since the last read, and returns the time of each (from its
    /// beginning to its end) in nanoseconds, in order; the timer is empty again.
    pub fn read_back(&mut self, gpu: &Gpu) -> Result<Vec<f64>> {
        let n = std::mem::take(&mut self.used);
        if n == 0 {
            return Ok(Vec::new());
        }
        let bytes = u64::from(2 * n) * 8;
        let mut enc = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("tessera timestamps"),
            });
        enc.resolve_query_set(&self.set, 0..2 * n, &self.resolve, 0);
        enc.copy_buffer_to_buffer(&self.resolve, 0, &self.read, 0, bytes);
        gpu.queue.submit([enc.finish()]);
        let slice = self.read.slice(..bytes);
        let mapped: std::sync::Arc<Mutex<Option<bool>>> = Default::default();
        let slot = mapped.clone();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            *lock(&slot) = Some(r.is_ok());
        });
        gpu.wait()?;
        if *lock(&mapped) != Some(true) {
            return Err(gpu.err("reading the timestamp queries back failed"));
        }
        let ticks: Vec<u64> = {
            let view = slice
                .get_mapped_range()
                .map_err(|e| gpu.err(format!("reading the timestamp queries: {e}")))?;
            bytemuck::pod_collect_to_vec(&view[..])
        };
        self.read.unmap();
        let period = f64::from(gpu.queue.get_timestamp_period());
        Ok(ticks
            .chunks_exact(2)
            .map(|p| p[1].saturating_sub(p[0]) as f64 * period)
            .collect())
    }
}
