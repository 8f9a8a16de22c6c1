// The newer GGUF types (layouts in core/src/quant/: iq1.rs, iq2.rs, iq3.rs, iq4.rs, tq.rs,
// mxfp4.rs): QInfo and deq32 (32 values of a block into floats, bit-exact with the host's
// dequantize: _rn intrinsics wherever the host rounds a product or sum on its own).
#include "quant.cuh"
#include "quant_iq_grids.cuh"

#define IQ2_XXS 10
#define IQ2_XS 11
#define IQ2_S 12
#define IQ3_XXS 13
#define IQ3_S 14
#define IQ1_S 15
#define IQ1_M 16
#define IQ4_NL 17
#define IQ4_XS 18
#define TQ1_0 19
#define TQ2_0 20
#define MXFP4 21

template <> struct QInfo<IQ2_XXS> { static const int block = 256, bytes = 66; };
template <> struct QInfo<IQ2_XS> { static const int block = 256, bytes = 74; };
template <> struct QInfo<IQ2_S> { static const int block = 256, bytes = 82; };
template <> struct QInfo<IQ3_XXS> { static const int block = 256, bytes = 98; };
template <> struct QInfo<IQ3_S> { static const int block = 256, bytes = 110; };
template <> struct QInfo<IQ1_S> { static const int block = 256, bytes = 50; };
template <> struct QInfo<IQ1_M> { static const int block = 256, bytes = 56; };
template <> struct QInfo<IQ4_NL> { static const int block = 32, bytes = 18; };
template <> struct QInfo<IQ4_XS> { static const int block = 256, bytes = 136; };
template <> struct QInfo<TQ1_0> { static const int block = 256, bytes = 54; };
template <> struct QInfo<TQ2_0> { static const int block = 256, bytes = 66; };
template <> struct QInfo<MXFP4> { static const int block = 32, bytes = 17; };

// IQ4_NL / IQ4_XS's non-linear table, and MXFP4's E2M1 values doubled.
__device__ const signed char IQ4_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                               1,    13,   25,  38,  53,  69,  89,  113};
__device__ const signed char MXFP4_VALUES[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// The eight signs of a group from seven bits (the eighth makes the count of minus signs even).
__device__ __forceinline__ u32 iq_signs(u32 b7) {
    const u32 b = b7 & 127u;
    return b | ((__popc(b) & 1u) << 7);
}

// Eight values: the bytes of grid entry g (unsigned), times db, negated where sign bit j is set.
__device__ __forceinline__ void iq_group(float* out, float db, u64 g, u32 s) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const float v = __fmul_rn(db, (float)(u8)(g >> (8 * j)));
        out[j] = (s >> j) & 1u ? -v : v;
    }
}

// d * (0.5 + s) * f, rounded as the host rounds it.
__device__ __forceinline__ float iq_scale(float d, u32 s, float f) {
    return __fmul_rn(__fmul_rn(d, __fadd_rn(0.5f, (float)s)), f);
}

template <> __device__ void deq32<IQ2_XXS>(const u8* b, int s, float* out) {
    const float d = ld_h(b);
    const u8* q = b + 2 + 8 * s;
    const u32 aux = ld_u32(q + 4);
    const float db = iq_scale(d, aux >> 28, 0.25f);
    for (int l = 0; l < 4; l++) iq_group(out + 8 * l, db, IQ2XXS_GRID[q[l]], iq_signs(aux >> (7 * l)));
}

template <> __device__ void deq32<IQ2_XS>(const u8* b, int s, float* out) {
    const float d = ld_h(b);
    const u8 sc = b[66 + s];
    const float db[2] = {iq_scale(d, sc & 15, 0.25f), iq_scale(d, sc >> 4, 0.25f)};
    for (int l = 0; l < 4; l++) {
        const u32 q = (u32)b[2 + 8 * s + 2 * l] | ((u32)b[3 + 8 * s + 2 * l] << 8);
        iq_group(out + 8 * l, db[l / 2], IQ2XS_GRID[q & 511], iq_signs(q >> 9));
    }
}

template <> __device__ void deq32<IQ2_S>(const u8* b, int s, float* out) {
    const float d = ld_h(b);
    const u8 sc = b[74 + s];
    const float db[2] = {iq_scale(d, sc & 15, 0.25f), iq_scale(d, sc >> 4, 0.25f)};
    const u32 qh = b[66 + s];
    for (int l = 0; l < 4; l++) {
        const u32 idx = (u32)b[2 + 4 * s + l] | ((qh << (8 - 2 * l)) & 0x300u);
        iq_group(out + 8 * l, db[l / 2], IQ2S_GRID[idx], b[34 + 4 * s + l]);
    }
}

template <> __device__ void deq32<IQ3_XXS>(const u8* b, int s, float* out) {
    const float d = ld_h(b);
    const u8* q = b + 2 + 8 * s;
    const u32 aux = ld_u32(b + 66 + 4 * s);
    const float db = iq_scale(d, aux >> 28, 0.5f);
    for (int l = 0; l < 4; l++) {
        const u64 g = (u64)IQ3XXS_GRID[q[2 * l]] | ((u64)IQ3XXS_GRID[q[2 * l + 1]] << 32);
        iq_group(out + 8 * l, db, g, iq_signs(aux >> (7 * l)));
    }
}

