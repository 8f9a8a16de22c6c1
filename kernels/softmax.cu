// Attention masking and softmax: soft_max (with scale, mask and ALiBi) and diag_mask_inf.
//
// soft_max_f32: one block per row. t[0] dst (contiguous f32), t[1] src (f32), t[2] optional mask
// [ne0, >= ne1, m2, m3] (f32 when i[0] == 1, f16 when i[0] == 2, none when 0; dims 2-3
// broadcast by index modulo). f[0] scale, f[1] max_bias, f[2] m0, f[3] m1, i[1] n_head_log2:
// head h = i2 has slope m0^(h+1) below n_head_log2, m1^(2(h - n_head_log2) + 1) from there.
// y = softmax(x * scale + slope * mask).
// diag_mask_inf_f32: t[0] dst, t[1] src; elements with i0 > i[0] + i1 become -inf.
#include "common.cuh"

template <int M> __device__ __forceinline__ float mask_at(const KParams& p, i64 i0, i64 i1, i64 i2, i64 i3) {
    const TArg& m = p.t[2];
    const char* q = at(m, i0, i1, bcast(i2, m.ne[2]), bcast(i3, m.ne[3]));
    return M == 1 ? F32::load(q) : F16::load(q);
}

template <int M> __device__ void soft_max(const KParams& p) {
    const TArg& d = p.t[0];
    const TArg& s = p.t[1];
    i64 i1, i2, i3;
    split_rows(blockIdx.x, s.ne, i1, i2, i3);
    const float scale = p.f[0];
    float slope = 1.0f;
    if (p.f[1] > 0.0f) {
        const int h = (int)i2, nl = p.i[1];
        slope = h < nl ? powf(p.f[2], (float)(h + 1)) : powf(p.f[3], (float)(2 * (h - nl) + 1));
    }
    const char* x = at(s, 0, i1, i2, i3);
    char* y = at(d, 0, i1, i2, i3);
    const i64 n = s.ne[0];
    float mx = NEG_INF;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) {
        float v = F32::load(x + i * s.nb[0]) * scale;
        if (M) v += slope * mask_at<M>(p, i, i1, i2, i3);
        mx = fmaxf(mx, v);
    }
    mx = block_max(mx);
    float sum = 0.0f;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) {
        float v = F32::load(x + i * s.nb[0]) * scale;
        if (M) v += slope * mask_at<M>(p, i, i1, i2, i3);
        const float e = expf(v - mx);
        sum += e;
        F32::store(y + i * d.nb[0], e);
    }
    const float inv = 1.0f / block_sum(sum);
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) {
        F32::store(y + i * d.nb[0], F32::load(y + i * d.nb[0]) * inv);
    }
}

KERNEL soft_max_f32(const KParams p) { pdl_wait(); soft_max<0>(p); }
KERNEL soft_max_f32_mask_f32(const KParams p) { pdl_wait(); soft_max<1>(p); }
KERNEL soft_max_f32_mask_f16(const KParams p) { pdl_wait(); soft_max<2>(p); }

KERNEL diag_mask_inf_f32(const KParams p) {
    pdl_wait();
    const TArg& d = p.t[0];
    const TArg& s = p.t[1];
    const i64 n_past = p.i[0];
    FOR_EACH_ELEMENT(d.ne) {
        F32::store(at(d, i0, i1, i2, i3), i0 > n_past + i1 ? NEG_INF : F32::load(at(s, i0, i1, i2, i3)));
    }
}
