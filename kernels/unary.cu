// Element-wise functions of one tensor: ggml's unary ops, scale and clamp.
//
// t[0] dst, t[1] src (same shape and type; any strides). i[0] selects the function:
// 0 sqr, 1 sqrt, 2 neg, 3 abs, 4 exp, 5 log, 6 sin, 7 cos, 8 relu, 9 gelu (tanh), 10 gelu_erf,
// 11 silu, 12 sigmoid, 13 tanh, 20 scale (x * f[0] + f[1]), 21 clamp (to [f[0], f[1]]).
#include "common.cuh"

__device__ __forceinline__ float unary_apply(int op, float x, float a, float b) {
    switch (op) {
        case 0: return x * x;
        case 1: return sqrtf(x);
        case 2: return -x;
        case 3: return fabsf(x);
        case 4: return expf(x);
        case 5: return logf(x);
        case 6: return sinf(x);
        case 7: return cosf(x);
        case 8: return fmaxf(x, 0.0f);
        case 9: return act_gelu(x);
        case 10: return act_gelu_erf(x);
        case 11: return act_silu(x);
        case 12: return 1.0f / (1.0f + expf(-x));
        case 13: return tanhf(x);
        case 20: return __fadd_rn(__fmul_rn(x, a), b);
        case 21: return fminf(fmaxf(x, a), b);
        default: return x;
    }
}

template <class T> __device__ void unary(const KParams& p) {
    const TArg& d = p.t[0];
    const TArg& s = p.t[1];
    const int op = p.i[0];
    const float a = p.f[0], b = p.f[1];
    FOR_EACH_ELEMENT(d.ne) {
        T::store(at(d, i0, i1, i2, i3), unary_apply(op, T::load(at(s, i0, i1, i2, i3)), a, b));
    }
}

KERNEL unary_f32(const KParams p) { pdl_wait(); unary<F32>(p); }
KERNEL unary_f16(const KParams p) { pdl_wait(); unary<F16>(p); }
KERNEL unary_bf16(const KParams p) { pdl_wait(); unary<BF16>(p); }
