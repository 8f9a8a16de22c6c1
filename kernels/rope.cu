// Rotary position embedding.
//
// rope_<type>: t[0] dst, t[1] src [ne0, heads, tokens, ne3] (f32 or f16, same type as dst,
// any strides), t[2] i32 positions [tokens]. i[0] n_dims, i[1] mode (0: adjacent pairs
// (2k, 2k+1), 1: NEOX halves (k, k + n_dims/2)); the rotation (f[0] freq_scale, f[1]
// theta_scale = freq_base^(-2 / n_dims), and rope_ext's frequency factors, YaRN blend and
// magnitude in f[2..6], i[7] and aux[3]) as common.cuh's rope_rotate says. Dimensions from
// n_dims on are copied. One thread per pair.
//
// rope_set_rows_<cache>_<idx>: the rope of an f32 K (as above) written into KV-cache rows
// (set_rows fused in; see the kernel).
//
// rope_kv_<cache>_<idx>: a Llama block's whole step between the Q/K/V projections and
// attention in one launch: Q and K rotated, the rotated K and the plain V written into their
// KV-cache rows (see the kernel).
//
// qk_norm_rope_kv_<cache>_<idx>: the same step with each head of Q and K RMS-normed and
// multiplied by its weights before the rotation (Qwen 3's and Gemma 3's Q/K norms).
#include "common.cuh"

// Pair k of row (i1, i2, i3) of s: the two dimensions it covers and their new values.
template <class T>
__device__ __forceinline__ void rope_pair(const KParams& p, const TArg& s, i64 k, i64 i1, i64 i2, i64 i3, i64& a, i64& b,
                                          float& y0, float& y1) {
    const int n_dims = p.i[0];
    if (2 * k >= n_dims) {
        a = 2 * k;
        b = 2 * k + 1;
        y0 = T::load(at(s, a, i1, i2, i3));
        y1 = T::load(at(s, b, i1, i2, i3));
        return;
    }
    if (p.i[1]) {
        a = k;
        b = k + n_dims / 2;
    } else {
        a = 2 * k;
        b = 2 * k + 1;
    }
    const float ps = (float)*(const int*)at(p.t[2], i2, 0, 0, 0);
    rope_rotate(p, ps, (int)k, T::load(at(s, a, i1, i2, i3)), T::load(at(s, b, i1, i2, i3)), y0, y1);
}

template <class T> __device__ void rope(const KParams& p) {
    const TArg& d = p.t[0];
    const TArg& s = p.t[1];
    const i64 pairs[4] = {s.ne[0] / 2, s.ne[1], s.ne[2], s.ne[3]};
    FOR_EACH_ELEMENT(pairs) {
        i64 a, b;
        float y0, y1;
        rope_pair<T>(p, s, i0, i1, i2, i3, a, b, y0, y1);
        T::store(at(d, a, i1, i2, i3), y0);
        T::store(at(d, b, i1, i2, i3), y1);
    }
}

KERNEL rope_f32(const KParams p) { pdl_wait(); rope<F32>(p); }
KERNEL rope_f16(const KParams p) { pdl_wait(); rope<F16>(p); }

// Rope of f32 src [hd, heads, tokens] written straight into rows of a cache t[0]
// [hd * heads, rows] of type D: token i2 goes to row idx[i2] (t[3], i32 or i64 indices).
template <class D, class I> __device__ void rope_set_rows(const KParams& p) {
    const TArg& c = p.t[0];
    const TArg& s = p.t[1];
    const TArg& idx = p.t[3];
    const i64 hd = s.ne[0];
    const i64 pairs[4] = {hd / 2, s.ne[1], s.ne[2], 1};
    FOR_EACH_ELEMENT(pairs) {
        const i64 row = (i64) * (const I*)at(idx, i2, 0, 0, 0);
        if (row < 0 || row >= c.ne[1]) continue;
        i64 a, b;
        float y0, y1;
        rope_pair<F32>(p, s, i0, i1, i2, i3, a, b, y0, y1);
        D::store(at(c, i1 * hd + a, row, 0, 0), y0);
        D::store(at(c, i1 * hd + b, row, 0, 0), y1);
    }
}

