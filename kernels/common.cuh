// Shared definitions of tessera's CUDA kernels. The backend splices this text into every
// kernel file before NVRTC compiles it (no CUDA headers are needed).
//
// Every kernel takes one argument, KParams (mirrored by `KParams` in backend-cuda/src/cmd.rs):
// t[0] is the destination tensor, t[1..4] the sources in op order, each with its device
// address, elements per axis (ne) and byte strides (nb); aux holds extra addresses (scratch),
// f and i the op's float and integer parameters.

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
typedef signed char i8;

struct TArg {
    u64 ptr;
    i64 ne[4];
    i64 nb[4];
};

struct KParams {
    TArg t[8];
    u64 aux[4];
    float f[8];
    int i[8];
};

#define KERNEL extern "C" __global__ void

// Programmatic dependent launch (Hopper and later): when the backend launches a kernel with
// programmatic stream serialization (on sm_90 and later), the kernel's blocks may be scheduled
// while the kernel before it in the stream is still finishing. pdl_wait() blocks until every
// kernel this one depends on has completed and its memory writes are visible, so every entry
// point calls it as its first statement, before it reads or writes global memory (the test
// `kernel_entry_points_wait_first` in backend-cuda/tests/kernels.rs checks this). Launched the
// ordinary way, the wait returns at once; before sm_90 it compiles to nothing.
// With PDL_EARLY_RELEASE defined (on a GPU used alone, see `Build` in backend-cuda/src/kernels.rs;
// allreduce.cu leaves it out) a kernel also lets the next one be scheduled as soon as it has
// passed its own wait
// (griddepcontrol.launch_dependents); the next kernel still waits for this one to complete
// before it touches memory.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#ifdef PDL_EARLY_RELEASE
    asm volatile("griddepcontrol.launch_dependents;");
#endif
#endif
}

// The first statement of an entry point that calls pdl_wait() itself further on, having issued
// before it only reads of memory that no kernel of the graph writes (the mat-vec kernels' early
// weights, see mmvq.cu). It does nothing; it tells readers and the entry-point check that the
// wait is deliberately later.
__device__ __forceinline__ void pdl_wait_later() {}

#define NEG_INF (-__int_as_float(0x7f800000))

// ---- scalar conversions (round to nearest even, as the host's `half` crate does) ----

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bf2f(u16 b) {
    return __uint_as_float(((u32)b) << 16);
}

