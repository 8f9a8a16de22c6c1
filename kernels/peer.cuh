// The all-reduce through peer memory's shared layout (kernels/allreduce.cu; mirrored by
// backend-cuda/src/comm/peer.rs), for the kernels that take part in it: the all-reduce kernels
// themselves, and the mat-vec that sends its results into the other ranks' small receive areas
// from its own epilogue (presend, `mmvq` in mmvq.cu).

#define AR_MAX_RANKS 8
#define AR_MAX_BLOCKS 256

#define AR_EMPTY 0x80000000u
#define AR_SMALL_CHUNK 2048

struct ArSignal {
    u64 scratch[AR_MAX_RANKS];
    u64 signal[AR_MAX_RANKS];
    u64 small[AR_MAX_RANKS];
    u32 flags[AR_MAX_BLOCKS][AR_MAX_RANKS];
    u32 small_epoch[AR_MAX_BLOCKS];
    u32 epoch;
    u32 done;
};

// A value as the small all-reduce sends it: -0.0 (AR_EMPTY's pattern, an empty value) becomes
// +0.0.
__device__ __forceinline__ u32 sendable(const float* p) {
    const u32 v = __float_as_uint(*p);
    return v == AR_EMPTY ? 0u : v;
}

__device__ __forceinline__ void store_volatile(void* p, u32 v) {
    asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Sends value x, element i of the tensor the next small all-reduce sums, into this rank's region
// of every other rank's small receive area, in the slot of element i's chunk's call count (as
// all_reduce_small_f32 and all_reduce_small_norm_f32 would send it). `own`: this rank's signal
// block; `region`: bytes of a region; the group's `rank` and `n` ranks. Read the call count only
// after pdl_wait (the all-reduce before it advanced it).
__device__ __forceinline__ void presend_value(const ArSignal* own, u64 region, int rank, int n, i64 i, float x) {
    const u32 e = *(volatile const u32*)&own->small_epoch[i / AR_SMALL_CHUNK];
    const u64 slot = (u64)(e & 1u) * (u64)n * region;
    const u32 v = sendable(&x);
    for (int r = 0; r < n; ++r) {
        if (r != rank) {
            store_volatile((char*)(own->small[r] + slot + (u64)rank * region) + 4 * i, v);
        }
    }
}
