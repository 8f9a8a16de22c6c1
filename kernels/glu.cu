// Gated linear units: act(gate) * up.
//
// glu_<type>: t[0] dst, t[1] a, t[2] b. i[0]: 0 swiglu (silu), 1 geglu (gelu, tanh form).
// i[2] = 1: gate is a and up is b (same shape as dst). i[2] = 0: each row of a holds both halves
// (ne0 = 2 * dst ne0), gate first, or up first when i[1] (swapped) is set.
#include "common.cuh"

template <class T> __device__ void glu(const KParams& p) {
    const TArg& d = p.t[0];
    const TArg& a = p.t[1];
    const TArg& b = p.t[2];
    const int op = p.i[0], swapped = p.i[1], split = p.i[2];
    const i64 n = d.ne[0];
    FOR_EACH_ELEMENT(d.ne) {
        float g, u;
        if (split) {
            g = T::load(at(a, i0, i1, i2, i3));
            u = T::load(at(b, i0, i1, i2, i3));
        } else {
            g = T::load(at(a, i0 + (swapped ? n : 0), i1, i2, i3));
            u = T::load(at(a, i0 + (swapped ? 0 : n), i1, i2, i3));
        }
        T::store(at(d, i0, i1, i2, i3), (op == 0 ? act_silu(g) : act_gelu(g)) * u);
    }
}

KERNEL glu_f32(const KParams p) { glu<F32>(p); }
KERNEL glu_f16(const KParams p) { glu<F16>(p); }
