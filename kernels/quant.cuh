// GGUF block layouts (bit-exact with ggml-common.h; documented in core/src/quant/): reading
// 32 values of a block, and quantizing 32 floats into the simple block types.
//
// Float arithmetic here uses the _rn intrinsics where the host code does a separate multiply
// and add, so that no fused multiply-add changes a rounding and results match the host's bits.
#include "common.cuh"

#define Q4_0 0
#define Q4_1 1
#define Q5_0 2
#define Q5_1 3
#define Q8_0 4
#define Q2_K 5
#define Q3_K 6
#define Q4_K 7
#define Q5_K 8
#define Q6_K 9

template <int Q> struct QInfo;
template <> struct QInfo<Q4_0> { static const int block = 32, bytes = 18; };
template <> struct QInfo<Q4_1> { static const int block = 32, bytes = 20; };
template <> struct QInfo<Q5_0> { static const int block = 32, bytes = 22; };
template <> struct QInfo<Q5_1> { static const int block = 32, bytes = 24; };
template <> struct QInfo<Q8_0> { static const int block = 32, bytes = 34; };
template <> struct QInfo<Q2_K> { static const int block = 256, bytes = 84; };
template <> struct QInfo<Q3_K> { static const int block = 256, bytes = 110; };
template <> struct QInfo<Q4_K> { static const int block = 256, bytes = 144; };
template <> struct QInfo<Q5_K> { static const int block = 256, bytes = 176; };
template <> struct QInfo<Q6_K> { static const int block = 256, bytes = 210; };

__device__ __forceinline__ float ld_h(const u8* p) { return h2f((u16)p[0] | ((u16)p[1] << 8)); }
__device__ __forceinline__ u32 ld_u32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

// The 6-bit scale and min of sub-block j of a Q4_K/Q5_K block's 12-byte scales field.
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, int& sc, int& m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Values 32*s .. 32*s+31 of the block at b (s < block / 32) into out.
template <int Q> __device__ void deq32(const u8* b, int s, float* out);

template <> __device__ void deq32<Q4_0>(const u8* b, int, float* out) {
    const float d = ld_h(b);
    for (int j = 0; j < 16; j++) {
        out[j] = __fmul_rn((float)((b[2 + j] & 15) - 8), d);
        out[j + 16] = __fmul_rn((float)((b[2 + j] >> 4) - 8), d);
    }
}

template <> __device__ void deq32<Q4_1>(const u8* b, int, float* out) {
    const float d = ld_h(b), m = ld_h(b + 2);
    for (int j = 0; j < 16; j++) {
        out[j] = __fadd_rn(__fmul_rn((float)(b[4 + j] & 15), d), m);
        out[j + 16] = __fadd_rn(__fmul_rn((float)(b[4 + j] >> 4), d), m);
    }
}

