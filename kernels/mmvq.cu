// Quantized matrix times a few vectors (mul_mat with 1 to 8 columns): each weight byte is read
// once and multiplied with every column.
//
// quantize_q8_1_<type>: the columns of src1 (t[1], f32 or f16, [k, n, e2, e3], any strides) into
// 32-value int8 blocks in scratch: column c = (i3 e2 + i2) n + i1, block j has its 32 int8 at
// aux[0] + (c nblk + j) 32 and (d, d * sum(q)) as two floats at aux[1] + (c nblk + j) 8.
// One warp per block.
//
// mmvq_<type>_<n>: t[0] dst f32 [m, n, e2, e3] (contiguous), t[1] quantized src0 [k, m, d2, d3]
// (rows contiguous); aux as above; i[0] = e2 / d2, i[1] = e3 / d3; i[2] = 1: t[2] is an f32
// residual of dst's shape added to each result (a fused add). One warp per output row; the
// lanes walk the row in tasks of TV values (32, 64 for Q4_K/Q5_K, 128 for Q6_K), load the task's
// weights into registers once and take their integer dot products (dp4a) with every column.
//
// mmvq_glu_<type>: one column, two weight matrices (t[1] gate, t[2] up, same shape and type):
// dst = silu(gate x) * (up x), the gate/up/swiglu of a Llama block for one token.
#include "quant.cuh"

template <class S> __device__ void quantize_q8_1(const KParams& p) {
    const TArg& s = p.t[1];
    const i64 nblk = s.ne[0] / 32;
    const i64 total = nblk * s.ne[1] * s.ne[2] * s.ne[3];
    const i64 g = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (g >= total) return;
    const int l = threadIdx.x % 32;
    const i64 c = g / nblk, j = g % nblk;
    i64 i1, i2, i3;
    split_rows(c, s.ne, i1, i2, i3);
    const float x = S::load(at(s, 32 * j + l, i1, i2, i3));
    const float amax = warp_max(fabsf(x));
    const float d = amax / 127.0f;
    const int q = d == 0.0f ? 0 : __float2int_rn(x / d);
    const float sum = warp_sum((float)q);
    ((i8*)p.aux[0])[g * 32 + l] = (i8)q;
    if (l == 0) ((float2*)p.aux[1])[g] = make_float2(d, d * sum);
}

KERNEL quantize_q8_1_f32(const KParams p) { quantize_q8_1<F32>(p); }
KERNEL quantize_q8_1_f16(const KParams p) { quantize_q8_1<F16>(p); }

// A 4-byte value at a 2-byte aligned address.
__device__ __forceinline__ int ld2(const u8* p) {
    const u16* q = (const u16*)p;
    return (int)((u32)q[0] | ((u32)q[1] << 16));
}

__device__ __forceinline__ int ld4(const u8* p) { return *(const int*)p; }

// The 32 int8 of activation block j of column c, as 8 ints.
struct Act {
    const u8* qs;
    const float2* ds;
    i64 nblk;
    __device__ __forceinline__ void load(i64 c, i64 j, int* y, float2& dsv) const {
        const int4* q = (const int4*)(qs + (c * nblk + j) * 32);
        const int4 a = q[0], b = q[1];
        y[0] = a.x; y[1] = a.y; y[2] = a.z; y[3] = a.w;
        y[4] = b.x; y[5] = b.y; y[6] = b.z; y[7] = b.w;
        dsv = ds[c * nblk + j];
    }
};

// Bits 0..3 of x to bit 4 of bytes 0..3.
__device__ __forceinline__ int spread4(u32 x) {
    return (int)(((x & 1u) << 4) | ((x & 2u) << 11) | ((x & 4u) << 18) | ((x & 8u) << 25));
}

// The column loop of the 32-value types held as low and high nibbles (lo: values 0-15, hi:
// 16-31): per column, s = lo . y[0..16) + hi . y[16..32) and acc += d * ds.x * s + bias * ds.y,
// where bias is the block's min (Q4_1, Q5_1) or -offset * d (Q4_0: 8, Q5_0: 16).
template <int NC>
__device__ __forceinline__ void dot_nibbles(const int* lo, const int* hi, float d, float bias, i64 t, const Act& act, i64 c0, float* acc) {
#pragma unroll
    for (int c = 0; c < NC; c++) {
        int y[8];
        float2 ds;
        act.load(c0 + c, t, y, ds);
        int s = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) s = __dp4a(hi[i], y[4 + i], __dp4a(lo[i], y[i], s));
        acc[c] += d * ds.x * (float)s + bias * ds.y;
    }
}

