// Quantizing 256 floats into the K block types (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): the reference
// algorithms of core/src/quant (k_search.rs and q*_k.rs), step for step. Each sub-block's scale
// (and min) is searched for (make_qkx2_quants, make_qx_quants, make_q3_quants), the scales are
// quantized against their largest, and the values are quantized again against the quantized
// scales. One thread per block: these run for cpy and set_rows into K types, never on a hot path;
// the searches are __noinline__ so that each is compiled once per file, not once per kernel.
//
// Every product and sum is rounded on its own (the _rn intrinsics, never contracted into a fused
// multiply-add), as the host computes them, so that the searches compare the same numbers and
// choose the same candidates. Blocks are assembled in a 4-byte aligned local array, their f16
// fields written whole with put_h, and copied out byte by byte (K blocks of 110 and 210 bytes are
// only 2-byte aligned). Storing a converted f16's low byte on its own is avoided: NVRTC 13.0
// (the H200 machine's) compiled that store as a conversion of the half's value to an integer
// (F2I.U8.F16), which wrote 0 for the Q4_K / Q5_K super-scales.

__device__ __forceinline__ float fmul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float fadd(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float fsub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float fdiv(float a, float b) { return __fdiv_rn(a, b); }
// ggml's nearest_int: halfway cases to even (saturating, as Rust's `as i32`).
__device__ __forceinline__ int nearest_int(float v) { return __float2int_rn(v); }
__device__ __forceinline__ int clampi(int v, int lo, int hi) { return min(max(v, lo), hi); }
// Below this magnitude a group counts as all zeros.
#define GROUP_MAX_EPS 1e-15f

// make_qx_quants sums for one candidate inverse scale: (sum w x q, sum w q^2) with w = x^2.
__device__ void qx_sums(int nmax, const float* x, float iscale, float& sumlx, float& suml2) {
    sumlx = 0.0f;
    suml2 = 0.0f;
    for (int i = 0; i < 16; i++) {
        const float q = (float)clampi(nearest_int(fmul(iscale, x[i])), -nmax, nmax - 1);
        const float w = fmul(x[i], x[i]);
        sumlx = fadd(sumlx, fmul(fmul(w, x[i]), q));
        suml2 = fadd(suml2, fmul(fmul(w, q), q));
    }
}

__device__ void qx_store(int nmax, const float* x, float iscale, i8* l) {
    for (int i = 0; i < 16; i++) l[i] = (i8)(nmax + clampi(nearest_int(fmul(iscale, x[i])), -nmax, nmax - 1));
}

// Symmetric quantization of 16 values to l in 0..2 nmax (offset by nmax), best of 19 candidate
// scales by the x^2-weighted error; returns the scale (Q6_K).
__device__ __noinline__ float make_qx_quants(int nmax, const float* x, i8* l) {
    float max, amax;
    signed_max(x, 16, max, amax);
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < 16; i++) l[i] = 0;
        return 0.0f;
    }
    float iscale = fdiv(-(float)nmax, max);
    qx_store(nmax, x, iscale, l);
    float sumlx, suml2;
    qx_sums(nmax, x, iscale, sumlx, suml2);
    float scale = suml2 != 0.0f ? fdiv(sumlx, suml2) : 0.0f;
    float best = fmul(scale, sumlx);
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = fdiv(-fadd((float)nmax, fmul(0.1f, (float)is)), max);
        qx_sums(nmax, x, iscale, sumlx, suml2);
        if (suml2 > 0.0f && fmul(sumlx, sumlx) > fmul(best, suml2)) {
            qx_store(nmax, x, iscale, l);
            scale = fdiv(sumlx, suml2);
            best = fmul(scale, sumlx);
        }
    }
    return scale;
}

