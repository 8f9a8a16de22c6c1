// Helpers of mul_mat's cuBLAS path.
//
// batch_ptrs: the device pointer arrays of a batched GEMM whose src0 is broadcast over src1's
// batches. t[0] dst [m, n, e2, e3], t[1] src0 [k, m, d2, d3], t[2] src1 (as cuBLAS reads it);
// i[0] = e2 / d2, i[1] = e3 / d3; aux[0] receives three arrays of e2*e3 addresses (A, B, C).
// dequant_f16_<type>: t[0] contiguous f16 [k, rows], t[1] quantized [k, rows] (rows
// contiguous); one thread per 32 values, blocks of 256 threads, written out coalesced through
// shared memory. Used to run a quantized mul_mat with many columns as an f16 GEMM.
#include "quant.cuh"
#include "quant_iq.cuh"

KERNEL batch_ptrs(const KParams p) {
    pdl_wait();
    const TArg& c = p.t[0];
    const TArg& a = p.t[1];
    const TArg& b = p.t[2];
    const i64 n = c.ne[2] * c.ne[3];
    u64* out = (u64*)p.aux[0];
    for (i64 x = (i64)blockIdx.x * blockDim.x + threadIdx.x; x < n; x += (i64)gridDim.x * blockDim.x) {
        const i64 i2 = x % c.ne[2], i3 = x / c.ne[2];
        out[x] = a.ptr + (i2 / p.i[0]) * a.nb[2] + (i3 / p.i[1]) * a.nb[3];
        out[n + x] = b.ptr + i2 * b.nb[2] + i3 * b.nb[3];
        out[2 * n + x] = c.ptr + i2 * c.nb[2] + i3 * c.nb[3];
    }
}

// Threads per block of dequant_f16 (the launch's block size); each handles one 32-value group.
#define DQ_THREADS 256
// u32 words per group (32 halves) plus one of padding, so that the threads' rows of shared
// memory start in different banks.
#define DQ_STRIDE 17

// The groups of a block are consecutive in the output (rows are contiguous), so each thread
// dequantizes its group into shared memory and the block then writes the whole run with
// consecutive threads storing consecutive words.
template <int Q> __device__ void dequant_f16(const KParams& p) {
    const TArg& d = p.t[0];
    const TArg& s = p.t[1];
    const int subs = QInfo<Q>::block / 32;
    const i64 per_row = d.ne[0] / 32;
    const i64 n = per_row * d.ne[1];
    __shared__ u32 staged[DQ_THREADS * DQ_STRIDE];
    u32* out = (u32*)d.ptr;
    for (i64 base = (i64)blockIdx.x * DQ_THREADS; base < n; base += (i64)gridDim.x * DQ_THREADS) {
        const i64 g = base + threadIdx.x;
        if (g < n) {
            const i64 r = g / per_row, j = g % per_row;
            float x[32];
            deq32<Q>((const u8*)s.ptr + r * s.nb[1] + (j / subs) * QInfo<Q>::bytes, (int)(j % subs), x);
#pragma unroll
            for (int e = 0; e < 16; e++) {
                staged[threadIdx.x * DQ_STRIDE + e] = (u32)f2h(x[2 * e]) | ((u32)f2h(x[2 * e + 1]) << 16);
            }
        }
        __syncthreads();
        const i64 words = (n - base < DQ_THREADS ? n - base : DQ_THREADS) * 16;
        for (i64 w = threadIdx.x; w < words; w += DQ_THREADS) {
            out[base * 16 + w] = staged[(w / 16) * DQ_STRIDE + w % 16];
        }
        __syncthreads();
    }
}

#define DEQUANT_F16(nq, Q) \
    KERNEL dequant_f16_##nq(const KParams p) { pdl_wait(); dequant_f16<Q>(p); }
DEQUANT_F16(q4_0, Q4_0)
DEQUANT_F16(q4_1, Q4_1)
DEQUANT_F16(q5_0, Q5_0)
DEQUANT_F16(q5_1, Q5_1)
DEQUANT_F16(q8_0, Q8_0)
DEQUANT_F16(q2_K, Q2_K)
DEQUANT_F16(q3_K, Q3_K)
DEQUANT_F16(q4_K, Q4_K)
DEQUANT_F16(q5_K, Q5_K)
DEQUANT_F16(q6_K, Q6_K)
DEQUANT_F16(iq2_xxs, IQ2_XXS)
DEQUANT_F16(iq2_xs, IQ2_XS)
DEQUANT_F16(iq2_s, IQ2_S)
DEQUANT_F16(iq3_xxs, IQ3_XXS)
DEQUANT_F16(iq3_s, IQ3_S)
DEQUANT_F16(iq1_s, IQ1_S)
DEQUANT_F16(iq1_m, IQ1_M)
DEQUANT_F16(iq4_nl, IQ4_NL)
DEQUANT_F16(iq4_xs, IQ4_XS)
DEQUANT_F16(tq1_0, TQ1_0)
DEQUANT_F16(tq2_0, TQ2_0)
DEQUANT_F16(mxfp4, MXFP4)
