//! tessera-cpu: the CPU backend, and the reference every other backend is checked against.
//!
//! - [`CpuBackendReg`] puts one device, `cpu`, in the registry.
//! - [`CpuDevice`] describes the host (model name, threads, memory) and opens backends;
//!   [`CpuOptions`] (or [`CpuDevice::with_threads`] and [`CpuDevice::with_precise`]) choose how
//!   they run.
//! - [`CpuBufferType`] allocates 64-byte aligned [`CpuBuffer`]s; [`CpuBuffer::from_host`] wraps
//!   caller bytes (a mapped file) read-only, without copying.
//! - [`CpuBackend`] runs every op of `tessera_core::op` on a rayon thread pool, respecting the
//!   byte strides of every source and destination.
//!
//! Ops are grouped by family under `ops/`; each reads source rows into f32 scratch, computes
//! in f32 (sums in f64 where ggml uses double), and stores in the destination's type, so any
//! layout works and the in-place ops the graph allocator plans are safe. `mul_mat` is the
//! exception that matters for speed: it multiplies quantized weights block by block, with the
//! SIMD dot products of `quant` where the CPU has them.
#![warn(missing_docs)]

mod backend;
mod buffer;
mod device;
mod host;
mod ops;
mod options;
mod parallel;
mod quant;
mod view;

pub use backend::CpuBackend;
pub use buffer::{CpuBuffer, CpuBufferType, CPU_ALIGNMENT};
pub use device::{CpuBackendReg, CpuDevice};
pub use options::CpuOptions;
