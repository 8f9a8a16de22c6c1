// All-reduce through peer memory: every rank's GPU writes its values straight into every other
// rank's receive area over NVLink (or PCIe), then each sums what it received, inside one kernel
// launch, so that the sum can sit in a CUDA graph between other kernels with no host step.
//
// Each rank owns a signal block (struct ArSignal, mirrored by backend-cuda/src/comm/peer.rs)
// and a receive area of two slots, each with one region per rank. One call:
//   1. every block writes its share of the tensor into region `rank` of slot (epoch & 1) of
//      every rank's receive area (its own included);
//   2. every block tells its twin block on each rank that it has written this epoch (a release
//      store into that rank's flags) and waits until each twin has written here;
//   3. every block sums its share over the regions of its own slot, in rank order (so every
//      rank gets the same bits), plus an optional residual, into the output;
//   4. the last block to finish advances this rank's epoch.
// Two slots suffice: a rank can start writing slot (e & 1) of call e + 2 only after every
// rank arrived at call e + 1, by when every rank has finished reading call e.
// A rank that never arrives (its GPU failed) makes the others trap after a minute rather than
// hang forever.

#include "common.cuh"

#define AR_MAX_RANKS 8
#define AR_MAX_BLOCKS 64
#define AR_TIMEOUT_NS 60000000000ull

struct ArSignal {
    u64 scratch[AR_MAX_RANKS];
    u64 signal[AR_MAX_RANKS];
    u32 flags[AR_MAX_BLOCKS][AR_MAX_RANKS];
    u32 epoch;
    u32 done;
};

__device__ __forceinline__ void store_release(u32* p, u32 v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ u32 load_acquire(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Loads that fetch again from memory rather than from a cache line of an earlier call.
__device__ __forceinline__ float4 load_fresh4(const float* p) {
    float4 v;
    asm volatile("ld.global.cv.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ float load_fresh(const float* p) {
    float v;
    asm volatile("ld.global.cv.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ u64 global_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// t[0]: the output, f32, contiguous (the input itself for an in-place sum); t[1]: the input;
// t[2]: a residual added to the sum (ptr 0: none), same shape. aux[0]: this rank's ArSignal;
// aux[1]: bytes of one region (the most one call sums). i[0]: this rank; i[1]: number of ranks.
KERNEL all_reduce_f32(KParams p) {
    ArSignal* own = (ArSignal*)p.aux[0];
    const u64 region = p.aux[1];
    const int rank = p.i[0];
    const int n = p.i[1];
    const i64 count = p.t[0].ne[0] * p.t[0].ne[1] * p.t[0].ne[2] * p.t[0].ne[3];
    float* out = (float*)p.t[0].ptr;
    const float* in = (const float*)p.t[1].ptr;
    const float* res = (const float*)p.t[2].ptr;
    const int b = blockIdx.x;

    __shared__ u32 epoch_sh;
    if (threadIdx.x == 0) {
        epoch_sh = *(volatile u32*)&own->epoch + 1;
    }
    __syncthreads();
    const u32 e = epoch_sh;
    // Slot (e & 1) of a receive area holds n regions; region r is what rank r sent.
    const u64 slot = (u64)(e & 1u) * (u64)n * region;

    // This block's share, in whole float4s where the tensor allows.
    const i64 per = ((count + gridDim.x - 1) / gridDim.x + 3) / 4 * 4;
    const i64 lo = (i64)b * per;
    const i64 hi = min(count, lo + per);
    const bool vec = (count % 4) == 0;

    for (int r = 0; r < n; ++r) {
        float* dst = (float*)(own->scratch[r] + slot + (u64)rank * region);
        if (vec) {
            for (i64 i = lo + 4 * threadIdx.x; i < hi; i += 4 * blockDim.x) {
                *(float4*)(dst + i) = *(const float4*)(in + i);
            }
        } else {
            for (i64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
                dst[i] = in[i];
            }
        }
    }
    __threadfence_system();
    __syncthreads();

    if (threadIdx.x < n) {
        const int r = threadIdx.x;
        ArSignal* peer = (ArSignal*)own->signal[r];
        store_release(&peer->flags[b][rank], e);
        const u32* flag = &own->flags[b][r];
        u64 start = 0;
        while ((int)(load_acquire(flag) - e) < 0) {
            const u64 now = global_ns();
            if (start == 0) {
                start = now;
            } else if (now - start > AR_TIMEOUT_NS) {
                __trap();
            }
        }
    }
    __syncthreads();

    const float* recv = (const float*)(own->scratch[rank] + slot);
    const i64 stride = (i64)(region / 4);
    if (vec) {
        for (i64 i = lo + 4 * threadIdx.x; i < hi; i += 4 * blockDim.x) {
            float4 s;
            s.x = s.y = s.z = s.w = 0.f;
            for (int r = 0; r < n; ++r) {
                const float4 v = load_fresh4(recv + r * stride + i);
                s.x += v.x;
                s.y += v.y;
                s.z += v.z;
                s.w += v.w;
            }
            if (res) {
                const float4 a = *(const float4*)(res + i);
                s.x += a.x;
                s.y += a.y;
                s.z += a.z;
                s.w += a.w;
            }
            *(float4*)(out + i) = s;
        }
    } else {
        for (i64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            float s = 0.f;
            for (int r = 0; r < n; ++r) {
                s += load_fresh(recv + r * stride + i);
            }
            out[i] = res ? s + res[i] : s;
        }
    }

    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(&own->done, 1u) == gridDim.x - 1) {
            own->done = 0;
            own->epoch = e;
            __threadfence();
        }
    }
}
