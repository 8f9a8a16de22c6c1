//! The command list a graph is encoded into before anything runs: kernel launches, cuBLAS
//! GEMMs and copies. A list runs eagerly, one command after another on the backend's
//! stream, or is captured into a CUDA graph ([`crate::graphs`]); comparing two lists is how a
//! graph seen before is recognised.
//!
//! Every kernel takes one argument, [`KParams`], mirrored by `struct KParams` in
//! `kernels/common.cuh`: up to eight tensors (address, `ne`, `nb`), four extra addresses, and
//! eight float and eight integer parameters whose meaning each kernel documents.
//!
//! On compute capability 9.0 or later with a driver that has `cuLaunchKernelEx`, kernels are
//! launched with `cuLaunchKernelEx` and programmatic stream serialization (programmatic
//! dependent launch, see the `driver` module docs): each may be scheduled while the kernel
//! before it finishes and waits for that kernel's results in its first statement, which hides
//! part of the gap between small dependent kernels, also inside CUDA graphs.

use cudarc::driver::sys;
use tessera_core::Result;

use crate::blas::Blas;
use crate::driver::DeviceShared;
use crate::kernels::Func;

/// A tensor as a kernel sees it: device address, elements per axis and byte strides.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct TArg {
    pub ptr: u64,
    pub ne: [i64; 4],
    pub nb: [i64; 4],
}

/// The one argument of every kernel (see the module docs). `t[0]` is the destination,
/// `t[1..]` the sources in order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct KParams {
    pub t: [TArg; 8],
    pub aux: [u64; 4],
    pub f: [f32; 8],
    pub i: [i32; 8],
}

/// Element types of a cuBLAS operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GemmType {
    F32,
    F16,
    BF16,
}

/// `C[m, n] = A^T B` in column-major terms (A stored `k x m` with leading dimension `lda`), F32
/// C, over `batch` matrices: strided, or through device arrays of pointers at `ptrs` (A, B, C
/// pointer arrays of `batch` entries each, one after another).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct GemmCmd {
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub ab_type: GemmType,
    pub a: u64,
    pub lda: i32,
    pub stride_a: i64,
    pub b: u64,
    pub ldb: i32,
    pub stride_b: i64,
    pub c: u64,
    pub ldc: i32,
    pub stride_c: i64,
    pub batch: i32,
    pub ptrs: Option<u64>,
    pub tf32: bool,
}

/// One step of a computation.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Cmd {
    /// A kernel launch.
    Kernel {
        func: Func,
        /// Kernel name (for errors and logs).
        name: &'static str,
        grid: [u32; 3],
        block: [u32; 3],
        smem: u32,
        /// Blocks per thread-block cluster along z (0 or 1: no clusters; sm_90).
        cluster: u32,
        p: Box<KParams>,
    },
    /// A cuBLAS GEMM.
    Gemm(GemmCmd),
    /// Copies `len` bytes on the device.
    Copy { dst: u64, src: u64, len: usize },
}

