// Copies with type conversion: cpy, cont and dup.
//
// t[0] dst, t[1] src, the same number of elements. i[0] = 1 when both have the same shape
// (elements are matched by coordinates), 0 otherwise (elements are matched by their index in
// row-major order). Kernels:
// - cpy_<src>_<dst>: between f32, f16 and bf16;
// - cpy_flat_f32_f16, cpy_flat_f32_bf16: f32 into f16 or bf16, both contiguous and 16-byte aligned, an element count that
//   is a multiple of 4: four elements a thread;
// - cpy_raw<bytes>: same-type copies of 1, 2, 4 or 8-byte elements (a quantized row is copied as
//   bytes: the caller describes it with element size 1);
// - quantize_<type>_<src>: f32/f16/bf16 into a contiguous quantized dst, one thread per block
//   (when shapes differ, src is contiguous);
// - dequantize_<type>: a quantized src (rows contiguous) into f32, one thread per 32 values
//   (when shapes differ, dst is contiguous).
#include "quant.cuh"
#include "quant_k.cuh"

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

template <int Q, class S> __device__ void quantize(const KParams& p) {
    const int QK = QInfo<Q>::block;
    const TArg& d = p.t[0];
    const TArg& s = p.t[1];
    const i64 per_row = d.ne[0] / QK;
    const i64 nblocks = per_row * d.ne[1] * d.ne[2] * d.ne[3];
    for (i64 g = (i64)blockIdx.x * blockDim.x + threadIdx.x; g < nblocks; g += (i64)gridDim.x * blockDim.x) {
        const i64 r = g / per_row, j = g % per_row;
        i64 i1, i2, i3;
        split_rows(r, d.ne, i1, i2, i3);
        float x[QK];
        if (p.i[0]) {
            const char* src = at(s, QK * j, i1, i2, i3);
            #pragma unroll(QK == 32 ? 32 : 1)  // unrolled for a K block (256), ~25 s more compiling a file
            for (int e = 0; e < QK; e++) x[e] = S::load(src + e * s.nb[0]);
        } else {
            const char* src = (const char*)s.ptr + (r * d.ne[0] + QK * j) * S::size;
            #pragma unroll(QK == 32 ? 32 : 1)  // unrolled for a K block (256), ~25 s more compiling a file
            for (int e = 0; e < QK; e++) x[e] = S::load(src + e * S::size);
        }
        quant_block<Q>(x, (u8*)at(d, 0, i1, i2, i3) + j * QInfo<Q>::bytes);
    }
}

template <int Q> __device__ void dequantize(const KParams& p) {
    const TArg& d = p.t[0];
    const TArg& s = p.t[1];
    const int subs = QInfo<Q>::block / 32;
    const i64 per_row = s.ne[0] / 32;
    const i64 n = per_row * s.ne[1] * s.ne[2] * s.ne[3];
    for (i64 g = (i64)blockIdx.x * blockDim.x + threadIdx.x; g < n; g += (i64)gridDim.x * blockDim.x) {
        const i64 r = g / per_row, j = g % per_row;
        i64 i1, i2, i3;
        split_rows(r, s.ne, i1, i2, i3);
        float x[32];
        deq32<Q>((const u8*)at(s, 0, i1, i2, i3) + (j / subs) * QInfo<Q>::bytes, (int)(j % subs), x);
        if (p.i[0]) {
            char* dst = at(d, 32 * j, i1, i2, i3);
            for (int e = 0; e < 32; e++) F32::store(dst + e * d.nb[0], x[e]);
        } else {
            float* dst = (float*)d.ptr + r * s.ne[0] + 32 * j;
            for (int e = 0; e < 32; e++) dst[e] = x[e];
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

#define QUANTIZE(nq, Q)                                                              \
    KERNEL quantize_##nq##_f32(const KParams p) { pdl_wait(); quantize<Q, F32>(p); } \
    KERNEL quantize_##nq##_f16(const KParams p) { pdl_wait(); quantize<Q, F16>(p); } \
    KERNEL quantize_##nq##_bf16(const KParams p) { pdl_wait(); quantize<Q, BF16>(p); }
QUANTIZE(q4_0, Q4_0)
QUANTIZE(q4_1, Q4_1)
QUANTIZE(q5_0, Q5_0)
QUANTIZE(q5_1, Q5_1)
QUANTIZE(q8_0, Q8_0)
QUANTIZE(q2_K, Q2_K)
QUANTIZE(q3_K, Q3_K)
QUANTIZE(q4_K, Q4_K)
QUANTIZE(q5_K, Q5_K)
QUANTIZE(q6_K, Q6_K)

#define DEQUANTIZE(nq, Q) \
    KERNEL dequantize_##nq(const KParams p) { pdl_wait(); dequantize<Q>(p); }
DEQUANTIZE(q4_0, Q4_0)
DEQUANTIZE(q4_1, Q4_1)
DEQUANTIZE(q5_0, Q5_0)
DEQUANTIZE(q5_1, Q5_1)
DEQUANTIZE(q8_0, Q8_0)
DEQUANTIZE(q2_K, Q2_K)
DEQUANTIZE(q3_K, Q3_K)
DEQUANTIZE(q4_K, Q4_K)
DEQUANTIZE(q5_K, Q5_K)
DEQUANTIZE(q6_K, Q6_K)

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