KERNEL rope_set_rows_f16_i32(const KParams p) { pdl_wait(); rope_set_rows<F16, int>(p); }
KERNEL rope_set_rows_f16_i64(const KParams p) { pdl_wait(); rope_set_rows<F16, i64>(p); }
KERNEL rope_set_rows_f32_i32(const KParams p) { pdl_wait(); rope_set_rows<F32, int>(p); }
KERNEL rope_set_rows_f32_i64(const KParams p) { pdl_wait(); rope_set_rows<F32, i64>(p); }

// t[0] K cache [hd * kv_heads, rows] of type D, t[1] K f32 [hd, kv_heads, tokens], t[2] i32
// positions [tokens], t[3] cache rows [tokens] (i32 or i64), t[4] Q f32 [hd, heads, tokens],
// t[5] rotated Q (f32, Q's shape), t[6] V f32 [n, tokens], t[7] V cache [n, rows] of type D;
// rope parameters as for rope_f32. Grid y runs over tokens; along x one thread takes a pair of
// Q, then of K, then of V (copied), for (heads + kv_heads) * hd / 2 + ceil(n / 2) threads in all.
// A token whose row is out of the cache's range writes no cache row.
template <class D, class I> __device__ void rope_kv(const KParams& p) {
    const TArg& kc = p.t[0];
    const TArg& k = p.t[1];
    const TArg& q = p.t[4];
    const TArg& qd = p.t[5];
    const TArg& v = p.t[6];
    const TArg& vc = p.t[7];
    const i64 half = k.ne[0] / 2;
    const i64 nq = half * q.ne[1], nk = half * k.ne[1], nv = (v.ne[0] + 1) / 2;
    for (i64 t = blockIdx.y; t < k.ne[2]; t += gridDim.y) {
        const i64 row = (i64) * (const I*)at(p.t[3], t, 0, 0, 0);
        const bool in_cache = row >= 0 && row < kc.ne[1];
        for (i64 w = (i64)blockIdx.x * blockDim.x + threadIdx.x; w < nq + nk + nv; w += (i64)gridDim.x * blockDim.x) {
            i64 a, b;
            float y0, y1;
            if (w < nq) {
                rope_pair<F32>(p, q, w % half, w / half, t, 0, a, b, y0, y1);
                F32::store(at(qd, a, w / half, t, 0), y0);
                F32::store(at(qd, b, w / half, t, 0), y1);
            } else if (!in_cache) {
                continue;
            } else if (w < nq + nk) {
                const i64 kw = w - nq, h = kw / half;
                rope_pair<F32>(p, k, kw % half, h, t, 0, a, b, y0, y1);
                D::store(at(kc, h * k.ne[0] + a, row, 0, 0), y0);
                D::store(at(kc, h * k.ne[0] + b, row, 0, 0), y1);
            } else {
                const i64 c = 2 * (w - nq - nk);
                D::store(at(vc, c, row, 0, 0), F32::load(at(v, c, t, 0, 0)));
                if (c + 1 < v.ne[0]) D::store(at(vc, c + 1, row, 0, 0), F32::load(at(v, c + 1, t, 0, 0)));
            }
        }
    }
}

KERNEL rope_kv_f16_i32(const KParams p) { pdl_wait(); rope_kv<F16, int>(p); }
KERNEL rope_kv_f16_i64(const KParams p) { pdl_wait(); rope_kv<F16, i64>(p); }
KERNEL rope_kv_f32_i32(const KParams p) { pdl_wait(); rope_kv<F32, int>(p); }
KERNEL rope_kv_f32_i64(const KParams p) { pdl_wait(); rope_kv<F32, i64>(p); }