impl Cmd {
    /// The kernel's name, or `gemm` or `copy`.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Cmd::Kernel { name, .. } => name,
            Cmd::Gemm(_) => "gemm",
            Cmd::Copy { .. } => "copy",
        }
    }

    /// Whether two commands are the same launch up to their argument values (a graph of the
    /// one can be updated to the other in place).
    pub(crate) fn same_kind(&self, other: &Cmd) -> bool {
        match (self, other) {
            (
                Cmd::Kernel {
                    func: f1,
                    grid: g1,
                    block: b1,
                    smem: s1,
                    cluster: c1,
                    ..
                },
                Cmd::Kernel {
                    func: f2,
                    grid: g2,
                    block: b2,
                    smem: s2,
                    cluster: c2,
                    ..
                },
            ) => f1 == f2 && g1 == g2 && b1 == b2 && s1 == s2 && c1 == c2,
            (Cmd::Gemm(a), Cmd::Gemm(b)) => {
                a.m == b.m
                    && a.n == b.n
                    && a.k == b.k
                    && a.ab_type == b.ab_type
                    && a.batch == b.batch
                    && a.ptrs.is_some() == b.ptrs.is_some()
            }
            (Cmd::Copy { .. }, Cmd::Copy { .. }) => true,
            _ => false,
        }
    }

    /// Submits the command to `stream`.
    pub(crate) fn run(&self, dev: &DeviceShared, stream: sys::CUstream, blas: &Blas) -> Result<()> {
        match self {
            Cmd::Kernel {
                func,
                name,
                grid,
                block,
                smem,
                cluster,
                p,
            } => {
                let launched = if dev.launch_ex {
                    let shape = LaunchShape {
                        grid: *grid,
                        block: *block,
                        smem: *smem,
                        cluster: *cluster,
                    };
                    launch_ex(func, &shape, stream, p)
                } else {
                    let mut arg: *mut std::ffi::c_void = (&**p as *const KParams).cast_mut().cast();
                    // SAFETY: the kernel's one parameter is a KParams (kernels/common.cuh
                    // mirrors its layout); the driver copies the parameter before returning.
                    // Every address in it was checked against its buffer when the command was
                    // encoded.
                    unsafe {
                        sys::cuLaunchKernel(
                            func.0,
                            grid[0],
                            grid[1],
                            grid[2],
                            block[0],
                            block[1],
                            block[2],
                            *smem,
                            stream,
                            &mut arg,
                            std::ptr::null_mut(),
                        )
                    }
                };
                launched
                    .result()
                    .map_err(|e| dev.err(&format!("launching kernel {name}"), e))
            }
            Cmd::Gemm(g) => blas.gemm(g),
            Cmd::Copy { dst, src, len } => {
                // SAFETY: both ranges were checked when encoded.
                unsafe { sys::cuMemcpyDtoDAsync_v2(*dst, *src, *len, stream) }
                    .result()
                    .map_err(|e| dev.err("copying device memory", e))
            }
        }
    }
}

/// A kernel launch's grid, block, dynamic shared memory and cluster size (along z).
struct LaunchShape {
    grid: [u32; 3],
    block: [u32; 3],
    smem: u32,
    cluster: u32,
}

/// Launches a kernel with attributes: programmatic stream serialization allowed
/// (programmatic dependent launch, [`DeviceShared::launch_ex`]: its blocks may be scheduled before
/// the previous kernel on `stream` has finished, and a stream capture records the dependency as
/// a programmatic graph edge; the kernel itself waits for its predecessors, `pdl_wait()` in
/// `kernels/common.cuh`), and thread-block clusters of `shape.cluster` blocks along z when
/// that is more than 1.
fn launch_ex(
    func: &Func,
    shape: &LaunchShape,
    stream: sys::CUstream,
    p: &KParams,
) -> sys::CUresult {
    let mut arg: *mut std::ffi::c_void = (p as *const KParams).cast_mut().cast();
    // SAFETY: all-zero bytes are a valid value of this plain C union.
    let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
    value.programmaticStreamSerializationAllowed = 1;
    let mut attrs = vec![sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        value,
    }];
    if shape.cluster > 1 {
        // SAFETY: as above.
        let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
        value.clusterDim.x = 1;
        value.clusterDim.y = 1;
        value.clusterDim.z = shape.cluster;
        attrs.push(sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
            pad: [0; 4],
            value,
        });
    }
    let config = sys::CUlaunchConfig {
        gridDimX: shape.grid[0],
        gridDimY: shape.grid[1],
        gridDimZ: shape.grid[2],
        blockDimX: shape.block[0],
        blockDimY: shape.block[1],
        blockDimZ: shape.block[2],
        sharedMemBytes: shape.smem,
        hStream: stream,
        attrs: attrs.as_mut_ptr(),
        numAttrs: attrs.len() as u32,
    };
    // SAFETY: as for cuLaunchKernel in `Cmd::run` (one KParams parameter, copied by the driver
    // before returning); `config` and the attributes it points to outlive the call, and
    // cuLaunchKernelEx is present (DeviceShared::launch_ex, which the cluster launches of the
    // encoder need too).
    unsafe { sys::cuLaunchKernelEx(&config, func.0, &mut arg, std::ptr::null_mut()) }
}