template <> __device__ void deq32<IQ3_S>(const u8* b, int s, float* out) {
    const float d = ld_h(b);
    const u32 sc = (b[106 + s / 2] >> (4 * (s % 2))) & 15u;
    const float db = __fmul_rn(d, (float)(1 + 2 * sc));
    const u32 qh = b[66 + s];
    const u8* q = b + 2 + 8 * s;
    for (int l = 0; l < 4; l++) {
        const u32 i1 = (u32)q[2 * l] | ((qh << (8 - 2 * l)) & 256u);
        const u32 i2 = (u32)q[2 * l + 1] | ((qh << (7 - 2 * l)) & 256u);
        const u64 g = (u64)IQ3S_GRID[i1] | ((u64)IQ3S_GRID[i2] << 32);
        iq_group(out + 8 * l, db, g, b[74 + 4 * s + l]);
    }
}

// Eight values: the signed bytes of IQ1S_GRID entry g plus delta, times dl.
__device__ __forceinline__ void iq1_group(float* out, float dl, u64 g, float delta) {
#pragma unroll
    for (int j = 0; j < 8; j++) out[j] = __fmul_rn(dl, __fadd_rn((float)(i8)(g >> (8 * j)), delta));
}

template <> __device__ void deq32<IQ1_S>(const u8* b, int s, float* out) {
    const float d = ld_h(b);
    const u32 qh = (u32)b[34 + 2 * s] | ((u32)b[35 + 2 * s] << 8);
    const float dl = __fmul_rn(d, (float)(2 * ((qh >> 12) & 7) + 1));
    const float delta = qh & 0x8000u ? -0.125f : 0.125f;
    for (int l = 0; l < 4; l++) {
        const u32 idx = (u32)b[2 + 4 * s + l] | (((qh >> (3 * l)) & 7u) << 8);
        iq1_group(out + 8 * l, dl, IQ1S_GRID[idx], delta);
    }
}

template <> __device__ void deq32<IQ1_M>(const u8* b, int s, float* out) {
    u32 sc[4];
    for (int k = 0; k < 4; k++) sc[k] = (u32)b[48 + 2 * k] | ((u32)b[49 + 2 * k] << 8);
    const u32 bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0u) | ((sc[2] >> 4) & 0x0f00u) | (sc[3] & 0xf000u);
    const float d = h2f((u16)bits);
    const u32 w = sc[s / 2] >> (6 * (s % 2));
    const float dl[2] = {__fmul_rn(d, (float)(2 * (w & 7) + 1)), __fmul_rn(d, (float)(2 * ((w >> 3) & 7) + 1))};
    for (int l = 0; l < 4; l++) {
        const u32 h = (u32)b[32 + 2 * s + l / 2] >> (4 * (l % 2));
        const u32 idx = (u32)b[4 * s + l] | ((h & 7u) << 8);
        iq1_group(out + 8 * l, dl[l / 2], IQ1S_GRID[idx], h & 8u ? -0.125f : 0.125f);
    }
}

template <> __device__ void deq32<IQ4_NL>(const u8* b, int, float* out) {
    const float d = ld_h(b);
    for (int j = 0; j < 16; j++) {
        out[j] = __fmul_rn(d, (float)IQ4_VALUES[b[2 + j] & 15]);
        out[j + 16] = __fmul_rn(d, (float)IQ4_VALUES[b[2 + j] >> 4]);
    }
}

template <> __device__ void deq32<IQ4_XS>(const u8* b, int s, float* out) {
    const float d = ld_h(b);
    const u32 sh = (u32)b[2] | ((u32)b[3] << 8);
    const int ls = (int)(((b[4 + s / 2] >> (4 * (s % 2))) & 15) | (((sh >> (2 * s)) & 3u) << 4));
    const float dl = __fmul_rn(d, (float)(ls - 32));
    const u8* q = b + 8 + 16 * s;
    for (int j = 0; j < 16; j++) {
        out[j] = __fmul_rn(dl, (float)IQ4_VALUES[q[j] & 15]);
        out[j + 16] = __fmul_rn(dl, (float)IQ4_VALUES[q[j] >> 4]);
    }
}

// Digit k of a TQ1_0 byte, less 1.
__device__ __forceinline__ int tq1_digit(u32 q, int k) {
    const u32 p[5] = {1, 3, 9, 27, 81};
    return (int)((((q * p[k]) & 255u) * 3u) >> 8) - 1;
}

template <> __device__ void deq32<TQ1_0>(const u8* b, int s, float* out) {
    const float d = ld_h(b + 52);
    for (int e = 0; e < 32; e++) {
        const int v = 32 * s + e;
        int t;
        if (v < 160) {
            t = tq1_digit(b[v % 32], v / 32);
        } else if (v < 240) {
            t = tq1_digit(b[32 + (v - 160) % 16], (v - 160) / 16);
        } else {
            t = tq1_digit(b[48 + (v - 240) % 4], (v - 240) / 4);
        }
        out[e] = __fmul_rn((float)t, d);
    }
}

template <> __device__ void deq32<TQ2_0>(const u8* b, int s, float* out) {
    const float d = ld_h(b + 64);
    // Values 32 s .. 32 s + 31: bits 2 l of bytes 32 c .. 32 c + 31, with s = 4 c + l.
    const int c = s / 4, l = s % 4;
    for (int m = 0; m < 32; m++) out[m] = __fmul_rn((float)((int)((b[32 * c + m] >> (2 * l)) & 3) - 1), d);
}

// 2^(e - 128) (half the E8M0 scale 2^(e - 127), for the doubled E2M1 values).
__device__ __forceinline__ float e8m0_half(u32 e) {
    const u32 bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
    return __uint_as_float(bits);
}

template <> __device__ void deq32<MXFP4>(const u8* b, int, float* out) {
    const float d = e8m0_half(b[0]);
    for (int j = 0; j < 16; j++) {
        out[j] = __fmul_rn((float)MXFP4_VALUES[b[1 + j] & 15], d);
        out[j + 16] = __fmul_rn((float)MXFP4_VALUES[b[1 + j] >> 4], d);
    }
}
