// All-reduce through peer memory: every rank's GPU writes its values straight into every other
// rank's receive area over NVLink (or PCIe), then each sums what it received, inside one kernel
// launch, so that the sum can sit in a CUDA graph between other kernels with no host step.
//
// Each rank owns a signal block (struct ArSignal in peer.cuh, mirrored by
// backend-cuda/src/comm/peer.rs)
// and a receive area of two slots, each with one region per rank. One call:
//   1. every block writes its share of the tensor into region `rank` of slot (epoch & 1) of
//      every other rank's receive area (as f32, or as f16 with all_reduce_f32_h);
//   2. every block tells its twin block on each rank that it has written this epoch (a release
//      store into that rank's flags) and waits until each twin has written here;
//   3. every block sums its share over the regions of its own slot and its own input, in rank
//      order (so every rank gets the same bits), plus an optional residual, into the output;
//   4. the last block to finish advances this rank's epoch.
// Two slots suffice: a rank can start writing slot (e & 1) of call e + 2 only after every
// rank arrived at call e + 1, by when every rank has finished reading call e.
// A rank that never arrives (its GPU failed) makes the others trap after a minute rather than
// hang forever.
//
// all_reduce_small_f32 sums small tensors (a decode step's) without flags or fences: each rank
// also owns a small receive area (two slots, one region per rank) that holds the bit pattern
// of -0.0 (AR_EMPTY) wherever nothing has arrived. A rank writes its values (-0.0 sent as
// +0.0) straight into region `rank` of the other ranks' slot, then polls its own slot value by
// value until none is AR_EMPTY, sums in rank order, and writes AR_EMPTY back where it read.
// One NVLink crossing per call instead of the write, fence, flag and poll of the kernel above.
// The values are cut into chunks of AR_SMALL_CHUNK, each with its own call count
// (small_epoch) that picks its slot: a rank writes a value's slot again two calls that touch
// it later, after it received this rank's values of the call between, which this rank sends
// after it emptied that slot. Kernels that cover the chunks differently (one block per chunk,
// or one block for a whole row) keep to the same counts, so they may follow one another.
// all_reduce_small_norm_f32 is that sum for one row, plus a residual, followed in the same
// block by rms_norm(sum) * w (the next Llama block's norm), quantized for the mat-vecs.
// With i[4] set, the kernel that wrote the input (a decode mat-vec, presend_value in
// peer.cuh) has already sent this rank's values, in the same slots: these kernels then only
// receive. The slots stay safe: that kernel runs after this rank's previous all-reduce.

// These kernels wait on other GPUs: they never release the next kernel early
// (PDL_EARLY_RELEASE), so that it cannot take their SMs while they spin.
#undef PDL_EARLY_RELEASE
#include "common.cuh"
#include "peer.cuh"

#define AR_TIMEOUT_NS 60000000000ull
// float4s of a row each thread of all_reduce_small_norm_f32 holds (with 1024 threads: rows of
// up to 8192 values).
#define AR_NORM_VEC 2

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