// Symmetric 3-bit quantization of 16 values to l in 0..2 nmax, refined by coordinate descent on
// the x^2-weighted error; returns the scale (Q3_K).
__device__ __noinline__ float make_q3_quants(int nmax, const float* x, i8* l) {
    float max, amax;
    signed_max(x, 16, max, amax);
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < 16; i++) l[i] = 0;
        return 0.0f;
    }
    const float iscale = fdiv(-(float)nmax, max);
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < 16; i++) {
        const int q = clampi(nearest_int(fmul(iscale, x[i])), -nmax, nmax - 1);
        l[i] = (i8)q;
        const float w = fmul(x[i], x[i]);
        sumlx = fadd(sumlx, fmul(fmul(w, x[i]), (float)q));
        suml2 = fadd(suml2, fmul(w, (float)(q * q)));
    }
    for (int it = 0; it < 5; it++) {
        int changed = 0;
        for (int i = 0; i < 16; i++) {
            const float v = x[i], w = fmul(v, v), cur = (float)l[i];
            float slx = fsub(sumlx, fmul(fmul(w, v), cur));
            if (slx > 0.0f) {
                float sl2 = fsub(suml2, fmul(fmul(w, cur), cur));
                const int q = clampi(nearest_int(fdiv(fmul(v, sl2), slx)), -nmax, nmax - 1);
                if (q != l[i]) {
                    slx = fadd(slx, fmul(fmul(w, v), (float)q));
                    sl2 = fadd(sl2, fmul(w, (float)(q * q)));
                    if (sl2 > 0.0f && fmul(fmul(slx, slx), suml2) > fmul(fmul(sumlx, sumlx), sl2)) {
                        l[i] = (i8)q;
                        sumlx = slx;
                        suml2 = sl2;
                        changed++;
                    }
                }
            }
        }
        if (changed == 0) break;
    }
    for (int i = 0; i < 16; i++) l[i] = (i8)(l[i] + nmax);
    return suml2 > 0.0f ? fdiv(sumlx, suml2) : 0.0f;
}

// The search parameters of make_qkx2_quants: the largest quant, the first candidate's offset
// from it, the step between candidates, their count, and whether the error is absolute (else
// squared).
struct Qkx2 {
    int nmax;
    float rmin, rdelta;
    int nstep;
    bool mad;
};

__device__ __forceinline__ float qkx2_err(const Qkx2& p, float d) { return p.mad ? fabsf(d) : fmul(d, d); }

