// Element-wise a op b with b broadcast over a (each of b's dims divides a's; index modulo).
//
// t[0] dst (a's type and shape), t[1] a, t[2] b (any float type, any strides).
// i[0]: 0 add, 1 sub, 2 mul, 3 div.
#include "common.cuh"

template <class A, class B> __device__ void binary(const KParams& p) {
    const TArg& d = p.t[0];
    const TArg& a = p.t[1];
    const TArg& b = p.t[2];
    const int op = p.i[0];
    FOR_EACH_ELEMENT(d.ne) {
        const float x = A::load(at(a, i0, i1, i2, i3));
        const float y = B::load(at(b, bcast(i0, b.ne[0]), bcast(i1, b.ne[1]), bcast(i2, b.ne[2]), bcast(i3, b.ne[3])));
        float r;
        switch (op) {
            case 0: r = x + y; break;
            case 1: r = x - y; break;
            case 2: r = x * y; break;
            default: r = x / y; break;
        }
        A::store(at(d, i0, i1, i2, i3), r);
    }
}

#define BINARY(na, A, nb, B) \
    KERNEL binary_##na##_##nb(const KParams p) { binary<A, B>(p); }

BINARY(f32, F32, f32, F32)
BINARY(f32, F32, f16, F16)
BINARY(f32, F32, bf16, BF16)
BINARY(f16, F16, f32, F32)
BINARY(f16, F16, f16, F16)
BINARY(f16, F16, bf16, BF16)
BINARY(bf16, BF16, f32, F32)
BINARY(bf16, BF16, f16, F16)
BINARY(bf16, BF16, bf16, BF16)
