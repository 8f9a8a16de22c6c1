//! The K-type quantizers of kernels/quant_k.cuh (cpy and set_rows into Q2_K..Q6_K on the GPU),
//! compiled for the host with the system's C++ compiler (`CXX`, else `c++`) behind a small shim
//! for the CUDA intrinsics they use, give the same bytes as the CPU reference
//! (`tessera_core::quant::quantize_row`) on random blocks and on edge cases. The searches compare
//! sums of products, so this checks the port step for step without a GPU; the conformance suite
//! checks the kernels on the GPU.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use tessera_core::dtype::DType;
use tessera_core::quant::quantize_row;

/// What quant_k.cuh takes from common.cuh and quant.cuh, for the host: every `_rn` intrinsic is
/// one rounded IEEE operation (compiled with -ffp-contract=off), f16 conversions round to
/// nearest even, as on the GPU.
const SHIM: &str = r#"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>
using std::max;
using std::min;
typedef uint8_t u8;
typedef int8_t i8;
typedef uint16_t u16;
#define __device__
#define __forceinline__ inline
#define __noinline__
static float __fmul_rn(float a, float b) { return a * b; }
static float __fadd_rn(float a, float b) { return a + b; }
static float __fsub_rn(float a, float b) { return a - b; }
static float __fdiv_rn(float a, float b) { return a / b; }
static float __fsqrt_rn(float a) { return std::sqrt(a); }
static int __float2int_rn(float v) {
    if (v != v) return 0;
    if (v >= 2147483647.0f) return 2147483647;
    if (v <= -2147483648.0f) return -2147483647 - 1;
    return (int)std::nearbyint(v);
}
static u16 f2h(float f) { _Float16 h = (_Float16)f; u16 r; __builtin_memcpy(&r, &h, 2); return r; }
static float h2f(u16 b) { _Float16 h; __builtin_memcpy(&h, &b, 2); return (float)h; }
static float ld_h(const u8* p) { return h2f((u16)(p[0] | (p[1] << 8))); }
static void scale_min_k4(int j, const u8* q, int& sc, int& m) {
    if (j < 4) { sc = q[j] & 63; m = q[j + 4] & 63; }
    else { sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4); m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4); }
}
enum { Q2_K, Q3_K, Q4_K, Q5_K, Q6_K };
template <int Q> struct QInfo;
template <> struct QInfo<Q2_K> { static const int block = 256, bytes = 84; };
template <> struct QInfo<Q3_K> { static const int block = 256, bytes = 110; };
template <> struct QInfo<Q4_K> { static const int block = 256, bytes = 144; };
template <> struct QInfo<Q5_K> { static const int block = 256, bytes = 176; };
template <> struct QInfo<Q6_K> { static const int block = 256, bytes = 210; };
template <int Q> void quant32(const float*, u8*);
#include "quant_k.cuh"
// stdin: the type (one byte, the enum above), then blocks of 256 f32; stdout: the blocks.
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
        case Q2_K: run<Q2_K>(x); break;
        case Q3_K: run<Q3_K>(x); break;
        case Q4_K: run<Q4_K>(x); break;
        case Q5_K: run<Q5_K>(x); break;
        case Q6_K: run<Q6_K>(x); break;
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
    let src = dir.join("quant_k_host.cpp");
    std::fs::write(&src, SHIM).unwrap();
    let exe = dir.join("quant_k_host");
    let kernels = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let built = Command::new(&cxx)
        .args(["-std=c++17", "-O1", "-ffp-contract=off", "-I"])
        .arg(&kernels)
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