template <int Q> struct Mmvq;

// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: one 32-value block per task. lo/hi hold values 0-15 and 16-31.
template <> struct Mmvq<Q4_0> {
    static const int TV = 32;
    template <int NC> static __device__ __forceinline__ void dot(const u8* row, i64 t, const Act& act, i64 c0, float* acc) {
        const u8* b = row + t * 18;
        const float d = ld_h(b);
        int lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int w = ld2(b + 2 + 4 * i);
            lo[i] = w & 0x0F0F0F0F;
            hi[i] = (w >> 4) & 0x0F0F0F0F;
        }
        dot_nibbles<NC>(lo, hi, d, -8.0f * d, t, act, c0, acc);
    }
};

template <> struct Mmvq<Q4_1> {
    static const int TV = 32;
    template <int NC> static __device__ __forceinline__ void dot(const u8* row, i64 t, const Act& act, i64 c0, float* acc) {
        const u8* b = row + t * 20;
        const float d = ld_h(b), m = ld_h(b + 2);
        int lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int w = ld4(b + 4 + 4 * i);
            lo[i] = w & 0x0F0F0F0F;
            hi[i] = (w >> 4) & 0x0F0F0F0F;
        }
        dot_nibbles<NC>(lo, hi, d, m, t, act, c0, acc);
    }
};

template <> struct Mmvq<Q5_0> {
    static const int TV = 32;
    template <int NC> static __device__ __forceinline__ void dot(const u8* row, i64 t, const Act& act, i64 c0, float* acc) {
        const u8* b = row + t * 22;
        const float d = ld_h(b);
        const u32 qh = (u32)ld2(b + 2);
        int lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int w = ld2(b + 6 + 4 * i);
            lo[i] = (w & 0x0F0F0F0F) | spread4(qh >> (4 * i));
            hi[i] = ((w >> 4) & 0x0F0F0F0F) | spread4(qh >> (16 + 4 * i));
        }
        dot_nibbles<NC>(lo, hi, d, -16.0f * d, t, act, c0, acc);
    }
};

template <> struct Mmvq<Q5_1> {
    static const int TV = 32;
    template <int NC> static __device__ __forceinline__ void dot(const u8* row, i64 t, const Act& act, i64 c0, float* acc) {
        const u8* b = row + t * 24;
        const float d = ld_h(b), m = ld_h(b + 2);
        const u32 qh = (u32)ld4(b + 4);
        int lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int w = ld4(b + 8 + 4 * i);
            lo[i] = (w & 0x0F0F0F0F) | spread4(qh >> (4 * i));
            hi[i] = ((w >> 4) & 0x0F0F0F0F) | spread4(qh >> (16 + 4 * i));
        }
        dot_nibbles<NC>(lo, hi, d, m, t, act, c0, acc);
    }
};

template <> struct Mmvq<Q8_0> {
    static const int TV = 32;
    template <int NC> static __device__ __forceinline__ void dot(const u8* row, i64 t, const Act& act, i64 c0, float* acc) {
        const u8* b = row + t * 34;
        const float d = ld_h(b);
        int w[8];
#pragma unroll
        for (int i = 0; i < 8; i++) w[i] = ld2(b + 2 + 4 * i);
#pragma unroll
        for (int c = 0; c < NC; c++) {
            int y[8];
            float2 ds;
            act.load(c0 + c, t, y, ds);
            int s = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) s = __dp4a(w[i], y[i], s);
            acc[c] += d * ds.x * (float)s;
        }
    }
};

