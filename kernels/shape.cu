// Shape ops that move elements: concat, repeat, pad, and arange (which makes them).
//
// concat_raw<bytes>: t[0] dst, t[1] a, t[2] b, i[0] the axis; elements past a's extent on the
// axis come from b. repeat_raw<bytes>: t[0] dst, t[1] src tiled (index modulo). pad_f32: t[0]
// dst, t[1] src; coordinates outside src are 0. arange_f32: t[0] dst; value i is f[0] + f[1] * i.
#include "common.cuh"

template <class T> __device__ void concat(const KParams& p) {
    const TArg& d = p.t[0];
    const TArg& a = p.t[1];
    const TArg& b = p.t[2];
    const int dim = p.i[0];
    FOR_EACH_ELEMENT(d.ne) {
        i64 c[4] = {i0, i1, i2, i3};
        const TArg* src = &a;
        if (c[dim] >= a.ne[dim]) {
            c[dim] -= a.ne[dim];
            src = &b;
        }
        *(T*)at(d, i0, i1, i2, i3) = *(const T*)at(*src, c[0], c[1], c[2], c[3]);
    }
}

template <class T> __device__ void repeat(const KParams& p) {
    const TArg& d = p.t[0];
    const TArg& s = p.t[1];
    FOR_EACH_ELEMENT(d.ne) {
        *(T*)at(d, i0, i1, i2, i3) = *(const T*)at(s, bcast(i0, s.ne[0]), bcast(i1, s.ne[1]), bcast(i2, s.ne[2]), bcast(i3, s.ne[3]));
    }
}

KERNEL concat_raw2(const KParams p) { pdl_wait(); concat<u16>(p); }
KERNEL concat_raw4(const KParams p) { pdl_wait(); concat<u32>(p); }
KERNEL concat_raw8(const KParams p) { pdl_wait(); concat<u64>(p); }
KERNEL repeat_raw2(const KParams p) { pdl_wait(); repeat<u16>(p); }
KERNEL repeat_raw4(const KParams p) { pdl_wait(); repeat<u32>(p); }
KERNEL repeat_raw8(const KParams p) { pdl_wait(); repeat<u64>(p); }

KERNEL pad_f32(const KParams p) {
    pdl_wait();
    const TArg& d = p.t[0];
    const TArg& s = p.t[1];
    FOR_EACH_ELEMENT(d.ne) {
        const bool inside = i0 < s.ne[0] && i1 < s.ne[1] && i2 < s.ne[2] && i3 < s.ne[3];
        F32::store(at(d, i0, i1, i2, i3), inside ? F32::load(at(s, i0, i1, i2, i3)) : 0.0f);
    }
}

KERNEL arange_f32(const KParams p) {
    pdl_wait();
    const TArg& d = p.t[0];
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < d.ne[0]; i += (i64)gridDim.x * blockDim.x) {
        F32::store(at(d, i, 0, 0, 0), __fadd_rn(p.f[0], __fmul_rn(p.f[1], (float)i)));
    }
}
