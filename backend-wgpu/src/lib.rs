//! tessera-wgpu: the wgpu backend. Every adapter wgpu finds (Vulkan, Metal, DX12) is a
//! tessera device (`wgpu:N`, discrete GPUs first), and every op runs as a WGSL shader from
//! the workspace's `shaders/` folder, one file per op family.
//!
//! - [`WgpuBackendReg`] lists the adapters; a [`WgpuDevice`] opens its adapter on first use
//!   with the adapter's own limits and the features tessera uses that it has (SHADER_F16,
//!   SUBGROUP, TIMESTAMP_QUERY), for the registry's [`WgpuOptions`].
//! - Buffers are storage buffers; tensors are addressed in bytes inside them, so any layout
//!   (views, permutes, packed quantized blocks) is read as ggml lays it out.
//! - A graph is one command buffer and one submit ([`WgpuBackend`]); op parameters live in one
//!   uniform buffer per graph.
//! - Op sequences of a Llama block run fused, one dispatch each, where their intermediates
//!   have no other reader (`fused` module docs; [`WgpuBackend::set_fusion`],
//!   [`WgpuBackend::last_dispatch_count`]).
//! - Shader variants come from a tiny template step (`shader` module docs); every variant is
//!   validated offline by naga in a unit test, and pipelines are built as trusted modules
//!   without runtime bounds checks.
//! - `tessera ops perf` times graphs on the GPU with timestamp queries where the adapter has
//!   TIMESTAMP_QUERY ([`set_gpu_timing`], [`take_gpu_times`]).
//! - Host staging (`staging` module): readback and upload buffers, mapped by turns, that a
//!   host all-reduce reads and writes in place ([`WgpuDevice::transfer_floor`] times wgpu's
//!   bare transfers).
//! - wgpu errors never panic: an uncaptured-error handler and error scopes turn them into
//!   tessera errors (`context` module docs).
#![warn(missing_docs)]

mod backend;
mod buffer;
mod context;
mod device;
mod fused;
mod grids;
mod keys;
mod ops;
mod options;
mod profile;
mod shader;
mod staging;
mod timing;

pub use backend::WgpuBackend;
pub use buffer::{WgpuBuffer, WgpuBufferType};
pub use device::{WgpuBackendReg, WgpuDevice};
pub use options::WgpuOptions;
pub use staging::TransferFloor;
pub use timing::{set_gpu_timing, take_gpu_times};
