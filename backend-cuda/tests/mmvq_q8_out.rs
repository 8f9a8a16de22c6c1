//! The q8_1 output of the fused gate/up/swiglu mat-vec kernel (`mmvq_glu_<type>` with aux[2],
//! aux[3] set, kernels/mmvq.cu) must be bit-identical to `quantize_q8_1_f32` of its own f32
//! output, and that output must match the kernel without the q8 output and the CPU reference.
//! The kernels are launched directly (the fusion that sets these parameters lives in the
//! encoder); skipped without a CUDA device.

mod common;

use std::sync::Arc;

use common::*;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use tessera_core::dtype::DType;
use tessera_core::BackendReg;
use tessera_cuda::CudaBackendReg;

/// kernels/common.cuh's TArg.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct TArg {
    ptr: u64,
    ne: [i64; 4],
    nb: [i64; 4],
}

/// kernels/common.cuh's KParams.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KParams {
    t: [TArg; 8],
    aux: [u64; 4],
    f: [f32; 8],
    i: [i32; 8],
}

// SAFETY: plain old data laid out as the kernels' KParams.
unsafe impl DeviceRepr for KParams {}

/// mmvq.cu with its headers spliced in.
fn source() -> String {
    let mut s = String::new();
    for text in [
        include_str!("../../kernels/common.cuh"),
        include_str!("../../kernels/quant.cuh"),
        include_str!("../../kernels/mmvq.cu"),
    ] {
        for line in text.lines().filter(|l| !l.starts_with("#include \"")) {
            s.push_str(line);
            s.push('\n');
        }
    }
    s
}

/// A contiguous 1-D f32 or byte tensor of `n` elements of `es` bytes at `ptr`.
fn vector(ptr: u64, n: usize, es: usize) -> TArg {
    let (n, es) = (n as i64, es as i64);
    TArg {
        ptr,
        ne: [n, 1, 1, 1],
        nb: [es, n * es, n * es, n * es],
    }
}

fn addr<T>(s: &CudaSlice<T>, stream: &Arc<CudaStream>) -> u64 {
    s.device_ptr(stream).0
}

fn launch(stream: &Arc<CudaStream>, f: &CudaFunction, grid: u32, p: &KParams) {
    let cfg = LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the parameters describe live buffers of the sizes the kernel reads and writes.
    unsafe { stream.launch_builder(f).arg(p).launch(cfg) }.expect("launch");
}

/// Quantizes the f32 vector `x` (k values) on the device; returns (qs, ds) as bytes.
fn quantize(
    stream: &Arc<CudaStream>,
    f: &CudaFunction,
    x: u64,
    k: usize,
) -> (CudaSlice<u8>, CudaSlice<u8>) {
    let qs = stream.alloc_zeros::<u8>(k).unwrap();
    let ds = stream.alloc_zeros::<u8>(k / 32 * 8).unwrap();
    let mut p = KParams::default();
    p.t[1] = vector(x, k, 4);
    p.aux[0] = addr(&qs, stream);
    p.aux[1] = addr(&ds, stream);
    launch(stream, f, (k / 32).div_ceil(4) as u32, &p);
    (qs, ds)
}

/// Rows per block of the kernels without the q8 output (mmvq_launch in ops/matmul.rs).
fn rows_per_block(dt: DType) -> usize {
    if dt == DType::Q8_0 {
        2
    } else {
        4
    }
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

#[test]
fn glu_q8_output_matches_quantize_q8_1() {
    // Only the device's presence (common::cuda also compiles every kernel file).
    match CudaBackendReg::new().devices() {
        Ok(d) if !d.is_empty() => {}
        _ => {
            eprintln!("skipped: no CUDA devices");
            return;
        }
    }
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.default_stream();
    let opts = CompileOptions {
        arch: Some("compute_80"),
        options: vec![
            "--std=c++17".into(),
            "--device-as-default-execution-space".into(),
        ],
        ..Default::default()
    };
    let module = ctx
        .load_module(compile_ptx_with_opts(source(), opts).expect("mmvq.cu compiles"))
        .unwrap();
    let quant = module.load_function("quantize_q8_1_f32").unwrap();
    let mut rng = Rng::new(41);
    // k: a whole tile plus a partial one (TV = 32); m: a partial block of rows at the end for
    // the kernel without the q8 output.
    let (m, k) = (96usize, 1280usize);
    for dt in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
    ] {
        let glu = module
            .load_function(&format!("mmvq_glu_{}", dt.name()))
            .unwrap();
        let x = rng.vec(k, -1.0, 1.0);
        let (gw, uw) = (rng.vec(m * k, -1.0, 1.0), rng.vec(m * k, -1.0, 1.0));
        let xd = stream.clone_htod(&x).unwrap();
        let gd = stream.clone_htod(&to_bytes(dt, &gw)).unwrap();
        let ud = stream.clone_htod(&to_bytes(dt, &uw)).unwrap();
        let (xq, xs) = quantize(&stream, &quant, addr(&xd, &stream), k);
        let row = dt.row_size(k).unwrap();
        let weights = |ptr: u64| TArg {
            ptr,
            ne: [k as i64, m as i64, 1, 1],
            nb: [1, row as i64, (row * m) as i64, (row * m) as i64],
        };
        let out = stream.alloc_zeros::<f32>(m).unwrap();
        let plain = stream.alloc_zeros::<f32>(m).unwrap();
        let oq = stream.alloc_zeros::<u8>(m).unwrap();
        let os = stream.alloc_zeros::<u8>(m / 32 * 8).unwrap();
        let mut p = KParams::default();
        p.t[1] = weights(addr(&gd, &stream));
        p.t[2] = weights(addr(&ud, &stream));
        p.aux[0] = addr(&xq, &stream);
        p.aux[1] = addr(&xs, &stream);
        p.t[0] = vector(addr(&plain, &stream), m, 4);
        launch(&stream, &glu, m.div_ceil(rows_per_block(dt)) as u32, &p);
        p.t[0] = vector(addr(&out, &stream), m, 4);
        p.aux[2] = addr(&oq, &stream);
        p.aux[3] = addr(&os, &stream);
        launch(&stream, &glu, (m / 32) as u32, &p);
        let (rq, rs) = quantize(&stream, &quant, addr(&out, &stream), m);
        let got = (
            stream.clone_dtoh(&oq).unwrap(),
            stream.clone_dtoh(&os).unwrap(),
        );
        let want = (
            stream.clone_dtoh(&rq).unwrap(),
            stream.clone_dtoh(&rs).unwrap(),
        );
        assert!(got == want, "{}: q8_1 output differs", dt.name());

        let out = stream.clone_dtoh(&out).unwrap();
        let plain = stream.clone_dtoh(&plain).unwrap();
        check(&format!("{} q8 vs plain", dt.name()), &out, &plain, 1e-8);
        let (gr, ur) = (rounded(dt, &gw), rounded(dt, &uw));
        let reference: Vec<f32> = (0..m)
            .map(|r| {
                let dot = |w: &[f32]| -> f32 { (0..k).map(|i| w[r * k + i] * x[i]).sum() };
                silu(dot(&gr)) * dot(&ur)
            })
            .collect();
        check(&format!("{} vs cpu", dt.name()), &out, &reference, 1e-3);
    }
}
