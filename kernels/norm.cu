// Row normalisation: rms_norm, norm (layer norm without affine part), and rms_norm fused with
// the multiplication by a weight that follows it in every Llama block.
//
// One block per row. t[0] dst (contiguous f32), t[1] src (f32, any strides); f[0] = eps.
// rms_norm_mul_f32 also takes t[2], an f32 weight broadcast over the result (index modulo);
// with aux[0] set (ne[0] a multiple of 32, blockDim a multiple of 32) it also writes the result
// as quantize_q8_1 of mmvq.cu does (aux[0] int8 values, aux[1] (d, d * sum) per block, column =
// row), for the mat-vec products that read it next.
//
// rms_norm_mul_vec_f32: the same for rows the host found simple: src, dst and weight rows
// contiguous, 16-byte aligned, ne[0] a multiple of 4 and at most 4 * NORM_VEC * blockDim
// (the weight one row of ne[0] values, broadcast over rows). Each thread loads its values
// once, four at a time, and keeps them in registers; with aux[0] set, ne[0] is a multiple of
// 32 and the 8 lanes that hold a 32-value block quantize it.
#include "common.cuh"

#define NORM_VEC 4

__device__ __forceinline__ void row_of(const KParams& p, i64& i1, i64& i2, i64& i3) {
    split_rows(blockIdx.x, p.t[1].ne, i1, i2, i3);
}

// 1 / sqrt(mean(x^2) + eps) of the row at x (the whole block takes part).
__device__ __forceinline__ float rms_scale(const TArg& s, const char* x, float eps) {
    float sum = 0.0f;
    for (i64 i = threadIdx.x; i < s.ne[0]; i += blockDim.x) {
        const float v = F32::load(x + i * s.nb[0]);
        sum += v * v;
    }
    sum = block_sum(sum);
    return 1.0f / sqrtf(sum / (float)s.ne[0] + eps);
}

KERNEL rms_norm_f32(const KParams p) {
    pdl_wait();
    const TArg& d = p.t[0];
    const TArg& s = p.t[1];
    i64 i1, i2, i3;
    row_of(p, i1, i2, i3);
    const char* x = at(s, 0, i1, i2, i3);
    const float scale = rms_scale(s, x, p.f[0]);
    char* y = at(d, 0, i1, i2, i3);
    for (i64 i = threadIdx.x; i < s.ne[0]; i += blockDim.x) {
        F32::store(y + i * d.nb[0], F32::load(x + i * s.nb[0]) * scale);
    }
}

KERNEL rms_norm_mul_f32(const KParams p) {
    pdl_wait();
    const TArg& d = p.t[0];
    const TArg& s = p.t[1];
    const TArg& w = p.t[2];
    i64 i1, i2, i3;
    row_of(p, i1, i2, i3);
    const char* x = at(s, 0, i1, i2, i3);
    const float scale = rms_scale(s, x, p.f[0]);
    char* y = at(d, 0, i1, i2, i3);
    const char* wr = at(w, 0, bcast(i1, w.ne[1]), bcast(i2, w.ne[2]), bcast(i3, w.ne[3]));
    const bool q8 = p.aux[0] != 0;
    for (i64 i = threadIdx.x; i < s.ne[0]; i += blockDim.x) {
        const float v = F32::load(x + i * s.nb[0]) * scale * F32::load(wr + bcast(i, w.ne[0]) * w.nb[0]);
        F32::store(y + i * d.nb[0], v);
        if (q8) {
            // The warp holds one 32-value block: quantized exactly as quantize_q8_1 would.
            const float amax = warp_max(fabsf(v));
            const float dq = amax / 127.0f;
            const int qv = dq == 0.0f ? 0 : __float2int_rn(v / dq);
            const float sum = warp_sum((float)qv);
            const i64 blk = (i64)blockIdx.x * (s.ne[0] / 32) + i / 32;
            ((i8*)p.aux[0])[blk * 32 + i % 32] = (i8)qv;
            if (i % 32 == 0) ((float2*)p.aux[1])[blk] = make_float2(dq, dq * sum);
        }
    }
}

