//! tessera-cuda: tessera's backend for NVIDIA GPUs.
//!
//! - **Options**: [`CudaOptions`] (graphs, fusion, TF32, profiling, the kernel cache, the
//!   all-reduce path, multi-GPU groups), given to [`CudaBackendReg::with_options`];
//!   [`CudaOptions::from_env`] reads the crate's environment variables.
//! - **No toolkit at build time.** cudarc loads the driver, NVRTC and cuBLAS at run time; a
//!   missing library means `devices()` of [`CudaBackendReg`] returns the reason, never a panic.
//! - **Kernels** are the CUDA C files of `kernels/` (one op family each), compiled by NVRTC at
//!   first use for the device's exact architecture and cached on disk ([`kernels`] module docs).
//! - **Memory**: device buffers come from CUDA's stream-ordered pool, which keeps freed blocks
//!   for reuse ([`CudaBuffer`]); [`PinnedBuffer`] is page-locked host memory for fast uploads.
//! - **Compute**: [`CudaBackend`] is a stream. A graph is encoded into a command list (kernels
//!   and cuBLAS GEMMs), then run eagerly or as a CUDA graph that is replayed when the same
//!   work comes again ([`graphs`] module docs). Fused kernels replace common op sequences.
//! - **All-reduce**: [`CudaComm`] sums a tensor over several GPUs for meta devices, through
//!   peer memory inside the CUDA graphs for small tensors and NCCL for large ones.
//! - **Ops**: [`tessera_core::Device::supports_op`] says exactly which ops and types are
//!   implemented; the scheduler runs the rest elsewhere.

#![warn(missing_docs)]

mod backend;
mod blas;
mod cmd;
pub mod comm;
mod device;
mod driver;
pub mod graphs;
pub mod kernels;
mod memory;
mod ops;
mod options;
mod staging;

pub use backend::{CudaBackend, CudaEventMark};
pub use comm::CudaComm;
pub use device::{CudaBackendReg, CudaDevice};
pub use graphs::GraphMode;
pub use memory::{CudaBuffer, CudaBufferType, PinnedBuffer, PinnedBufferType};
pub use options::{AllReduce, CudaOptions, FewColumns};