// The tensors of rope_kv, with Q and K their un-normed rows; aux[0] and aux[1] the Q and K norm
// weights (f32, one per dimension of a head), f[6] the norm's epsilon. One warp takes a head of
// Q or K for one token (grid x: ceil((heads + kv_heads) / 4) blocks of 4 warps, then blocks of
// 128 threads copying V's elements; grid y runs over tokens): its lanes sum the head's squares,
// then each lane normalizes and rotates pairs lane, lane + 32, ... A token whose row is out of
// the cache's range writes no cache row.
template <class D, class I> __device__ void qk_norm_rope_kv(const KParams& p) {
    const TArg& kc = p.t[0];
    const TArg& k = p.t[1];
    const TArg& q = p.t[4];
    const TArg& qd = p.t[5];
    const TArg& v = p.t[6];
    const TArg& vc = p.t[7];
    const int hd = (int)k.ne[0], n_dims = p.i[0];
    const i64 heads = q.ne[1] + k.ne[1];
    const i64 head_blocks = (heads + 3) / 4;
    const int lane = threadIdx.x % 32;
    for (i64 t = blockIdx.y; t < k.ne[2]; t += gridDim.y) {
        const i64 row = (i64) * (const I*)at(p.t[3], t, 0, 0, 0);
        const bool in_cache = row >= 0 && row < kc.ne[1];
        if (blockIdx.x >= head_blocks) {
            const i64 c = (blockIdx.x - head_blocks) * blockDim.x + threadIdx.x;
            if (in_cache && c < v.ne[0]) D::store(at(vc, c, row, 0, 0), F32::load(at(v, c, t, 0, 0)));
            continue;
        }
        const i64 h = blockIdx.x * 4 + threadIdx.x / 32;
        const bool is_q = h < q.ne[1];
        if (h >= heads || (!is_q && !in_cache)) continue;
        const TArg& s = is_q ? q : k;
        const i64 hs = is_q ? h : h - q.ne[1];
        const float* w = (const float*)(is_q ? p.aux[0] : p.aux[1]);
        float sq = 0.0f;
        for (int e = lane; e < hd; e += 32) {
            const float x = F32::load(at(s, e, hs, t, 0));
            sq += x * x;
        }
        const float scale = rsqrtf(warp_sum(sq) / (float)hd + p.f[6]);
        const float ps = (float)*(const int*)at(p.t[2], t, 0, 0, 0);
        for (int kp = lane; kp < hd / 2; kp += 32) {
            int a = 2 * kp, b = 2 * kp + 1;
            if (2 * kp < n_dims && p.i[1]) {
                a = kp;
                b = kp + n_dims / 2;
            }
            float y0 = F32::load(at(s, a, hs, t, 0)) * scale * w[a];
            float y1 = F32::load(at(s, b, hs, t, 0)) * scale * w[b];
            if (2 * kp < n_dims) rope_rotate(p, ps, kp, y0, y1, y0, y1);
            if (is_q) {
                F32::store(at(qd, a, hs, t, 0), y0);
                F32::store(at(qd, b, hs, t, 0), y1);
            } else {
                D::store(at(kc, hs * hd + a, row, 0, 0), y0);
                D::store(at(kc, hs * hd + b, row, 0, 0), y1);
            }
        }
    }
}

KERNEL qk_norm_rope_kv_f16_i32(const KParams p) { pdl_wait(); qk_norm_rope_kv<F16, int>(p); }
KERNEL qk_norm_rope_kv_f16_i64(const KParams p) { pdl_wait(); qk_norm_rope_kv<F16, i64>(p); }
KERNEL qk_norm_rope_kv_f32_i32(const KParams p) { pdl_wait(); qk_norm_rope_kv<F32, int>(p); }
KERNEL qk_norm_rope_kv_f32_i64(const KParams p) { pdl_wait(); qk_norm_rope_kv<F32, i64>(p); }