__device__ __forceinline__ uint2 load_fresh_u2(const void* p) {
    uint2 v;
    asm volatile("ld.global.cv.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
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

// The time a wait has taken: tick() on every spin traps once it passes AR_TIMEOUT_NS (a rank
// that never arrives).
struct Patience {
    u64 start = 0;
    __device__ __forceinline__ void tick() {
        const u64 now = global_ns();
        if (start == 0) {
            start = now;
        } else if (now - start > AR_TIMEOUT_NS) {
            __trap();
        }
    }
};

// What every all-reduce kernel reads from its parameters (layout at all_reduce_f32).
struct ArArgs {
    ArSignal* own;
    u64 region;
    int rank, n;
    i64 count;
    float* out;
    const float* in;
    const float* res;
};

__device__ __forceinline__ ArArgs ar_args(const KParams& p) {
    ArArgs a;
    a.own = (ArSignal*)p.aux[0];
    a.region = p.aux[1];
    a.rank = p.i[0];
    a.n = p.i[1];
    a.count = p.t[0].ne[0] * p.t[0].ne[1] * p.t[0].ne[2] * p.t[0].ne[3];
    a.out = (float*)p.t[0].ptr;
    a.in = (const float*)p.t[1].ptr;
    a.res = (const float*)p.t[2].ptr;
    return a;
}

// The byte offset of slot (e & 1) of a receive area: n regions of `region` bytes a slot.
__device__ __forceinline__ u64 slot_at(const ArArgs& a, u32 e) {
    return (u64)(e & 1u) * (u64)a.n * a.region;
}

// One sum through flags. H: the values cross as f16 (half the bytes over the link; every
// rank's own values are rounded the same way, so that every rank sums the same values).
// A rank's own values are read from its input, not sent to itself. Tensors whose length is no
// multiple of 4 go as f32 (the one-value loop).
template <bool H> __device__ void all_reduce_flags(const KParams& p) {
    const ArArgs a = ar_args(p);
    const int b = blockIdx.x;

    __shared__ u32 epoch_sh;
    if (threadIdx.x == 0) {
        epoch_sh = *(volatile u32*)&a.own->epoch + 1;
    }
    __syncthreads();
    const u32 e = epoch_sh;
    // Slot (e & 1) of a receive area holds n regions; region r is what rank r sent.
    const u64 slot = slot_at(a, e);

    // This block's share, in whole float4s where the tensor allows.
    const i64 per = ((a.count + gridDim.x - 1) / gridDim.x + 3) / 4 * 4;
    const i64 lo = (i64)b * per;
    const i64 hi = min(a.count, lo + per);
    const bool vec = (a.count % 4) == 0;

    for (int r = 0; r < a.n; ++r) {
        if (r == a.rank) continue;
        char* dst = (char*)(a.own->scratch[r] + slot + (u64)a.rank * a.region);
        if (vec) {
            for (i64 i = lo + 4 * threadIdx.x; i < hi; i += 4 * blockDim.x) {
                const float4 v = *(const float4*)(a.in + i);
                if (H) {
                    *(uint2*)(dst + 2 * i) = pack4<F16>(v);
                } else {
                    *(float4*)(dst + 4 * i) = v;
                }
            }
        } else {
            for (i64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
                ((float*)dst)[i] = a.in[i];
            }
        }
    }
    __threadfence_system();
    __syncthreads();

    if (threadIdx.x < a.n && (int)threadIdx.x != a.rank) {
        const int r = threadIdx.x;
        ArSignal* peer = (ArSignal*)a.own->signal[r];
        store_release(&peer->flags[b][a.rank], e);
        const u32* flag = &a.own->flags[b][r];
        Patience wait;
        while ((int)(load_acquire(flag) - e) < 0) {
            wait.tick();
        }
    }
    __syncthreads();

    const char* recv = (const char*)(a.own->scratch[a.rank] + slot);
    if (vec) {
        for (i64 i = lo + 4 * threadIdx.x; i < hi; i += 4 * blockDim.x) {
            float4 s;
            s.x = s.y = s.z = s.w = 0.f;
            for (int r = 0; r < a.n; ++r) {
                float4 v;
                if (r == a.rank) {
                    v = *(const float4*)(a.in + i);
                    if (H) v = unpack4_f16(pack4<F16>(v));
                } else if (H) {
                    v = unpack4_f16(load_fresh_u2(recv + (u64)r * a.region + 2 * i));
                } else {
                    v = load_fresh4((const float*)(recv + (u64)r * a.region) + i);
                }
                s.x += v.x;
                s.y += v.y;
                s.z += v.z;
                s.w += v.w;
            }
            if (a.res) {
                const float4 rv = *(const float4*)(a.res + i);
                s.x += rv.x;
                s.y += rv.y;
                s.z += rv.z;
                s.w += rv.w;
            }
            *(float4*)(a.out + i) = s;
        }
    } else {
        for (i64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            float s = 0.f;
            for (int r = 0; r < a.n; ++r) {
                s += r == a.rank ? a.in[i] : load_fresh((const float*)(recv + (u64)r * a.region) + i);
            }
            a.out[i] = a.res ? s + a.res[i] : s;
        }
    }

    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(&a.own->done, 1u) == gridDim.x - 1) {
            a.own->done = 0;
            a.own->epoch = e;
            __threadfence();
        }
    }
}

// t[0]: the output, f32, contiguous (the input itself for an in-place sum); t[1]: the input;
// t[2]: a residual added to the sum (ptr 0: none), same shape. aux[0]: this rank's ArSignal;
// aux[1]: bytes of one region (the most one call sums). i[0]: this rank; i[1]: number of ranks.
// all_reduce_f32 sends f32 values, all_reduce_f32_h f16 ones.
KERNEL all_reduce_f32(KParams p) {
    pdl_wait();
    all_reduce_flags<false>(p);
}
KERNEL all_reduce_f32_h(KParams p) {
    pdl_wait();
    all_reduce_flags<true>(p);
}