// Q4_K / Q5_K: a task is sub-blocks 2k and 2k+1 of a block (the low and high nibbles of the
// same 32 qs bytes), activation blocks 2t and 2t+1.
template <int Q> struct MmvqK45 {
    static const int TV = 64;
    template <int NC> static __device__ __forceinline__ void dot(const u8* row, i64 t, const Act& act, i64 c0, float* acc) {
        const int k = (int)(t % 4);
        const u8* b = row + (t / 4) * QInfo<Q>::bytes;
        const float d = ld_h(b), dmin = ld_h(b + 2);
        int sc0, m0, sc1, m1;
        scale_min_k4(2 * k, b + 4, sc0, m0);
        scale_min_k4(2 * k + 1, b + 4, sc1, m1);
        const u8* qs = b + (Q == Q4_K ? 16 : 48) + 32 * k;
        int lo[8], hi[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int w = ld4(qs + 4 * i);
            lo[i] = w & 0x0F0F0F0F;
            hi[i] = (w >> 4) & 0x0F0F0F0F;
            if (Q == Q5_K) {
                const u32 h = (u32)ld4(b + 16 + 4 * i);
                lo[i] |= (int)(((h >> (2 * k)) & 0x01010101u) << 4);
                hi[i] |= (int)(((h >> (2 * k + 1)) & 0x01010101u) << 4);
            }
        }
#pragma unroll
        for (int c = 0; c < NC; c++) {
            int y0[8], y1[8];
            float2 ds0, ds1;
            act.load(c0 + c, 2 * t, y0, ds0);
            act.load(c0 + c, 2 * t + 1, y1, ds1);
            int s0 = 0, s1 = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                s0 = __dp4a(lo[i], y0[i], s0);
                s1 = __dp4a(hi[i], y1[i], s1);
            }
            acc[c] += d * ((float)sc0 * ds0.x * (float)s0 + (float)sc1 * ds1.x * (float)s1)
                    - dmin * ((float)m0 * ds0.y + (float)m1 * ds1.y);
        }
    }
};
template <> struct Mmvq<Q4_K> : MmvqK45<Q4_K> {};
template <> struct Mmvq<Q5_K> : MmvqK45<Q5_K> {};

// Q6_K: a task is one half (n) of a block: 128 values, activation blocks 4t .. 4t+3.
template <> struct Mmvq<Q6_K> {
    static const int TV = 128;
    template <int NC> static __device__ __forceinline__ void dot(const u8* row, i64 t, const Act& act, i64 c0, float* acc) {
        const int n = (int)(t % 2);
        const u8* b = row + (t / 2) * 210;
        const float d = ld_h(b + 208);
        const i8* sc = (const i8*)(b + 192 + 8 * n);
        int h[8];
#pragma unroll
        for (int i = 0; i < 8; i++) h[i] = ld2(b + 128 + 32 * n + 4 * i);
        int q[4][8];
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const int l = ld2(b + 64 * n + 4 * i);
            const int m0 = i / 8;  // m % 2 for this ql int
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int m = m0 + 2 * half;
                const int lowb = (l >> (4 * half)) & 0x0F0F0F0F;
                const int highb = ((h[i % 8] >> (2 * m)) & 0x03030303) << 4;
                q[m][i % 8] = __vsub4(lowb | highb, 0x20202020);
            }
        }
#pragma unroll
        for (int c = 0; c < NC; c++) {
            float r = 0.0f;
#pragma unroll
            for (int m = 0; m < 4; m++) {
                int y[8];
                float2 ds;
                act.load(c0 + c, 4 * t + m, y, ds);
                int sa = 0, sb = 0;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    sa = __dp4a(q[m][i], y[i], sa);
                    sb = __dp4a(q[m][4 + i], y[4 + i], sb);
                }
                r += ds.x * (float)(sc[2 * m] * sa + sc[2 * m + 1] * sb);
            }
            acc[c] += d * r;
        }
    }
};

// One warp per output row (4 rows per block), batch blockIdx.y.
template <int Q, int NC> __device__ void mmvq(const KParams& p) {
    const TArg& d = p.t[0];
    const TArg& w = p.t[1];
    const i64 row = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= w.ne[1]) return;
    const int lane = threadIdx.x % 32;
    const i64 i2 = blockIdx.y % d.ne[2], i3 = blockIdx.y / d.ne[2];
    const u8* wrow = (const u8*)at(w, 0, row, i2 / p.i[0], i3 / p.i[1]);
    const Act act = {(const u8*)p.aux[0], (const float2*)p.aux[1], w.ne[0] / 32};
    const i64 c0 = (i64)blockIdx.y * NC;
    float acc[NC];
