// Element-wise a op b with b broadcast over a (each of b's dims divides a's; index modulo).
//
// t[0] dst (a's type and shape), t[1] a, t[2] b (any float type, any strides).
// i[0]: 0 add, 1 sub, 2 mul, 3 div.
//
// binary_flat_f32: the same for f32 a, b and dst of one shape, all contiguous and 16-byte
// aligned, with an element count that is a multiple of 4: four elements a thread.
#include "common.cuh"

__device__ __forceinline__ float binary_op(int op, float x, float y) {
    switch (op) {
        case 0: return x + y;
        case 1: return x - y;
        case 2: return x * y;
        default: return x / y;
    }
}

template <class A, class B> __device__ void binary(const KParams& p) {
    const TArg& d = p.t[0];
    const TArg& a = p.t[1];
    const TArg& b = p.t[2];
    const int op = p.i[0];
    FOR_EACH_ELEMENT(d.ne) {
        const float x = A::load(at(a, i0, i1, i2, i3));
        const float y = B::load(at(b, bcast(i0, b.ne[0]), bcast(i1, b.ne[1]), bcast(i2, b.ne[2]), bcast(i3, b.ne[3])));
        A::store(at(d, i0, i1, i2, i3), binary_op(op, x, y));
    }
}

#define BINARY(na, A, nb, B) \
    KERNEL binary_##na##_##nb(const KParams p) { pdl_wait(); binary<A, B>(p); }

BINARY(f32, F32, f32, F32)
BINARY(f32, F32, f16, F16)
BINARY(f32, F32, bf16, BF16)
BINARY(f16, F16, f32, F32)
BINARY(f16, F16, f16, F16)
BINARY(f16, F16, bf16, BF16)
BINARY(bf16, BF16, f32, F32)
BINARY(bf16, BF16, f16, F16)
BINARY(bf16, BF16, bf16, BF16)

KERNEL binary_flat_f32(const KParams p) {
    pdl_wait();
    const float4* a = (const float4*)p.t[1].ptr;
    const float4* b = (const float4*)p.t[2].ptr;
    float4* d = (float4*)p.t[0].ptr;
    const i64 n4 = p.t[0].ne[0] * p.t[0].ne[1] * p.t[0].ne[2] * p.t[0].ne[3] / 4;
    const int op = p.i[0];
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (i64)gridDim.x * blockDim.x) {
        const float4 x = a[i], y = b[i];
        d[i] = make_float4(binary_op(op, x.x, y.x), binary_op(op, x.y, y.y), binary_op(op, x.z, y.z), binary_op(op, x.w, y.w));
    }
}
