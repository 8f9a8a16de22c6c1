//! The K-type quantizers of kernels/quant_k.cuh (cpy and set_rows into Q2_K..Q6_K on the GPU),
//! compiled for the host with the system's C++ compiler (`CXX`, else `c++`) with a stand-in
//! for common.cuh (the CUDA intrinsics they use), give the same bytes as the CPU reference
//! (`tessera_core::quant::quantize_row`) on random blocks and on edge cases. The searches compare
//! sums of products, so this checks the port step for step without a GPU; the conformance suite
//! checks the kernels on the GPU.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use tessera_core::dtype::DType;
use tessera_core::quant::quantize_row;

/// A host stand-in for common.cuh, the one header quant.cuh and quant_k.cuh build on: every
/// `_rn` intrinsic is one rounded IEEE operation (compiled with -ffp-contract=off), f16
/// conversions round to nearest even, as on the GPU. The real quant.cuh (block sizes, type
/// codes, f16 and scale field readers) and quant_k.cuh are compiled beside it.
const COMMON_SHIM: &str = r#"
#include <algorithm>
#include <cmath>
#include <cstdint>
using std::max;
using std::min;
typedef uint8_t u8;
typedef int8_t i8;
typedef uint16_t u16;
typedef uint32_t u32;
#define __device__
#define __forceinline__ inline
#define __noinline__
#define __align__(n) alignas(n)
static float __fmul_rn(float a, float b) { return a * b; }
static float __fadd_rn(float a, float b) { return a + b; }
static float __fsub_rn(float a, float b) { return a - b; }
static float __fdiv_rn(float a, float b) { return a / b; }
static float __frcp_rn(float a) { return 1.0f / a; }
static float __fsqrt_rn(float a) { return std::sqrt(a); }
static int __float2int_rn(float v) {
    if (v != v) return 0;
    if (v >= 2147483647.0f) return 2147483647;
    if (v <= -2147483648.0f) return -2147483647 - 1;
    return (int)std::nearbyint(v);
}
static u16 f2h(float f) { _Float16 h = (_Float16)f; u16 r; __builtin_memcpy(&r, &h, 2); return r; }
static float h2f(u16 b) { _Float16 h; __builtin_memcpy(&h, &b, 2); return (float)h; }
"#;

/// The host program: stdin is the type (one byte, 0..4 for Q2_K..Q6_K), then blocks of 256
/// f32; stdout the quantized blocks.
const PROGRAM: &str = r#"
#include <cstdio>
#include <vector>
#include "quant.cuh"
#include "quant_k.cuh"
template <int Q> void run(const std::vector<float>& x) {
    std::vector<u8> out(x.size() / 256 * QInfo<Q>::bytes);
    for (size_t b = 0; b < x.size() / 256; b++) quant_block<Q>(&x[256 * b], &out[b * QInfo<Q>::bytes]);
    fwrite(out.data(), 1, out.size(), stdout);
}
int main() {
    int t = getchar();
    std::vector<float> x;
    float v;
    while (fread(&v, 4, 1, stdin) == 1) x.push_back(v);
    switch (t) {
        case 0: run<Q2_K>(x); break;
        case 1: run<Q3_K>(x); break;
        case 2: run<Q4_K>(x); break;
        case 3: run<Q5_K>(x); break;
        case 4: run<Q6_K>(x); break;
        default: return 1;
    }
    return 0;
}
"#;

/// The blocks quantized: random values at several scales, and the edge cases of the searches
/// (all zeros, a constant, values below the all-zero threshold, all positive, mostly zeros).
fn inputs() -> Vec<f32> {
    let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    let mut x = Vec::new();
    for b in 0..48 {
        for i in 0..256 {
            let v = rnd();
            x.push(match b {
                0 => 0.0,
                1 => 0.25,
                2 => v * 1e-20,
                3 => v.abs() + 0.1,
                4 => {
                    if i % 16 == 0 {
                        v
                    } else {
                        0.0
                    }
                }
                _ => v * (1 + b % 7) as f32,
            });
        }
    }
    x
}

#[test]
fn k_quantizers_match_the_cpu_reference_bit_for_bit() {
    let dir = std::env::temp_dir().join(format!("tessera-quant-k-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The headers beside the shim: a quoted include looks in the including file's folder first,
    // so quant.cuh finds the shim as its common.cuh.
    let kernels = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels");
    for h in ["quant.cuh", "quant_k.cuh"] {
        std::fs::copy(kernels.join(h), dir.join(h)).unwrap();
    }
    std::fs::write(dir.join("common.cuh"), COMMON_SHIM).unwrap();
    let src = dir.join("quant_k_host.cpp");
    std::fs::write(&src, PROGRAM).unwrap();
    let exe = dir.join("quant_k_host");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let built = Command::new(&cxx)
        .args(["-std=c++17", "-O1", "-ffp-contract=off"])
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("running the C++ compiler `{cxx}` (set CXX): {e}"));
    assert!(
        built.status.success(),
        "compiling quant_k.cuh for the host failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let x = inputs();
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    for (code, dt) in [
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
    ]
    .into_iter()
    .enumerate()
    {
        let mut child = Command::new(&exe)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&[code as u8]).unwrap();
        stdin.write_all(&bytes).unwrap();
        drop(stdin);
        let got = child.wait_with_output().unwrap();
        assert!(
            got.status.success(),
            "{}: the host program failed",
            dt.name()
        );
        let mut want = vec![0u8; x.len() / 256 * dt.type_size()];
        quantize_row(dt, &x, &mut want).unwrap();
        assert_eq!(got.stdout.len(), want.len(), "{}: output size", dt.name());
        let bad: Vec<usize> = (0..x.len() / 256)
            .filter(|b| {
                let r = b * dt.type_size()..(b + 1) * dt.type_size();
                got.stdout[r.clone()] != want[r]
            })
            .collect();
        assert!(
            bad.is_empty(),
            "{}: blocks {bad:?} differ from the CPU's",
            dt.name()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