#pragma unroll
    for (int c = 0; c < NC; c++) acc[c] = 0.0f;
    const i64 tasks = w.ne[0] / Mmvq<Q>::TV;
    for (i64 t = lane; t < tasks; t += 32) Mmvq<Q>::template dot<NC>(wrow, t, act, c0, acc);
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const float v = warp_sum(acc[c]);
        if (lane == 0) {
            F32::store(at(d, row, c, i2, i3), p.i[2] ? v + F32::load(at(p.t[2], row, c, i2, i3)) : v);
        }
    }
}

template <int Q> __device__ void mmvq_glu(const KParams& p) {
    const TArg& d = p.t[0];
    const TArg& wg = p.t[1];
    const TArg& wu = p.t[2];
    const i64 row = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= wg.ne[1]) return;
    const int lane = threadIdx.x % 32;
    const Act act = {(const u8*)p.aux[0], (const float2*)p.aux[1], wg.ne[0] / 32};
    const u8* g = (const u8*)at(wg, 0, row, 0, 0);
    const u8* u = (const u8*)at(wu, 0, row, 0, 0);
    float ag[1] = {0.0f}, au[1] = {0.0f};
    const i64 tasks = wg.ne[0] / Mmvq<Q>::TV;
    for (i64 t = lane; t < tasks; t += 32) {
        Mmvq<Q>::template dot<1>(g, t, act, 0, ag);
        Mmvq<Q>::template dot<1>(u, t, act, 0, au);
    }
    const float vg = warp_sum(ag[0]), vu = warp_sum(au[0]);
    if (lane == 0) F32::store(at(d, row, 0, 0, 0), act_silu(vg) * vu);
}

// Up to three matrices by one column in one launch (Q, K and V of one token): t[1], t[2],
// t[3] the weights (same type and k), i[0..3] their rows (0: absent), results to the
// contiguous f32 vectors at t[0].ptr, t[4].ptr and aux[2]. One warp per row of the stacked
// matrices.
template <int Q> __device__ void mmvq_multi(const KParams& p) {
    i64 row = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int j = 0;
    while (j < 3 && row >= p.i[j]) {
        row -= p.i[j];
        j++;
    }
    if (j == 3) return;
    const int lane = threadIdx.x % 32;
    const TArg& w = p.t[1 + j];
    const Act act = {(const u8*)p.aux[0], (const float2*)p.aux[1], w.ne[0] / 32};
    const u8* wrow = (const u8*)at(w, 0, row, 0, 0);
    float acc[1] = {0.0f};
    const i64 tasks = w.ne[0] / Mmvq<Q>::TV;
    for (i64 t = lane; t < tasks; t += 32) Mmvq<Q>::template dot<1>(wrow, t, act, 0, acc);
    const float v = warp_sum(acc[0]);
    float* d = (float*)(j == 0 ? p.t[0].ptr : j == 1 ? p.t[4].ptr : p.aux[2]);
    if (lane == 0) d[row] = v;
}

#define MMVQ(nq, Q)                                                          \
    KERNEL mmvq_##nq##_1(const KParams p) { mmvq<Q, 1>(p); }                 \
    KERNEL mmvq_##nq##_2(const KParams p) { mmvq<Q, 2>(p); }                 \
    KERNEL mmvq_##nq##_3(const KParams p) { mmvq<Q, 3>(p); }                 \
    KERNEL mmvq_##nq##_4(const KParams p) { mmvq<Q, 4>(p); }                 \
    KERNEL mmvq_##nq##_5(const KParams p) { mmvq<Q, 5>(p); }                 \
    KERNEL mmvq_##nq##_6(const KParams p) { mmvq<Q, 6>(p); }                 \
    KERNEL mmvq_##nq##_7(const KParams p) { mmvq<Q, 7>(p); }                 \
    KERNEL mmvq_##nq##_8(const KParams p) { mmvq<Q, 8>(p); }                 \
    KERNEL mmvq_glu_##nq(const KParams p) { mmvq_glu<Q>(p); }                \
    KERNEL mmvq_multi_##nq(const KParams p) { mmvq_multi<Q>(p); }

MMVQ(q4_0, Q4_0)
MMVQ(q4_1, Q4_1)
MMVQ(q5_0, Q5_0)
MMVQ(q5_1, Q5_1)
MMVQ(q8_0, Q8_0)
MMVQ(q4_K, Q4_K)
MMVQ(q5_K, Q5_K)
MMVQ(q6_K, Q6_K)
