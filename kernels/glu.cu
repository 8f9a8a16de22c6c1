// Gated linear units: act(gate) * up.
//
// glu_<type>: t[0] dst, t[1] a, t[2] b. i[0]: 0 swiglu (silu), 1 geglu (gelu, tanh form).
// i[2] = 1: gate is a and up is b (same shape as dst). i[2] = 0: each row of a holds both halves
// (ne0 = 2 * dst ne0), gate first, or up first when i[1] (swapped) is set.
//
// glu_flat_f32: the two-source form for f32 gate, up and dst of one shape, all contiguous and
// 16-byte aligned, with an element count that is a multiple of 4: four elements a thread.
//
// swiglu_oai_f32: gpt-oss's clamped swiglu of f32 gate t[1] and up t[2] of dst's shape: with
// x = min(gate, limit) and y = clamp(up, -limit, limit), x * sigmoid(alpha x) * (y + 1).
// f[0]: alpha, f[1]: limit.
#include "common.cuh"

__device__ __forceinline__ float glu_op(int op, float g, float u) { return (op == 0 ? act_silu(g) : act_gelu(g)) * u; }

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
        T::store(at(d, i0, i1, i2, i3), glu_op(op, g, u));
    }
}

KERNEL glu_f32(const KParams p) { pdl_wait(); glu<F32>(p); }
KERNEL glu_f16(const KParams p) { pdl_wait(); glu<F16>(p); }

KERNEL glu_flat_f32(const KParams p) {
    pdl_wait();
    const float4* g = (const float4*)p.t[1].ptr;
    const float4* u = (const float4*)p.t[2].ptr;
    float4* d = (float4*)p.t[0].ptr;
    const i64 n4 = p.t[0].ne[0] * p.t[0].ne[1] * p.t[0].ne[2] * p.t[0].ne[3] / 4;
    const int op = p.i[0];
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (i64)gridDim.x * blockDim.x) {
        const float4 a = g[i], b = u[i];
        d[i] = make_float4(glu_op(op, a.x, b.x), glu_op(op, a.y, b.y), glu_op(op, a.z, b.z), glu_op(op, a.w, b.w));
    }
}

KERNEL swiglu_oai_f32(const KParams p) {
    pdl_wait();
    const TArg& d = p.t[0];
    const TArg& a = p.t[1];
    const TArg& b = p.t[2];
    const float alpha = p.f[0], limit = p.f[1];
    FOR_EACH_ELEMENT(d.ne) {
        const float x = fminf(F32::load(at(a, i0, i1, i2, i3)), limit);
        const float y = fminf(fmaxf(F32::load(at(b, i0, i1, i2, i3)), -limit), limit);
        F32::store(at(d, i0, i1, i2, i3), x / (1.0f + expf(-alpha * x)) * (y + 1.0f));
    }
}
