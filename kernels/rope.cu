// Rotary position embedding.
//
// rope_<type>: t[0] dst, t[1] src [ne0, heads, tokens, ne3] (f32 or f16, same type as dst,
// any strides), t[2] i32 positions [tokens]. f[0] freq_scale, f[1] theta_scale =
// freq_base^(-2 / n_dims); i[0] n_dims, i[1] mode (0: adjacent pairs (2k, 2k+1), 1: NEOX halves
// (k, k + n_dims/2)). Pair k rotates by theta = freq_scale * pos * theta_scale^k; dimensions
// from n_dims on are copied. One thread per pair.
#include "common.cuh"

// theta_scale^k by repeated multiplication, the order of the host reference.
__device__ __forceinline__ float rope_theta(float pos, float theta_scale, float freq_scale, int k) {
    float t = pos;
    for (int j = 0; j < k; j++) t *= theta_scale;
    return freq_scale * t;
}

template <class T> __device__ void rope(const KParams& p) {
    const TArg& d = p.t[0];
    const TArg& s = p.t[1];
    const TArg& pos = p.t[2];
    const int n_dims = p.i[0], neox = p.i[1];
    const i64 pairs[4] = {s.ne[0] / 2, s.ne[1], s.ne[2], s.ne[3]};
    FOR_EACH_ELEMENT(pairs) {
        const i64 k = i0;
        i64 a, b;
        if (2 * k >= n_dims) {
            a = 2 * k;
            b = 2 * k + 1;
            T::store(at(d, a, i1, i2, i3), T::load(at(s, a, i1, i2, i3)));
            T::store(at(d, b, i1, i2, i3), T::load(at(s, b, i1, i2, i3)));
            continue;
        }
        if (neox) {
            a = k;
            b = k + n_dims / 2;
        } else {
            a = 2 * k;
            b = 2 * k + 1;
        }
        const float ps = (float)*(const int*)at(pos, i2, 0, 0, 0);
        const float theta = rope_theta(ps, p.f[1], p.f[0], (int)k);
        const float c = cosf(theta), sn = sinf(theta);
        const float x0 = T::load(at(s, a, i1, i2, i3));
        const float x1 = T::load(at(s, b, i1, i2, i3));
        T::store(at(d, a, i1, i2, i3), x0 * c - x1 * sn);
        T::store(at(d, b, i1, i2, i3), x0 * sn + x1 * c);
    }
}

KERNEL rope_f32(const KParams p) { rope<F32>(p); }
KERNEL rope_f16(const KParams p) { rope<F16>(p); }