template <> __device__ void deq32<Q5_0>(const u8* b, int, float* out) {
    const float d = ld_h(b);
    const u32 qh = ld_u32(b + 2);
    for (int j = 0; j < 16; j++) {
        const int q0 = (b[6 + j] & 15) | (((qh >> j) & 1) << 4);
        const int q1 = (b[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        out[j] = __fmul_rn((float)(q0 - 16), d);
        out[j + 16] = __fmul_rn((float)(q1 - 16), d);
    }
}

template <> __device__ void deq32<Q5_1>(const u8* b, int, float* out) {
    const float d = ld_h(b), m = ld_h(b + 2);
    const u32 qh = ld_u32(b + 4);
    for (int j = 0; j < 16; j++) {
        const int q0 = (b[8 + j] & 15) | (((qh >> j) & 1) << 4);
        const int q1 = (b[8 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        out[j] = __fadd_rn(__fmul_rn((float)q0, d), m);
        out[j + 16] = __fadd_rn(__fmul_rn((float)q1, d), m);
    }
}

template <> __device__ void deq32<Q8_0>(const u8* b, int, float* out) {
    const float d = ld_h(b);
    for (int j = 0; j < 32; j++) out[j] = __fmul_rn((float)(i8)b[2 + j], d);
}

// Q2_K: value e = 128n + 32j + l is (qs[32n + l] >> 2j) & 3; scale byte e/16.
template <> __device__ void deq32<Q2_K>(const u8* b, int s, float* out) {
    const float d = ld_h(b + 80), dmin = ld_h(b + 82);
    const int n = s / 4, j = s % 4;
    for (int l = 0; l < 32; l++) {
        const int sc = b[2 * s + l / 16];
        const int q = (b[16 + 32 * n + l] >> (2 * j)) & 3;
        out[l] = __fsub_rn(__fmul_rn(__fmul_rn(d, (float)(sc & 15)), (float)q), __fmul_rn(dmin, (float)(sc >> 4)));
    }
}

// Q3_K: low bits as Q2_K from qs (at 32), high bit hmask[l] >> (4n + j); signed 6-bit scales.
template <> __device__ void deq32<Q3_K>(const u8* b, int s, float* out) {
    const float d = ld_h(b + 108);
    const u8* sc = b + 96;
    const int n = s / 4, j = s % 4;
    for (int l = 0; l < 32; l++) {
        const int sub = 2 * s + l / 16;
        const int low4 = sub < 8 ? (sc[sub] & 15) : (sc[sub - 8] >> 4);
        const int high2 = (sc[8 + sub % 4] >> (2 * (sub / 4))) & 3;
        const int scale = (low4 | (high2 << 4)) - 32;
        const int q = ((b[32 + 32 * n + l] >> (2 * j)) & 3) | (((b[l] >> (4 * n + j)) & 1) << 2);
        out[l] = __fmul_rn(__fmul_rn(d, (float)scale), (float)(q - 4));
    }
}

// Q4_K: sub-block s is the low (s even) or high (s odd) nibbles of qs[32 (s/2) ..].
template <> __device__ void deq32<Q4_K>(const u8* b, int s, float* out) {
    const float d = ld_h(b), dmin = ld_h(b + 2);
    int sc, m;
    scale_min_k4(s, b + 4, sc, m);
    const float dl = __fmul_rn(d, (float)sc), ml = __fmul_rn(dmin, (float)m);
    const u8* qs = b + 16 + 32 * (s / 2);
    const int shift = 4 * (s & 1);
    for (int l = 0; l < 32; l++) out[l] = __fsub_rn(__fmul_rn(dl, (float)((qs[l] >> shift) & 15)), ml);
}

// Q5_K: as Q4_K (qs at 48) plus bit s of qh[l] (qh at 16) as the fifth bit.
template <> __device__ void deq32<Q5_K>(const u8* b, int s, float* out) {
    const float d = ld_h(b), dmin = ld_h(b + 2);
    int sc, m;
    scale_min_k4(s, b + 4, sc, m);
    const float dl = __fmul_rn(d, (float)sc), ml = __fmul_rn(dmin, (float)m);
    const u8* qh = b + 16;
    const u8* qs = b + 48 + 32 * (s / 2);
    const int shift = 4 * (s & 1);
    for (int l = 0; l < 32; l++) {
        const int q = ((qs[l] >> shift) & 15) | (((qh[l] >> s) & 1) << 4);
        out[l] = __fsub_rn(__fmul_rn(dl, (float)q), ml);
    }
}

// Q6_K: value e = 128n + 32m + l: low 4 bits ql[64n + 32(m%2) + l] >> 4(m/2), high 2 bits
// qh[32n + l] >> 2m (qh at 128); int8 scales at 192 (one per 16 values); d at 208.
template <> __device__ void deq32<Q6_K>(const u8* b, int s, float* out) {
    const float d = ld_h(b + 208);
    const int n = s / 4, m = s % 4;
    for (int l = 0; l < 32; l++) {
        const int low = (b[64 * n + 32 * (m % 2) + l] >> (4 * (m / 2))) & 15;
        const int high = (b[128 + 32 * n + l] >> (2 * m)) & 3;
        const int q = (low | (high << 4)) - 32;
        const float sc = (float)(i8)b[192 + (32 * s + l) / 16];
        out[l] = __fmul_rn(__fmul_rn(d, sc), (float)q);
    }
}

// ---- quantizing 32 floats (the reference algorithms of core/src/quant) ----

__device__ __forceinline__ float inverse(float d) { return d != 0.0f ? __frcp_rn(d) : 0.0f; }

// Stores an f16 (every f16 field of a block is 2-byte aligned).
__device__ __forceinline__ void put_h(u8* p, float v) { *(u16*)p = f2h(v); }

// The value of largest magnitude of x[0..n] (the first on ties, keeping its sign) and that
// magnitude.
__device__ __forceinline__ void signed_max(const float* x, int n, float& max, float& amax) {
    max = 0.0f;
    amax = 0.0f;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    }
}

// The value of largest magnitude of 32 values (the first one, keeping its sign).
__device__ __forceinline__ float max_magnitude(const float* x) {
    float max, amax;
    signed_max(x, 32, max, amax);
    return max;
}

__device__ __forceinline__ void min_max(const float* x, float& lo, float& hi) {
    lo = 3.402823466e38f;
    hi = -3.402823466e38f;
    for (int j = 0; j < 32; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
}

// Saturating float -> integer casts (Rust's `as`), truncating toward zero.
__device__ __forceinline__ int sat_i8(float v) { return (int)fminf(fmaxf(truncf(v), -128.0f), 127.0f); }
__device__ __forceinline__ int sat_u8(float v) { return (int)fminf(fmaxf(truncf(v), 0.0f), 255.0f); }

template <int Q> __device__ void quant32(const float* x, u8* b);

template <> __device__ void quant32<Q4_0>(const float* x, u8* b) {
    const float d = __fdiv_rn(max_magnitude(x), -8.0f);
    const float id = inverse(d);
    put_h(b, d);
    for (int j = 0; j < 16; j++) {
        const int q0 = min(sat_i8(__fadd_rn(__fmul_rn(x[j], id), 8.5f)), 15);
        const int q1 = min(sat_i8(__fadd_rn(__fmul_rn(x[j + 16], id), 8.5f)), 15);
        b[2 + j] = (u8)(q0 | (q1 << 4));
    }
}

template <> __device__ void quant32<Q4_1>(const float* x, u8* b) {
    float lo, hi;
    min_max(x, lo, hi);
    const float d = __fdiv_rn(__fsub_rn(hi, lo), 15.0f);
    const float id = inverse(d);
    put_h(b, d);
    put_h(b + 2, lo);
    for (int j = 0; j < 16; j++) {
        const int q0 = min(sat_i8(__fadd_rn(__fmul_rn(__fsub_rn(x[j], lo), id), 0.5f)), 15);
        const int q1 = min(sat_i8(__fadd_rn(__fmul_rn(__fsub_rn(x[j + 16], lo), id), 0.5f)), 15);
        b[4 + j] = (u8)(q0 | (q1 << 4));
    }
}

__device__ __forceinline__ void pack5(const int* q, u8* qs, u8* qh_out) {
    u32 qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (u8)((q[j] & 15) | ((q[j + 16] & 15) << 4));
        qh |= (u32)(q[j] >> 4) << j;
        qh |= (u32)(q[j + 16] >> 4) << (j + 16);
    }
    qh_out[0] = (u8)qh;
    qh_out[1] = (u8)(qh >> 8);
    qh_out[2] = (u8)(qh >> 16);
    qh_out[3] = (u8)(qh >> 24);
}

template <> __device__ void quant32<Q5_0>(const float* x, u8* b) {
    const float d = __fdiv_rn(max_magnitude(x), -16.0f);
    const float id = inverse(d);
    put_h(b, d);
    int q[32];
    for (int j = 0; j < 32; j++) q[j] = min(sat_i8(__fadd_rn(__fmul_rn(x[j], id), 16.5f)), 31);
    pack5(q, b + 6, b + 2);
}

template <> __device__ void quant32<Q5_1>(const float* x, u8* b) {
    float lo, hi;
    min_max(x, lo, hi);
    const float d = __fdiv_rn(__fsub_rn(hi, lo), 31.0f);
    const float id = inverse(d);
    put_h(b, d);
    put_h(b + 2, lo);
    int q[32];
    for (int j = 0; j < 32; j++) q[j] = min(sat_u8(__fadd_rn(__fmul_rn(__fsub_rn(x[j], lo), id), 0.5f)), 31);
    pack5(q, b + 8, b + 4);
}

template <> __device__ void quant32<Q8_0>(const float* x, u8* b) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = inverse(d);
    for (int j = 0; j < 32; j++) {
        const float v = rintf(__fmul_rn(x[j], id));
        b[2 + j] = (u8)(i8)(int)fminf(fmaxf(v, -128.0f), 127.0f);
    }
    put_h(b, d);
}