KERNEL rms_norm_mul_vec_f32(const KParams p) {
    pdl_wait();
    const TArg& s = p.t[1];
    i64 i1, i2, i3;
    row_of(p, i1, i2, i3);
    const float4* x = (const float4*)at(s, 0, i1, i2, i3);
    float4* y = (float4*)at(p.t[0], 0, i1, i2, i3);
    const float4* w = (const float4*)p.t[2].ptr;
    const int n4 = (int)(s.ne[0] / 4);
    // The weights load with the row, not after the reduction: one memory wait, not two.
    float4 v[NORM_VEC], wv[NORM_VEC];
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < NORM_VEC; j++) {
        const int c = threadIdx.x + j * blockDim.x;
        const bool in = c < n4;
        v[j] = in ? x[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        wv[j] = in ? w[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        sum += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    }
    rms_norm_mul_row(v, wv, sum, n4, p.f[0], y, blockIdx.x, p.aux[0], p.aux[1]);
}

// rms_norm_mul_add_vec_f32: rms_norm_mul_vec_f32's rows (without the quantized copy) plus t[3],
// a residual of the result's shape whose rows are contiguous and 16-byte aligned too: dst =
// rms_norm(src) * w + r, a post-norm joining the residual in one pass. dst may share memory
// with src or r: each thread reads the values it writes before the block's reduction.
KERNEL rms_norm_mul_add_vec_f32(const KParams p) {
    pdl_wait();
    const TArg& s = p.t[1];
    i64 i1, i2, i3;
    row_of(p, i1, i2, i3);
    const float4* x = (const float4*)at(s, 0, i1, i2, i3);
    const float4* r = (const float4*)at(p.t[3], 0, i1, i2, i3);
    float4* y = (float4*)at(p.t[0], 0, i1, i2, i3);
    const float4* w = (const float4*)p.t[2].ptr;
    const int n4 = (int)(s.ne[0] / 4);
    float4 v[NORM_VEC], wv[NORM_VEC], rv[NORM_VEC];
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < NORM_VEC; j++) {
        const int c = threadIdx.x + j * blockDim.x;
        const bool in = c < n4;
        const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        v[j] = in ? x[c] : z;
        wv[j] = in ? w[c] : z;
        rv[j] = in ? r[c] : z;
        sum += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    }
    sum = block_sum(sum);
    const float scale = 1.0f / sqrtf(sum / (float)(4 * n4) + p.f[0]);
#pragma unroll
    for (int j = 0; j < NORM_VEC; j++) {
        const int c = threadIdx.x + j * blockDim.x;
        if (c < n4) {
            y[c] = make_float4(v[j].x * scale * wv[j].x + rv[j].x, v[j].y * scale * wv[j].y + rv[j].y,
                               v[j].z * scale * wv[j].z + rv[j].z, v[j].w * scale * wv[j].w + rv[j].w);
        }
    }
}

KERNEL norm_f32(const KParams p) {
    pdl_wait();
    const TArg& d = p.t[0];
    const TArg& s = p.t[1];
    i64 i1, i2, i3;
    row_of(p, i1, i2, i3);
    const char* x = at(s, 0, i1, i2, i3);
    float sum = 0.0f;
    for (i64 i = threadIdx.x; i < s.ne[0]; i += blockDim.x) sum += F32::load(x + i * s.nb[0]);
    const float mean = block_sum(sum) / (float)s.ne[0];
    float var = 0.0f;
    for (i64 i = threadIdx.x; i < s.ne[0]; i += blockDim.x) {
        const float v = F32::load(x + i * s.nb[0]) - mean;
        var += v * v;
    }
    var = block_sum(var) / (float)s.ne[0];
    const float scale = 1.0f / sqrtf(var + p.f[0]);
    char* y = at(d, 0, i1, i2, i3);
    for (i64 i = threadIdx.x; i < s.ne[0]; i += blockDim.x) {
        F32::store(y + i * d.nb[0], (F32::load(x + i * s.nb[0]) - mean) * scale);
    }
}