__device__ __forceinline__ u16 f2bf(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (u16)((u >> 16) | 0x40u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

// ---- element types: load as float, store from float ----

struct F32 {
    static const int size = 4;
    static __device__ __forceinline__ float load(const char* p) { return *(const float*)p; }
    static __device__ __forceinline__ void store(char* p, float v) { *(float*)p = v; }
};

struct F16 {
    static const int size = 2;
    static __device__ __forceinline__ float load(const char* p) { return h2f(*(const u16*)p); }
    static __device__ __forceinline__ void store(char* p, float v) { *(u16*)p = f2h(v); }
};

struct BF16 {
    static const int size = 2;
    static __device__ __forceinline__ float load(const char* p) { return bf2f(*(const u16*)p); }
    static __device__ __forceinline__ void store(char* p, float v) { *(u16*)p = f2bf(v); }
};

// Four floats as four 16-bit floats of type D (F16 or BF16) in 8 bytes, the first in the low
// half of x; and four f16 in 8 bytes back as floats.
template <class D> __device__ __forceinline__ uint2 pack4(float4 v) {
    u16 h[4];
    D::store((char*)&h[0], v.x);
    D::store((char*)&h[1], v.y);
    D::store((char*)&h[2], v.z);
    D::store((char*)&h[3], v.w);
    return make_uint2((u32)h[0] | ((u32)h[1] << 16), (u32)h[2] | ((u32)h[3] << 16));
}
__device__ __forceinline__ float4 unpack4_f16(uint2 u) {
    return make_float4(h2f((u16)u.x), h2f((u16)(u.x >> 16)), h2f((u16)u.y), h2f((u16)(u.y >> 16)));
}

// ---- addressing ----

__device__ __forceinline__ char* at(const TArg& t, i64 i0, i64 i1, i64 i2, i64 i3) {
    return (char*)t.ptr + i0 * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
}

// i modulo n for broadcasting, cheap in the usual cases n == 1 and i < n.
__device__ __forceinline__ i64 bcast(i64 i, i64 n) {
    return n == 1 ? 0 : (i < n ? i : i % n);
}

// Splits a flat index over dims 1..3 of ne into (i1, i2, i3).
__device__ __forceinline__ void split_rows(i64 r, const i64* ne, i64& i1, i64& i2, i64& i3) {
    i1 = r % ne[1];
    i64 q = r / ne[1];
    i2 = q % ne[2];
    i3 = q / ne[2];
}

// Grid-stride loops over the elements of a 4-D shape: blockIdx.z/gridDim.z walk dims 2-3,
// blockIdx.y/gridDim.y dim 1, the x dimension dim 0. The body sees i0, i1, i2, i3.
#define FOR_EACH_ELEMENT(ne)                                                                  \
    for (i64 i23 = blockIdx.z; i23 < (ne)[2] * (ne)[3]; i23 += gridDim.z)                  \
        for (i64 i1 = blockIdx.y, i2 = i23 % (ne)[2], i3 = i23 / (ne)[2]; i1 < (ne)[1];     \
             i1 += gridDim.y)                                                                \
            for (i64 i0 = (i64)blockIdx.x * blockDim.x + threadIdx.x; i0 < (ne)[0];          \
                 i0 += (i64)gridDim.x * blockDim.x)

// ---- reductions ----

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The q8_1 block of the 32 values x held one per lane (the whole warp calls it): lane l's int8
// to qs[l], (d, d * sum) to *ds (written by lane 0). The layout quantize_q8_1 of mmvq.cu writes
// for the mat-vec kernels, which kernels that make their inputs also write.
__device__ __forceinline__ void q8_1_block(float x, i8* qs, float2* ds) {
    const int l = threadIdx.x % 32;
    const float amax = warp_max(fabsf(x));
    const float d = amax / 127.0f;
    const int q = d == 0.0f ? 0 : __float2int_rn(x / d);
    const float sum = warp_sum((float)q);
    qs[l] = (i8)q;
    if (l == 0) *ds = make_float2(d, d * sum);
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the sum.
__device__ float block_sum(float v) {
    __shared__ float part[32];
    v = warp_sum(v);
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    __syncthreads();
    if (l == 0) part[w] = v;
    __syncthreads();
    v = l < (int)(blockDim.x / 32) ? part[l] : 0.0f;
    return warp_sum(v);
}

// Maximum over the block (as block_sum).
__device__ float block_max(float v) {
    __shared__ float part[32];
    v = warp_max(v);
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    __syncthreads();
    if (l == 0) part[w] = v;
    __syncthreads();
    v = l < (int)(blockDim.x / 32) ? part[l] : NEG_INF;
    return warp_max(v);
}

// ---- rms_norm(x) * w of a row held in registers (norm.cu, allreduce.cu) ----

// The end of rms_norm(x) * w for one row of n4 float4s that the block holds in registers:
// thread t holds x's float4 t + j * blockDim.x (j < J) in v[j] (zeros past the row) and w's in wv[j];
// `sum` is its share of the sum of squares. Writes the row to y and, with qs != 0 (the row a
// multiple of 32 values), its q8_1 blocks as quantize_q8_1 of mmvq.cu does: int8 values at qs,
// (d, d * sum) pairs at ds, `row` the row's index among the rows so written.
template <int J>
__device__ __forceinline__ void rms_norm_mul_row(const float4 (&v)[J], const float4 (&wv)[J], float sum, int n4,
                                                 float eps, float4* y, i64 row, u64 qs, u64 ds) {
    sum = block_sum(sum);
    const float scale = 1.0f / sqrtf(sum / (float)(4 * n4) + eps);
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int c = threadIdx.x + j * blockDim.x;
        if (j * blockDim.x >= n4) break;  // the same for the whole block
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (c < n4) {
            o = make_float4(v[j].x * scale * wv[j].x, v[j].y * scale * wv[j].y, v[j].z * scale * wv[j].z,
                            v[j].w * scale * wv[j].w);
            y[c] = o;
        }
        if (qs != 0) {
            // Lanes 8g .. 8g+7 of a warp hold one 32-value block (c is a multiple of 8 there).
            float amax = fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w)));
#pragma unroll
            for (int m = 4; m > 0; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
            const float dq = amax / 127.0f;
            const int q0 = dq == 0.0f ? 0 : __float2int_rn(o.x / dq);
            const int q1 = dq == 0.0f ? 0 : __float2int_rn(o.y / dq);
            const int q2 = dq == 0.0f ? 0 : __float2int_rn(o.z / dq);
            const int q3 = dq == 0.0f ? 0 : __float2int_rn(o.w / dq);
            int qsum = q0 + q1 + q2 + q3;
#pragma unroll
            for (int m = 4; m > 0; m >>= 1) qsum += __shfl_xor_sync(0xffffffffu, qsum, m);
            if (c < n4) {
                const i64 e = row * 4 * (i64)n4 + 4 * (i64)c;
                ((char4*)qs)[e / 4] = make_char4((signed char)q0, (signed char)q1, (signed char)q2, (signed char)q3);
                if (c % 8 == 0) ((float2*)ds)[e / 32] = make_float2(dq, dq * (float)qsum);
            }
        }
    }
}

