// Reductions: sum (all elements), sum_rows and mean (each row), argmax (each row).
//
// sum_<type>: one block of 1024 threads; t[0] dst (one f32), t[1] src (f32, f16 or bf16).
// sum_rows_f32: one block per row; t[0] dst [1, ne1, ne2, ne3], t[1] src; i[0] = 1 divides by
// the row length (mean). argmax_f32: one block per row; t[0] i32 dst [ne1], t[1] src; the
// first index of the largest value wins.
#include "common.cuh"

template <class T> __device__ void sum_all(const KParams& p) {
    const TArg& s = p.t[1];
    const i64 rows = s.ne[1] * s.ne[2] * s.ne[3];
    const int warps = blockDim.x / 32, w = threadIdx.x / 32, l = threadIdx.x % 32;
    float acc = 0.0f;
    for (i64 r = w; r < rows; r += warps) {
        i64 i1, i2, i3;
        split_rows(r, s.ne, i1, i2, i3);
        const char* x = at(s, 0, i1, i2, i3);
        for (i64 i = l; i < s.ne[0]; i += 32) acc += T::load(x + i * s.nb[0]);
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) *(float*)p.t[0].ptr = acc;
}

KERNEL sum_f32(const KParams p) { pdl_wait(); sum_all<F32>(p); }
KERNEL sum_f16(const KParams p) { pdl_wait(); sum_all<F16>(p); }
KERNEL sum_bf16(const KParams p) { pdl_wait(); sum_all<BF16>(p); }

KERNEL sum_rows_f32(const KParams p) {
    pdl_wait();
    const TArg& s = p.t[1];
    i64 i1, i2, i3;
    split_rows(blockIdx.x, s.ne, i1, i2, i3);
    const char* x = at(s, 0, i1, i2, i3);
    float acc = 0.0f;
    for (i64 i = threadIdx.x; i < s.ne[0]; i += blockDim.x) acc += F32::load(x + i * s.nb[0]);
    acc = block_sum(acc);
    if (threadIdx.x == 0) F32::store(at(p.t[0], 0, i1, i2, i3), p.i[0] ? acc / (float)s.ne[0] : acc);
}

KERNEL argmax_f32(const KParams p) {
    pdl_wait();
    const TArg& s = p.t[1];
    const char* x = at(s, 0, blockIdx.x, 0, 0);
    float best = NEG_INF;
    int idx = -1;
    for (i64 i = threadIdx.x; i < s.ne[0]; i += blockDim.x) {
        const float v = F32::load(x + i * s.nb[0]);
        if (idx < 0 || v > best) {
            best = v;
            idx = (int)i;
        }
    }
    // Reduce (value, index) pairs: larger value first, then smaller index.
    __shared__ float bv[32];
    __shared__ int bi[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (oi >= 0 && (idx < 0 || ov > best || (ov == best && oi < idx))) {
            best = ov;
            idx = oi;
        }
    }
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    if (l == 0) {
        bv[w] = best;
        bi[w] = idx;
    }
    __syncthreads();
    if (w == 0) {
        best = l < (int)(blockDim.x / 32) ? bv[l] : NEG_INF;
        idx = l < (int)(blockDim.x / 32) ? bi[l] : -1;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
            if (oi >= 0 && (idx < 0 || ov > best || (ov == best && oi < idx))) {
                best = ov;
                idx = oi;
            }
        }
        if (l == 0) ((int*)p.t[0].ptr)[blockIdx.x] = idx < 0 ? 0 : idx;
    }
}
