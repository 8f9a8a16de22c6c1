// Copies between float types and same-type copies: cpy, cont and dup (quantize.cu converts into
// and out of the block types).
//
// t[0] dst, t[1] src, the same number of elements. i[0] = 1 when both have the same shape
// (elements are matched by coordinates), 0 otherwise (elements are matched by their index in
// row-major order). Kernels:
// - cpy_<src>_<dst>: between f32, f16 and bf16;
// - cpy_flat_f32_f16, cpy_flat_f32_bf16: f32 into f16 or bf16, both contiguous and 16-byte
//   aligned, an element count that is a multiple of 4: four elements a thread;
// - cpy_raw<bytes>: same-type copies of 1, 2, 4 or 8-byte elements (a quantized row is copied as
//   bytes: the caller describes it with element size 1).
#include "common.cuh"

// Coordinates of element index l of a shape, row-major.
__device__ __forceinline__ void unravel(i64 l, const i64* ne, i64& i0, i64& i1, i64& i2, i64& i3) {
    i0 = l % ne[0];
    l /= ne[0];
    i1 = l % ne[1];
    l /= ne[1];
    i2 = l % ne[2];
    i3 = l / ne[2];
}

template <class S, class D> __device__ void cpy(const KParams& p) {
    const TArg& d = p.t[0];
    const TArg& s = p.t[1];
    if (p.i[0]) {
        FOR_EACH_ELEMENT(d.ne) { D::store(at(d, i0, i1, i2, i3), S::load(at(s, i0, i1, i2, i3))); }
    } else {
        const i64 n = d.ne[0] * d.ne[1] * d.ne[2] * d.ne[3];
        for (i64 l = (i64)blockIdx.x * blockDim.x + threadIdx.x; l < n; l += (i64)gridDim.x * blockDim.x) {
            i64 a0, a1, a2, a3, b0, b1, b2, b3;
            unravel(l, s.ne, a0, a1, a2, a3);
            unravel(l, d.ne, b0, b1, b2, b3);
            D::store(at(d, b0, b1, b2, b3), S::load(at(s, a0, a1, a2, a3)));
        }
    }
}

template <class T> __device__ void cpy_raw(const KParams& p) {
    const TArg& d = p.t[0];
    const TArg& s = p.t[1];
    if (p.i[0]) {
        FOR_EACH_ELEMENT(d.ne) { *(T*)at(d, i0, i1, i2, i3) = *(const T*)at(s, i0, i1, i2, i3); }
    } else {
        const i64 n = d.ne[0] * d.ne[1] * d.ne[2] * d.ne[3];
        for (i64 l = (i64)blockIdx.x * blockDim.x + threadIdx.x; l < n; l += (i64)gridDim.x * blockDim.x) {
            i64 a0, a1, a2, a3, b0, b1, b2, b3;
            unravel(l, s.ne, a0, a1, a2, a3);
            unravel(l, d.ne, b0, b1, b2, b3);
            *(T*)at(d, b0, b1, b2, b3) = *(const T*)at(s, a0, a1, a2, a3);
        }
    }
}

#define CPY(ns, S, nd, D) \
    KERNEL cpy_##ns##_##nd(const KParams p) { pdl_wait(); cpy<S, D>(p); }
CPY(f32, F32, f32, F32)
CPY(f32, F32, f16, F16)
CPY(f32, F32, bf16, BF16)
CPY(f16, F16, f32, F32)
CPY(f16, F16, f16, F16)
CPY(f16, F16, bf16, BF16)
CPY(bf16, BF16, f32, F32)
CPY(bf16, BF16, f16, F16)
CPY(bf16, BF16, bf16, BF16)

KERNEL cpy_raw1(const KParams p) { pdl_wait(); cpy_raw<u8>(p); }
KERNEL cpy_raw2(const KParams p) { pdl_wait(); cpy_raw<u16>(p); }
KERNEL cpy_raw4(const KParams p) { pdl_wait(); cpy_raw<u32>(p); }
KERNEL cpy_raw8(const KParams p) { pdl_wait(); cpy_raw<u64>(p); }

// f32 into a 16-bit float type D, four elements a thread (cpy_flat_f32_<d>).
template <typename D>
__device__ __forceinline__ void cpy_flat(const KParams& p) {
    const float4* s = (const float4*)p.t[1].ptr;
    uint2* d = (uint2*)p.t[0].ptr;
    const i64 n4 = p.t[0].ne[0] * p.t[0].ne[1] * p.t[0].ne[2] * p.t[0].ne[3] / 4;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (i64)gridDim.x * blockDim.x) {
        d[i] = pack4<D>(s[i]);
    }
}

KERNEL cpy_flat_f32_f16(const KParams p) { pdl_wait(); cpy_flat<F16>(p); }
KERNEL cpy_flat_f32_bf16(const KParams p) { pdl_wait(); cpy_flat<BF16>(p); }