// Four values as sent: -0.0 (AR_EMPTY's pattern) becomes +0.0.
__device__ __forceinline__ uint4 sendable4(const float* p) {
    uint4 v = *(const uint4*)p;
    v.x = v.x == AR_EMPTY ? 0u : v.x;
    v.y = v.y == AR_EMPTY ? 0u : v.y;
    v.z = v.z == AR_EMPTY ? 0u : v.z;
    v.w = v.w == AR_EMPTY ? 0u : v.w;
    return v;
}

__device__ __forceinline__ void store_volatile4(void* p, uint4 v) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
}

__device__ __forceinline__ uint4 load_volatile4(const void* p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

__device__ __forceinline__ u32 load_volatile(const void* p) {
    u32 v;
    asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Waits until none of the values at p is AR_EMPTY (trapping after AR_TIMEOUT_NS), then empties
// them again; returns what arrived.
__device__ __forceinline__ uint4 receive4(void* p) {
    uint4 v = load_volatile4(p);
    Patience wait;
    while (v.x == AR_EMPTY || v.y == AR_EMPTY || v.z == AR_EMPTY || v.w == AR_EMPTY) {
        wait.tick();
        v = load_volatile4(p);
    }
    store_volatile4(p, make_uint4(AR_EMPTY, AR_EMPTY, AR_EMPTY, AR_EMPTY));
    return v;
}

__device__ __forceinline__ u32 receive(void* p) {
    u32 v = load_volatile(p);
    Patience wait;
    while (v == AR_EMPTY) {
        wait.tick();
        v = load_volatile(p);
    }
    store_volatile(p, AR_EMPTY);
    return v;
}

// The four values at p as sent (see sendable4), as floats.
__device__ __forceinline__ float4 own4(const float* p) {
    const uint4 u = sendable4(p);
    return make_float4(__uint_as_float(u.x), __uint_as_float(u.y), __uint_as_float(u.z), __uint_as_float(u.w));
}

// Sends four values (as own4 made them) into region `rank` of slot `slot` of every other rank's
// small area, `off` bytes into the region.
__device__ __forceinline__ void send4(const ArArgs& a, u64 slot, u64 off, float4 v) {
    const uint4 u = make_uint4(__float_as_uint(v.x), __float_as_uint(v.y), __float_as_uint(v.z), __float_as_uint(v.w));
    for (int r = 0; r < a.n; ++r) {
        if (r != a.rank) {
            store_volatile4((char*)(a.own->small[r] + slot + (u64)a.rank * a.region) + off, u);
        }
    }
}

// The sum, in rank order (so that every rank gets the same bits), of four values over the
// ranks: this rank's `own`, the others' as they arrive in slot `slot` of this rank's small
// area, `off` bytes into their regions (emptied again by receive4).
__device__ __forceinline__ float4 sum_ranks4(const ArArgs& a, u64 slot, u64 off, float4 own) {
    char* recv = (char*)(a.own->small[a.rank] + slot);
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int r = 0; r < a.n; ++r) {
        float4 x = own;
        if (r != a.rank) {
            const uint4 u = receive4(recv + (u64)r * a.region + off);
            x = make_float4(__uint_as_float(u.x), __uint_as_float(u.y), __uint_as_float(u.z), __uint_as_float(u.w));
        }
        s.x += x.x;
        s.y += x.y;
        s.z += x.z;
        s.w += x.w;
    }
    return s;
}

// Parameters as all_reduce_f32's, except aux[1]: bytes of one region of the small area; one
// block per chunk of AR_SMALL_CHUNK values.
KERNEL all_reduce_small_f32(KParams p) {
    pdl_wait();
    const ArArgs a = ar_args(p);
    const int b = blockIdx.x;

    __shared__ u32 epoch_sh;
    if (threadIdx.x == 0) {
        epoch_sh = *(volatile u32*)&a.own->small_epoch[b];
    }
    __syncthreads();
    const u32 e = epoch_sh;
    const u64 slot = slot_at(a, e);

    const i64 lo = (i64)b * AR_SMALL_CHUNK;
    const i64 hi = min(a.count, lo + AR_SMALL_CHUNK);
    const bool vec = (a.count % 4) == 0;

    // Each thread sends, then receives, the same elements: an in-place sum reads its input
    // before it writes there. With i[4] set, the kernel that wrote the input has sent it
    // (presend_value).
    const bool send = p.i[4] == 0;
    if (send && vec) {
        for (i64 i = lo + 4 * threadIdx.x; i < hi; i += 4 * blockDim.x) {
            send4(a, slot, 4 * i, own4(a.in + i));
        }
    } else if (send) {
        for (int r = 0; r < a.n; ++r) {
            if (r == a.rank) {
                continue;
            }
            char* dst = (char*)(a.own->small[r] + slot + (u64)a.rank * a.region);
            for (i64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
                store_volatile(dst + 4 * i, sendable(a.in + i));
            }
        }
    }

    if (vec) {
        for (i64 i = lo + 4 * threadIdx.x; i < hi; i += 4 * blockDim.x) {
            // The residual loads before the wait for the others' values.
            const float4 rv = a.res ? *(const float4*)(a.res + i) : make_float4(0.f, 0.f, 0.f, 0.f);
            float4 s = sum_ranks4(a, slot, 4 * i, own4(a.in + i));
            if (a.res) {
                s.x += rv.x;
                s.y += rv.y;
                s.z += rv.z;
                s.w += rv.w;
            }
            *(float4*)(a.out + i) = s;
        }
    } else {
        char* recv = (char*)(a.own->small[a.rank] + slot);
        for (i64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            float s = 0.f;
            for (int r = 0; r < a.n; ++r) {
                const u32 u = r == a.rank ? sendable(a.in + i) : receive(recv + (u64)r * a.region + 4 * i);
                s += __uint_as_float(u);
            }
            a.out[i] = a.res ? s + a.res[i] : s;
        }
    }

    __syncthreads();
    if (threadIdx.x == 0) {
        a.own->small_epoch[b] = e + 1;
    }
}

// t[0]: the sum plus the residual t[2] (ptr 0: none), t[1]: the input, one contiguous f32 row
// of a multiple of 4 values, at most 4 * AR_NORM_VEC * blockDim; t[3]: the norm's weight (f32,
// the row's length, 16-byte aligned); t[4]: rms_norm(t[0]) * t[3]; aux[2], aux[3]: where its
// q8_1 blocks go (0: not wanted); f[0]: eps. Otherwise as all_reduce_small_f32, in one block
// of up to 1024 threads (each thread waits for as few values as it can), each holding up to
// AR_NORM_VEC float4s of the row.
KERNEL __launch_bounds__(1024) all_reduce_small_norm_f32(KParams p) {
    pdl_wait();
    const ArArgs a = ar_args(p);
    const int n4 = (int)(a.count / 4);
    float4* out = (float4*)a.out;
    const float4* res = (const float4*)a.res;
    const float4* w = (const float4*)p.t[3].ptr;
    const int chunks = (4 * n4 + AR_SMALL_CHUNK - 1) / AR_SMALL_CHUNK;

    __shared__ u32 epochs[AR_MAX_BLOCKS];
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
        epochs[c] = *(volatile u32*)&a.own->small_epoch[c];
    }
    __syncthreads();

    // Send. This rank's values, the residual and the weights load first and stay in
    // registers: no memory wait after the values arrive but theirs.
    float4 v[AR_NORM_VEC], wv[AR_NORM_VEC], rv[AR_NORM_VEC];
#pragma unroll
    for (int j = 0; j < AR_NORM_VEC; j++) {
        const int c = threadIdx.x + j * blockDim.x;
        v[j] = wv[j] = rv[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (c >= n4) {
            continue;
        }
        wv[j] = w[c];
        if (res) {
            rv[j] = res[c];
        }
        v[j] = own4(a.in + 4 * c);
        if (p.i[4] == 0) {
            send4(a, slot_at(a, epochs[4 * c / AR_SMALL_CHUNK]), 16 * (u64)c, v[j]);
        }
    }

    // Receive and sum in rank order, add the residual, keep the row for the norm.
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < AR_NORM_VEC; j++) {
        const int c = threadIdx.x + j * blockDim.x;
        if (c >= n4) {
            continue;
        }
        float4 s = sum_ranks4(a, slot_at(a, epochs[4 * c / AR_SMALL_CHUNK]), 16 * (u64)c, v[j]);
        s.x += rv[j].x;
        s.y += rv[j].y;
        s.z += rv[j].z;
        s.w += rv[j].w;
        out[c] = s;
        v[j] = s;
        sum += s.x * s.x + s.y * s.y + s.z * s.z + s.w * s.w;
    }

    rms_norm_mul_row(v, wv, sum, n4, p.f[0], (float4*)p.t[4].ptr, 0, p.aux[2], p.aux[3]);

    __syncthreads();
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
        a.own->small_epoch[c] = epochs[c] + 1;
    }
}