// Asymmetric quantization x ~ scale l - min of n (16 or 32) values with l in 0..nmax, weighted
// by w, over candidate scales refitted by least squares; returns the scale, and -min in *mn.
__device__ __noinline__ float make_qkx2_quants(const Qkx2& p, const float* x, const float* w, int n, u8* l, float* mn) {
    const int nmax = p.nmax;
    float min = x[0], max = x[0], sum_w = 0.0f, sum_x = 0.0f;
    for (int i = 0; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w = fadd(sum_w, w[i]);
        sum_x = fadd(sum_x, fmul(w[i], x[i]));
    }
    if (min > 0.0f) min = 0.0f;
    if (max == min) {
        for (int i = 0; i < n; i++) l[i] = 0;
        *mn = -min;
        return 0.0f;
    }
    float iscale = fdiv((float)nmax, fsub(max, min));
    float scale = fdiv(1.0f, iscale);
    float best_error = 0.0f;
    for (int i = 0; i < n; i++) {
        l[i] = (u8)clampi(nearest_int(fmul(iscale, fsub(x[i], min))), 0, nmax);
        best_error = fadd(best_error, fmul(w[i], qkx2_err(p, fsub(fadd(fmul(scale, (float)l[i]), min), x[i]))));
    }
    u8 aux[32];
    for (int is = 0; is <= p.nstep; is++) {
        iscale = fdiv(fadd(fadd(p.rmin, fmul(p.rdelta, (float)is)), (float)nmax), fsub(max, min));
        float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
        for (int i = 0; i < n; i++) {
            const int q = clampi(nearest_int(fmul(iscale, fsub(x[i], min))), 0, nmax);
            aux[i] = (u8)q;
            const float qf = (float)q;
            sum_l = fadd(sum_l, fmul(w[i], qf));
            sum_l2 = fadd(sum_l2, fmul(fmul(w[i], qf), qf));
            sum_xl = fadd(sum_xl, fmul(fmul(w[i], qf), x[i]));
        }
        const float det = fsub(fmul(sum_w, sum_l2), fmul(sum_l, sum_l));
        if (det > 0.0f) {
            float this_scale = fdiv(fsub(fmul(sum_w, sum_xl), fmul(sum_x, sum_l)), det);
            float this_min = fdiv(fsub(fmul(sum_l2, sum_x), fmul(sum_l, sum_xl)), det);
            if (this_min > 0.0f) {
                this_min = 0.0f;
                this_scale = fdiv(sum_xl, sum_l2);
            }
            float cur = 0.0f;
            for (int i = 0; i < n; i++)
                cur = fadd(cur, fmul(w[i], qkx2_err(p, fsub(fadd(fmul(this_scale, (float)aux[i]), this_min), x[i]))));
            if (cur < best_error) {
                for (int i = 0; i < n; i++) l[i] = aux[i];
                best_error = cur;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *mn = -min;
    return scale;
}

// Q4_K / Q5_K: the 8 sub-block fits, the packed 6-bit scales and mins with the f16 super-scales
// (b[0..16]), and the final quants l (0..nmax) against them.
__device__ __noinline__ void fit_k4(const Qkx2& p, const float* x, u8* b, u8* l) {
    float scales[8], mins[8];
    for (int j = 0; j < 8; j++) {
        const float* xs = x + 32 * j;
        float sum_x2 = 0.0f;
        for (int i = 0; i < 32; i++) sum_x2 = fadd(sum_x2, fmul(xs[i], xs[i]));
        const float av = __fsqrt_rn(fdiv(sum_x2, 32.0f));
        float w[32];
        for (int i = 0; i < 32; i++) w[i] = fadd(av, fabsf(xs[i]));
        scales[j] = make_qkx2_quants(p, xs, w, 32, l + 32 * j, &mins[j]);
    }
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; j++) {
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0.0f ? fdiv(63.0f, max_scale) : 0.0f;
    const float inv_min = max_min > 0.0f ? fdiv(63.0f, max_min) : 0.0f;
    u8* q = b + 4;
    for (int i = 0; i < 12; i++) q[i] = 0;
    for (int j = 0; j < 8; j++) {
        const int ls = clampi(nearest_int(fmul(inv_scale, scales[j])), 0, 63);
        const int lm = clampi(nearest_int(fmul(inv_min, mins[j])), 0, 63);
        if (j < 4) {
            q[j] = (u8)ls;
            q[j + 4] = (u8)lm;
        } else {
            q[j + 4] = (u8)((ls & 15) | ((lm & 15) << 4));
            q[j - 4] |= (u8)((ls >> 4) << 6);
            q[j] |= (u8)((lm >> 4) << 6);
        }
    }
    put_h(b, fdiv(max_scale, 63.0f));
    put_h(b + 2, fdiv(max_min, 63.0f));
    const float d = ld_h(b), dmin = ld_h(b + 2);
    for (int j = 0; j < 8; j++) {
        int sc, m;
        scale_min_k4(j, q, sc, m);
        const float dl = fmul(d, (float)sc);
        if (dl == 0.0f) continue;
        const float ml = fmul(dmin, (float)m);
        for (int i = 32 * j; i < 32 * j + 32; i++) l[i] = (u8)clampi(nearest_int(fdiv(fadd(x[i], ml), dl)), 0, p.nmax);
    }
}

// Quantizes the 256 floats x into a block of type Q at b (QInfo<Q>::bytes bytes, 2-byte aligned).
template <int Q> __device__ __noinline__ void quant256(const float* x, u8* b);

template <> __device__ __noinline__ void quant256<Q2_K>(const float* x, u8* b) {
    const Qkx2 p = {3, -0.5f, 0.1f, 15, true};
    __align__(4) u8 blk[84];
    u8 l[256];
    float scales[16], mins[16];
    for (int j = 0; j < 16; j++) {
        float w[16];
        for (int i = 0; i < 16; i++) w[i] = fabsf(x[16 * j + i]);
        scales[j] = make_qkx2_quants(p, x + 16 * j, w, 16, l + 16 * j, &mins[j]);
    }
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 16; j++) {
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    for (int j = 0; j < 16; j++) blk[j] = 0;
    if (max_scale > 0.0f) {
        const float iscale = fdiv(15.0f, max_scale);
        for (int j = 0; j < 16; j++) blk[j] = (u8)clampi(nearest_int(fmul(iscale, scales[j])), 0, 15);
    }
    put_h(blk + 80, fdiv(max_scale, 15.0f));
    if (max_min > 0.0f) {
        const float iscale = fdiv(15.0f, max_min);
        for (int j = 0; j < 16; j++) blk[j] |= (u8)(clampi(nearest_int(fmul(iscale, mins[j])), 0, 15) << 4);
    }
    put_h(blk + 82, fdiv(max_min, 15.0f));
    const float d = ld_h(blk + 80), dmin = ld_h(blk + 82);
    for (int j = 0; j < 16; j++) {
        const float dl = fmul(d, (float)(blk[j] & 15));
        if (dl == 0.0f) continue;
        const float ml = fmul(dmin, (float)(blk[j] >> 4));
        for (int i = 16 * j; i < 16 * j + 16; i++) l[i] = (u8)clampi(nearest_int(fdiv(fadd(x[i], ml), dl)), 0, 3);
    }
    for (int n = 0; n < 2; n++)
        for (int i = 0; i < 32; i++) {
            const int e = 128 * n + i;
            blk[16 + 32 * n + i] = (u8)(l[e] | (l[e + 32] << 2) | (l[e + 64] << 4) | (l[e + 96] << 6));
        }
    for (int i = 0; i < 84; i++) b[i] = blk[i];
}

// Q3_K's signed 6-bit scale s (0..16) of the 12-byte scales field sc.
__device__ __forceinline__ int q3_scale(const u8* sc, int s) {
    const int low = s < 8 ? sc[s] & 15 : sc[s - 8] >> 4;
    const int high = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
    return (low | (high << 4)) - 32;
}

template <> __device__ __noinline__ void quant256<Q3_K>(const float* x, u8* b) {
    __align__(4) u8 blk[110];
    i8 l[256];
    float scales[16], max_scale, amax;
    for (int j = 0; j < 16; j++) scales[j] = make_q3_quants(4, x + 16 * j, l + 16 * j);
    signed_max(scales, 16, max_scale, amax);
    u8* sc = blk + 96;
    for (int i = 0; i < 12; i++) sc[i] = 0;
    if (max_scale != 0.0f) {
        const float iscale = fdiv(-32.0f, max_scale);
        for (int j = 0; j < 16; j++) {
            const int v = clampi(nearest_int(fmul(iscale, scales[j])), -32, 31) + 32;
            if (j < 8) sc[j] = (u8)(v & 15);
            else sc[j - 8] |= (u8)((v & 15) << 4);
            sc[8 + j % 4] |= (u8)((v >> 4) << (2 * (j / 4)));
        }
        put_h(blk + 108, fdiv(1.0f, iscale));
    } else {
        put_h(blk + 108, 0.0f);
    }
    const float d = ld_h(blk + 108);
    for (int j = 0; j < 16; j++) {
        const float dl = fmul(d, (float)q3_scale(sc, j));
        if (dl == 0.0f) continue;
        for (int i = 16 * j; i < 16 * j + 16; i++) l[i] = (i8)(clampi(nearest_int(fdiv(x[i], dl)), -4, 3) + 4);
    }
    for (int i = 0; i < 96; i++) blk[i] = 0;
    for (int e = 0; e < 256; e++) {
        const int n = e / 128, j = (e / 32) % 4, i = e % 32, q = (u8)l[e];
        blk[32 + 32 * n + i] |= (u8)((q & 3) << (2 * j));
        blk[i] |= (u8)((q >> 2) << (4 * n + j));
    }
    for (int i = 0; i < 110; i++) b[i] = blk[i];
}

template <> __device__ __noinline__ void quant256<Q4_K>(const float* x, u8* b) {
    const Qkx2 p = {15, -1.0f, 0.1f, 20, false};
    __align__(4) u8 blk[144];
    u8 l[256];
    fit_k4(p, x, blk, l);
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 32; i++) blk[16 + 32 * k + i] = (u8)(l[64 * k + i] | (l[64 * k + 32 + i] << 4));
    for (int i = 0; i < 144; i++) b[i] = blk[i];
}

template <> __device__ __noinline__ void quant256<Q5_K>(const float* x, u8* b) {
    const Qkx2 p = {31, -0.5f, 0.1f, 15, false};
    __align__(4) u8 blk[176];
    u8 l[256];
    fit_k4(p, x, blk, l);
    u8* qh = blk + 16;
    u8* qs = blk + 48;
    for (int i = 0; i < 32; i++) qh[i] = 0;
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 32; i++) {
            const int l1 = l[64 * k + i], l2 = l[64 * k + 32 + i];
            qs[32 * k + i] = (u8)((l1 & 15) | ((l2 & 15) << 4));
            qh[i] |= (u8)(((l1 >> 4) << (2 * k)) | ((l2 >> 4) << (2 * k + 1)));
        }
    for (int i = 0; i < 176; i++) b[i] = blk[i];
}

template <> __device__ __noinline__ void quant256<Q6_K>(const float* x, u8* b) {
    __align__(4) u8 blk[210];
    i8 l[256];
    float scales[16], max_scale, amax;
    for (int j = 0; j < 16; j++) scales[j] = make_qx_quants(32, x + 16 * j, l + 16 * j);
    signed_max(scales, 16, max_scale, amax);
    for (int i = 0; i < 210; i++) blk[i] = 0;
    if (amax >= GROUP_MAX_EPS) {
        const float iscale = fdiv(-128.0f, max_scale);
        put_h(blk + 208, fdiv(1.0f, iscale));
        for (int j = 0; j < 16; j++) blk[192 + j] = (u8)(i8)clampi(nearest_int(fmul(iscale, scales[j])), -128, 127);
        const float d = ld_h(blk + 208);
        for (int j = 0; j < 16; j++) {
            const float dl = fmul(d, (float)(i8)blk[192 + j]);
            if (dl == 0.0f) continue;
            for (int i = 16 * j; i < 16 * j + 16; i++) l[i] = (i8)(clampi(nearest_int(fdiv(x[i], dl)), -32, 31) + 32);
        }
        for (int e = 0; e < 256; e++) {
            const int n = e / 128, m = (e / 32) % 4, i = e % 32, q = (u8)l[e];
            blk[64 * n + 32 * (m % 2) + i] |= (u8)((q & 15) << (4 * (m / 2)));
            blk[128 + 32 * n + i] |= (u8)((q >> 4) << (2 * m));
        }
    }
    for (int i = 0; i < 210; i++) b[i] = blk[i];
}

// Quantizes one block of type Q, its QInfo<Q>::block floats x, into b.
template <int Q> __device__ __forceinline__ void quant_block(const float* x, u8* b) {
    if constexpr (QInfo<Q>::block == 32) quant32<Q>(x, b);
    else quant256<Q>(x, b);
}
