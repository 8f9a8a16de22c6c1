// cpy into and out of the block types, with cpy's parameters (copy.cu): t[0] dst, t[1] src,
// the same number of elements, i[0] = 1 when both have the same shape. Kernels:
// - quantize_<type>_<src>: f32/f16/bf16 into a contiguous quantized dst, one thread per block
//   (when shapes differ, src is contiguous); the K types' scale searches are quant_k.cuh's,
//   bit-exact with the host's quantizers;
// - dequantize_<type>: a quantized src (rows contiguous) into f32, one thread per 32 values
//   (when shapes differ, dst is contiguous).
#include "quant.cuh"
#include "quant_k.cuh"
#include "quant_iq.cuh"

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
DEQUANTIZE(iq2_xxs, IQ2_XXS)
DEQUANTIZE(iq2_xs, IQ2_XS)
DEQUANTIZE(iq2_s, IQ2_S)
DEQUANTIZE(iq3_xxs, IQ3_XXS)
DEQUANTIZE(iq3_s, IQ3_S)
DEQUANTIZE(iq1_s, IQ1_S)
DEQUANTIZE(iq1_m, IQ1_M)
DEQUANTIZE(iq4_nl, IQ4_NL)
DEQUANTIZE(iq4_xs, IQ4_XS)
DEQUANTIZE(tq1_0, TQ1_0)
DEQUANTIZE(tq2_0, TQ2_0)
DEQUANTIZE(mxfp4, MXFP4)