// ---- activations shared by several op families ----

// Rope: pair k (x0, x1) at position pos rotated into (y0, y1). Shared by rope.cu and the rope
// fused into mmvq_multi_rope, whose parameters sit in the same slots: f[0] freq_scale, f[1]
// theta_scale = freq_base^(-2 / n_dims); the angle is freq_scale * pos * theta_scale^k (the
// power by repeated multiplication, the order of the host reference).
//
// rope_ext's additions, taken only where i[7] is not 0 (one flag for the whole launch, so the
// plain rotation keeps its instructions): bit 0, frequency factors at aux[3] (f32
// [n_dims / 2]) divide pair k's unscaled angle theta; bit 1, the blend and the magnitude: the
// angle is freq_scale * theta * (1 - ramp) + theta * ramp with ramp = (1 - clamp((k - f[3]) *
// f[4], 0, 1)) * f[2] (f[2] ext_factor, f[3] YaRN's first corrected pair, f[4] the inverse of
// the correction range's width), and cos and sin are multiplied by f[5] (the magnitude, the
// host's product of attn_factor and YaRN's correction).
constexpr int ROPE_FACTORS = 1, ROPE_BLEND = 2;

__device__ __forceinline__ void rope_rotate(const KParams& p, float pos, int k, float x0, float x1, float& y0,
                                            float& y1) {
    const float theta_scale = p.f[1], freq_scale = p.f[0];
    float t = pos;
    for (int j = 0; j < k; j++) t *= theta_scale;
    float theta = freq_scale * t;
    if (p.i[7] != 0) {
        if (p.i[7] & ROPE_FACTORS) {
            t /= ((const float*)p.aux[3])[k];
            theta = freq_scale * t;
        }
        if (p.i[7] & ROPE_BLEND) {
            const float ramp = (1.0f - fminf(fmaxf(((float)k - p.f[3]) * p.f[4], 0.0f), 1.0f)) * p.f[2];
            theta = theta * (1.0f - ramp) + t * ramp;
            // The rotation is linear: scaling the pair scales the result.
            x0 *= p.f[5];
            x1 *= p.f[5];
        }
    }
    const float c = cosf(theta), sn = sinf(theta);
    y0 = x0 * c - x1 * sn;
    y1 = x0 * sn + x1 * c;
}

__device__ __forceinline__ float act_silu(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float act_gelu(float x) {
    const float c = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * x * (1.0f + tanhf(c * x * (1.0f + 0.044715f * x * x)));
}

__device__ __forceinline__ float act_gelu_erf(float x) {
    return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
}

// The shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ u32 smem_u32(const void* ptr) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(ptr));
    return a;
}

// Thread-block clusters (sm_90): a barrier of all the cluster's threads (the shared memory
// writes before it visible to the whole cluster after it), this block's rank in its cluster,
// and a float from the shared memory of block `rank` of the cluster at the address that `p`
// has in this block's.
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
    return r;
}
__device__ __forceinline__ float ld_cluster(const float* p, unsigned rank) {
    float v = 0.0f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    u32 b;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(b) : "r"(smem_u32(p)), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(b) : "memory");
#endif
    return v;
}
