//! cuBLAS: one handle per backend stream, with its own workspace so that GEMMs can be
//! captured into CUDA graphs (cuBLAS must not allocate while a stream is being captured).

use std::sync::Arc;

use cudarc::cublas::sys as bsys;
use cudarc::driver::sys;
use tessera_core::{Error, Result};

use crate::cmd::{GemmCmd, GemmType};
use crate::driver::DeviceShared;

/// Bytes of cuBLAS workspace per handle (NVIDIA's recommendation for Hopper).
const WORKSPACE: usize = 32 << 20;

/// A cuBLAS handle bound to one stream.
pub(crate) struct Blas {
    dev: Arc<DeviceShared>,
    handle: bsys::cublasHandle_t,
    workspace: u64,
    stream: sys::CUstream,
}

// SAFETY: the handle is used by one backend at a time (the backend is Send, not Sync).
unsafe impl Send for Blas {}

fn blas_err(dev: &DeviceShared, what: &str, s: bsys::cublasStatus_t) -> Error {
    Error::Device {
        device: dev.name.clone(),
        reason: format!("cuBLAS {what}: {s:?}"),
    }
}

fn check(dev: &DeviceShared, what: &str, s: bsys::cublasStatus_t) -> Result<()> {
    if s == bsys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(blas_err(dev, what, s))
    }
}

impl Blas {
    /// A handle working on `stream`.
    pub(crate) fn new(dev: Arc<DeviceShared>, stream: sys::CUstream) -> Result<Blas> {
        dev.bind()?;
        let mut handle: bsys::cublasHandle_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check(&dev, "create", unsafe {
            bsys::cublasCreate_v2(&mut handle)
        })?;
        let workspace = match dev.pool.alloc(&dev, WORKSPACE, stream) {
            Ok(w) => w,
            Err(e) => {
                // SAFETY: the handle was just created.
                unsafe { bsys::cublasDestroy_v2(handle) };
                return Err(e);
            }
        };
        let b = Blas {
            dev,
            handle,
            workspace,
            stream,
        };
        // SAFETY: the handle, stream and workspace are valid for the handle's life.
        unsafe {
            check(
                &b.dev,
                "set stream",
                bsys::cublasSetStream_v2(handle, stream.cast()),
            )?;
            check(
                &b.dev,
                "set workspace",
                bsys::cublasSetWorkspace_v2(handle, workspace as *mut _, WORKSPACE),
            )?;
        }
        Ok(b)
    }

    /// Submits one GEMM command.
    pub(crate) fn gemm(&self, g: &GemmCmd) -> Result<()> {
        let ty = match g.ab_type {
            GemmType::F32 => bsys::cudaDataType::CUDA_R_32F,
            GemmType::F16 => bsys::cudaDataType::CUDA_R_16F,
            GemmType::BF16 => bsys::cudaDataType::CUDA_R_16BF,
        };
        let compute = if g.ab_type == GemmType::F32 && g.tf32 {
            bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
        } else {
            bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        let op_t = bsys::cublasOperation_t::CUBLAS_OP_T;
        let op_n = bsys::cublasOperation_t::CUBLAS_OP_N;
        let algo = bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT;
        let c32 = bsys::cudaDataType::CUDA_R_32F;
        self.dev.bind()?;
        // SAFETY: every address and stride was checked against its buffer when the command
        // was encoded; alpha and beta are host scalars read during the call.
        let s = unsafe {
            match g.ptrs {
                None => bsys::cublasGemmStridedBatchedEx(
                    self.handle,
                    op_t,
                    op_n,
                    g.m,
                    g.n,
                    g.k,
                    (&alpha as *const f32).cast(),
                    g.a as *const _,
                    ty,
                    g.lda,
                    g.stride_a,
                    g.b as *const _,
                    ty,
                    g.ldb,
                    g.stride_b,
                    (&beta as *const f32).cast(),
                    g.c as *mut _,
                    c32,
                    g.ldc,
                    g.stride_c,
                    g.batch,
                    compute,
                    algo,
                ),
                Some(p) => {
                    let n = g.batch as u64 * 8;
                    bsys::cublasGemmBatchedEx(
                        self.handle,
                        op_t,
                        op_n,
                        g.m,
                        g.n,
                        g.k,
                        (&alpha as *const f32).cast(),
                        p as *const *const _,
                        ty,
                        g.lda,
                        (p + n) as *const *const _,
                        ty,
                        g.ldb,
                        (&beta as *const f32).cast(),
                        (p + 2 * n) as *const *mut _,
                        c32,
                        g.ldc,
                        g.batch,
                        compute,
                        algo,
                    )
                }
            }
        };
        check(
            &self.dev,
            &format!("GEMM m={} n={} k={} batch={}", g.m, g.n, g.k, g.batch),
            s,
        )
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        if self.dev.bind().is_err() {
            return;
        }
        // SAFETY: the handle is destroyed once; the workspace is freed on the stream it was
        // used on, after everything queued there.
        unsafe {
            bsys::cublasDestroy_v2(self.handle);
        }
        self.dev.pool.free(&self.dev, self.workspace, self.stream);
    }
}
