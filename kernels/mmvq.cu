// Quantized matrix times a few vectors (mul_mat with 1 to 8 columns): each weight byte is read
// once and multiplied with every column.
//
// quantize_q8_1_<type>: the columns of src1 (t[1], f32 or f16, [k, n, e2, e3], any strides) into
// 32-value int8 blocks in scratch: column c = (i3 e2 + i2) n + i1, block j has its 32 int8 at
// aux[0] + (c nblk + j) 32 and (d, d * sum(q)) as two floats at aux[1] + (c nblk + j) 8.
// One warp per block.
//
// The mat-vec kernels below take one of two geometries (`Geom`; mmvq_launch in
// backend-cuda/src/ops/matmul.rs mirrors the choice). A row of weights is cut into tasks of TV
// values (32; 64 for the k-quants), one task per lane at a time; each lane takes its
// task's integer dot products (dp4a) with every column.
// - Direct (`direct_rows`; the 32-value types): one row per warp, 4 rows per block of 128
//   threads; lane l takes tasks l, l + 32, ... with the weights loaded straight from global
//   memory.
// - Staged (`stream_rows`; the k-quants, for rows of at least KS tiles of 32 tasks):
//   a warp copies a tile of each of its S rows ("streams") from global to shared memory with
//   16-byte asynchronous copies (cp.async, bypassing L1), the next tile's copies in flight while
//   it computes the current one; the activations of a task are read once for all S rows.
//   `Mmvq<Q>::SL` tile slots per warp bound the shared memory (at most 28 KiB a block). ROWS(Q)
//   rows per block: 2 for Q8_0, 4 for the others, in groups of rows whose tiles KS(Q) warps
//   share (tile j to the group's warp j % KS, partial sums added through shared memory): KS = 4
//   (one group) for the 32-value types, 2 for the k-quants.
// Each is the faster one for its types on the H200 (BENCHMARKS.md, "CUDA kernels").
// Early weights (i[3] & 4, set where no node of the graph writes the weights; used by the types
// whose Mmvq<Q>::EARLY is set, Q4_K and Q5_K): the staged engine issues its first tiles' copies
// before pdl_wait(), so that their latency overlaps the end of the kernel ahead; everything else
// (activations, outputs) waits. The mat-vec entry points therefore begin with pdl_wait_later()
// and the engines call pdl_wait() themselves, through the `wait` they are given.
//
// mmvq_<type>_<n>: t[0] dst f32 [m, n, e2, e3] (contiguous), t[1] quantized src0 [k, m, d2, d3]
// (rows contiguous); aux as above; i[0] = e2 / d2, i[1] = e3 / d3; i[2] = 1: t[2] is an f32
// residual of dst's shape added to each result (a fused add); i[4] = rank + 1, i[5], aux[2],
// aux[3]: each result also goes to the peer all-reduce group's other ranks (see store_row; one
// column). Grid (ceil(m / R), e2 e3), R the
// rows per block of the geometry (`Geom::rows`): block x computes rows R x .. R x + R - 1; batch
// blockIdx.y, n columns.
//
// mmvq_glu_<type>: one column, two weight matrices (t[1] gate, t[2] up, same shape and type,
// m rows): dst (t[0], f32, contiguous) = act(gate x) * (up x) with act SiLU (i[6] 0: SwiGLU) or
// GELU tanh (i[6] 1: GEGLU), the gated feed-forward of a block for one token; aux[0], aux[1] the quantized x as above. Grid and blocks as
// mmvq_<type>_1. With aux[2], aux[3] and t[3].ptr set (m a multiple of 32), dst is also written
// quantized, in the layout quantize_q8_1_f32 writes for a [m] column: 32-value block b's int8 at
// aux[2] + 32 b, its float2 (d, d * sum(q)) at aux[3] + 8 b, bit-identical to quantize_q8_1_f32
// of dst. t[3].ptr holds m / 32 zeroed u32 counters, one per 32-row block, which the kernel leaves
// at zero: the last of the grid's blocks to finish a 32-row block's rows quantizes them.
//
// mmvq_multi_<type>: up to three matrices by one column in one launch (Q, K and V of one token):
// t[1], t[2], t[3] the weights (same type and k), i[0..3] their rows (0: absent), results to the
// contiguous f32 vectors at t[0].ptr, t[4].ptr and aux[2]; aux[0], aux[1] the quantized column.
// Grid ceil((i[0] + i[1] + i[2]) / R) blocks of 128 threads over the stacked rows (R as above).
//
// mmvq_multi_rope_<type>: mmvq_multi of a token's Q, K and V with what follows them in a Llama
// block fused in (rope_kv in rope.cu): Q and K rotated in adjacent pairs (rope mode 0; rows 2 k
// and 2 k + 1 of a block are always both in it), Q stored to t[0] (f32, [hd, heads]), K and V
// to row idx of their caches (f16). t[4] the K cache, t[5] the V cache, t[6] the i32 position,
// t[7] the cache row (i64 when i[5], else i32); out of the cache's range, no cache row is
// written. i[4] n_dims, i[6] hd; the rotation in f[0..6], i[7] and aux[3] as common.cuh's
// rope_rotate says.
#include "quant.cuh"
#include "quant_iq.cuh"
#include "peer.cuh"

template <class S> __device__ void quantize_q8_1(const KParams& p) {
    const TArg& s = p.t[1];
    const i64 nblk = s.ne[0] / 32;
    const i64 total = nblk * s.ne[1] * s.ne[2] * s.ne[3];
    const i64 g = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (g >= total) return;
    const int l = threadIdx.x % 32;
    const i64 c = g / nblk, j = g % nblk;
    i64 i1, i2, i3;
    split_rows(c, s.ne, i1, i2, i3);
    const float x = S::load(at(s, 32 * j + l, i1, i2, i3));
    q8_1_block(x, (i8*)p.aux[0] + g * 32, (float2*)p.aux[1] + g);
}

KERNEL quantize_q8_1_f32(const KParams p) { pdl_wait(); quantize_q8_1<F32>(p); }
KERNEL quantize_q8_1_f16(const KParams p) { pdl_wait(); quantize_q8_1<F16>(p); }

__device__ __forceinline__ int ld4(const u8* p) { return *(const int*)p; }

// An f16 at a 2-byte aligned address, as float.
__device__ __forceinline__ float ldh(const u8* p) { return h2f(*(const u16*)p); }

// out[i] = the 4-byte value at p + 4 i (i < N), p 2-byte aligned: N or N + 1 aligned 4-byte
// loads and funnel shifts (half the loads of 2-byte ones). Reads at most 2 bytes past p + 4 N.
template <int N> __device__ __forceinline__ void ld_words(const u8* p, int* out) {
    const bool odd = ((size_t)p & 2) != 0;
    const u32* a = (const u32*)(p - ((size_t)p & 2));
    u32 w[N + 1];
#pragma unroll
    for (int i = 0; i < N; i++) w[i] = a[i];
    w[N] = 0;
    if (odd) w[N] = a[N];
#pragma unroll
    for (int i = 0; i < N; i++) out[i] = (int)__funnelshift_r(w[i], w[i + 1], odd ? 16 : 0);
}

// The activations: column c's TV int8 values of task t as ints (y[8 i .. 8 i + 8) from q8_1
// block Q::blk(t, i) of the row, i < TV / 32), and those blocks' (d, d * sum). Read-only loads.
struct Act {
    const u8* qs;
    const float2* ds;
    i64 nblk;
    template <class Q> __device__ __forceinline__ void load(i64 c, int t, int* y, float2* dsv) const {
#pragma unroll
        for (int i = 0; i < Q::TV / 32; i++) {
            const i64 j = c * nblk + Q::blk(t, i);
            const int4* q = (const int4*)(qs + j * 32);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int4 v = __ldg(q + h);
                y[8 * i + 4 * h] = v.x;
                y[8 * i + 4 * h + 1] = v.y;
                y[8 * i + 4 * h + 2] = v.z;
                y[8 * i + 4 * h + 3] = v.w;
            }
            dsv[i] = __ldg(ds + j);
        }
    }
};

// The activations of task t for one column, as Act::load gives them.
template <class Q> struct Y {
    int y[Q::TV / 4];
    float2 ds[Q::TV / 32];
};

// The q8_1 blocks of a task whose TV values are consecutive: task t's i-th 32 are block
// TV / 32 t + i of the row.
template <int TV> struct Consecutive {
    static __device__ __forceinline__ int blk(int t, int i) { return TV / 32 * t + i; }
};

// Bits 0..3 of x to bit 4 of bytes 0..3.
__device__ __forceinline__ int spread4(u32 x) {
    return (int)(((x & 1u) << 4) | ((x & 2u) << 11) | ((x & 4u) << 18) | ((x & 8u) << 25));
}

// Mmvq<Q> describes a type to the engine: TV values per task, blk(t, i) the q8_1 block of the
// row holding task t's i-th 32 values (i < TV / 32), SL tile slots of shared memory per warp,
// ROWS rows per block of the plain kernels, split into groups of ROWS KS / 4 rows whose tiles
// KS warps share, W the weights of one task decoded into registers by load(b, sub, w) (b: the
// task's block, in shared memory; sub: the task's index within its block), and dot(w, y, ds):
// the task's contribution for one column, y its TV int8 activations as ints (in blk's order),
// ds their TV / 32 blocks' (d, d * sum).
template <int Q> struct Mmvq;

// The 32-value types held as low and high nibbles (lo: values 0-15, hi: 16-31):
// d * ds.x * (lo . y[0..16) + hi . y[16..32)) + bias * ds.y, where bias is the block's min
// (Q4_1, Q5_1) or -offset * d (Q4_0: 8, Q5_0: 16).
struct Nibbles : Consecutive<32> {
    static const int TV = 32;
    static const bool EARLY = false;  // early weights: the direct geometry loads nothing early
    static const int SL = 8;
    static const int ROWS = 4, KS = 4;
    struct W {
        int lo[4], hi[4];
        float d, bias;
    };
    static __device__ __forceinline__ void split(W& w, int i, int v) {
        w.lo[i] = v & 0x0F0F0F0F;
        w.hi[i] = (v >> 4) & 0x0F0F0F0F;
    }
    static __device__ __forceinline__ float dot(const W& w, const int* y, const float2* ds) {
        int s = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) s = __dp4a(w.hi[i], y[4 + i], __dp4a(w.lo[i], y[i], s));
        return w.d * ds[0].x * (float)s + w.bias * ds[0].y;
    }
};

template <> struct Mmvq<Q4_0> : Nibbles {
    static __device__ __forceinline__ void load(const u8* b, int, W& w) {
        w.d = ldh(b);
        w.bias = -8.0f * w.d;
        int q[4];
        ld_words<4>(b + 2, q);
#pragma unroll
        for (int i = 0; i < 4; i++) split(w, i, q[i]);
    }
};

template <> struct Mmvq<Q4_1> : Nibbles {
    static __device__ __forceinline__ void load(const u8* b, int, W& w) {
        w.d = ldh(b);
        w.bias = ldh(b + 2);
#pragma unroll
        for (int i = 0; i < 4; i++) split(w, i, ld4(b + 4 + 4 * i));
    }
};

template <> struct Mmvq<Q5_0> : Nibbles {
    static __device__ __forceinline__ void load(const u8* b, int, W& w) {
        w.d = ldh(b);
        w.bias = -16.0f * w.d;
        int q[5];  // qh, then the 16 qs bytes
        ld_words<5>(b + 2, q);
        const u32 qh = (u32)q[0];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            split(w, i, q[1 + i]);
            w.lo[i] |= spread4(qh >> (4 * i));
            w.hi[i] |= spread4(qh >> (16 + 4 * i));
        }
    }
};

template <> struct Mmvq<Q5_1> : Nibbles {
    static __device__ __forceinline__ void load(const u8* b, int, W& w) {
        w.d = ldh(b);
        w.bias = ldh(b + 2);
        const u32 qh = (u32)ld4(b + 4);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            split(w, i, ld4(b + 8 + 4 * i));
            w.lo[i] |= spread4(qh >> (4 * i));
            w.hi[i] |= spread4(qh >> (16 + 4 * i));
        }
    }
};

template <> struct Mmvq<Q8_0> : Consecutive<32> {
    static const int TV = 32;
    static const bool EARLY = false;  // early weights: the direct geometry loads nothing early
    static const int SL = 4;
    static const int ROWS = 2, KS = 4;
    struct W {
        int q[8];
        float d;
    };
    static __device__ __forceinline__ void load(const u8* b, int, W& w) {
        w.d = ldh(b);
        ld_words<8>(b + 2, w.q);
    }
    static __device__ __forceinline__ float dot(const W& w, const int* y, const float2* ds) {
        int s = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) s = __dp4a(w.q[i], y[i], s);
        return w.d * ds[0].x * (float)s;
    }
};

// The table types (IQ4_NL, IQ4_XS, MXFP4): 32 values per task, each a 4-bit index into a
// 16-entry table of int8 (IQ4's non-linear values, or MXFP4's E2M1 values doubled), times one
// float scale: d * ds.x * (table values . y). The table sits in four registers and an index
// word is looked up with byte permutes.
struct TableQ : Consecutive<32> {
    static const int TV = 32;
    static const bool EARLY = false;  // early weights: the direct geometry loads nothing early
    static const int SL = 8;
    static const int ROWS = 4, KS = 4;
    struct W {
        int q[8];
        float d;
    };
    // Bytes k = 0..3 of the result: table entry nibble k of s (bits 4k..4k+4). A byte permute
    // picks from 8 bytes with the low 3 bits of a selector nibble; bit 3 then chooses between
    // the permutes of entries 0-7 and 8-15.
    static __device__ __forceinline__ int lut(u32 s, const u32 (&t)[4]) {
        const u32 lo = __byte_perm(t[0], t[1], s & 0x7777u);
        const u32 hi = __byte_perm(t[2], t[3], s & 0x7777u);
        return (int)__byte_perm(lo, hi, 0x3210u | ((s & 0x8888u) >> 1));
    }
    // The 32 values of 16 bytes of nibbles v (value j low nibble of byte j, value j + 16 its
    // high nibble), looked up in table t.
    static __device__ __forceinline__ void decode(const int (&v)[4], const u32 (&t)[4], W& w) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const u32 lo = (u32)v[i] & 0x0F0F0F0Fu, hi = ((u32)v[i] >> 4) & 0x0F0F0F0Fu;
            // Nibbles at bits 0, 8, 16, 24 to a 16-bit selector (bits 0, 4, 8, 12).
            const u32 l2 = lo | (lo >> 4), h2 = hi | (hi >> 4);
            w.q[i] = lut((l2 & 0xFFu) | ((l2 >> 8) & 0xFF00u), t);
            w.q[4 + i] = lut((h2 & 0xFFu) | ((h2 >> 8) & 0xFF00u), t);
        }
    }
    static __device__ __forceinline__ float dot(const W& w, const int* y, const float2* ds) {
        int s = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) s = __dp4a(w.q[i], y[i], s);
        return w.d * ds[0].x * (float)s;
    }
};

// IQ4_NL / IQ4_XS's table, and MXFP4's, as little-endian words of int8 entries.
#define IQ4_TABLE {0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u}
#define MXFP4_TABLE {0x03020100u, 0x0c080604u, 0xfdfeff00u, 0xf4f8fafcu}

template <> struct Mmvq<IQ4_NL> : TableQ {
    static __device__ __forceinline__ void load(const u8* b, int, W& w) {
        const u32 t[4] = IQ4_TABLE;
        w.d = ldh(b);
        int v[4];
        ld_words<4>(b + 2, v);
        decode(v, t, w);
    }
};

// IQ4_XS: task sub of a block is its 32-value sub-block sub, scaled by d * (ls - 32).
template <> struct Mmvq<IQ4_XS> : TableQ {
    static __device__ __forceinline__ void load(const u8* b, int sub, W& w) {
        const u32 t[4] = IQ4_TABLE;
        const u32 sh = (u32)*(const u16*)(b + 2);
        const int ls = (int)(((b[4 + sub / 2] >> (4 * (sub % 2))) & 15) | (((sh >> (2 * sub)) & 3u) << 4));
        w.d = ldh(b) * (float)(ls - 32);
        int v[4];
        ld_words<4>(b + 8 + 16 * sub, v);
        decode(v, t, w);
    }
};

// MXFP4: 17-byte blocks, so its nibbles start at any byte.
template <> struct Mmvq<MXFP4> : TableQ {
    static __device__ __forceinline__ void load(const u8* b, int, W& w) {
        const u32 t[4] = MXFP4_TABLE;
        w.d = e8m0_half(b[0]);
        // The 4 words at b + 1 from the aligned words that hold them (one more where b + 1 is
        // not 4-byte aligned; that word starts inside the block, so it is inside the buffer).
        const u8* p = b + 1;
        const u32 sh = (u32)((size_t)p & 3);
        const u32* a = (const u32*)(p - sh);
        u32 x[5];
#pragma unroll
        for (int i = 0; i < 4; i++) x[i] = a[i];
        x[4] = sh ? a[4] : 0u;
        int v[4];
#pragma unroll
        for (int i = 0; i < 4; i++) v[i] = (int)__funnelshift_r(x[i], x[i + 1], 8 * sh);
        decode(v, t, w);
    }
};

// The lattice types with a mat-vec (IQ2_XS, IQ3_S): 32 values per task (one sub-block), as
// grid bytes with their signs applied, times a float scale per 16 values: ds.x * (d[0] *
// (q[0..4) . y[0..4)) + d[1] * (q[4..8) . y[4..8))).
struct GridQ : Consecutive<32> {
    static const int TV = 32;
    static const bool EARLY = false;  // early weights: the direct geometry loads nothing early
    static const int SL = 8;
    static const int ROWS = 4, KS = 4;
    struct W {
        int q[8];
        float d[2];
    };
    // Four grid bytes g negated where bits 0..3 of s are set (as i8: (g ^ m) - m, m = 0xff).
    static __device__ __forceinline__ int signed4(u32 g, u32 s) {
        const u32 m = ((s & 1u) * 0xffu) | ((s & 2u) * 0x7f80u) | ((s & 4u) * 0x3fc000u) | ((s & 8u) * 0x1fe00000u);
        return (int)__vsub4(g ^ m, m);
    }
    static __device__ __forceinline__ float dot(const W& w, const int* y, const float2* ds) {
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s0 = __dp4a(w.q[i], y[i], s0);
            s1 = __dp4a(w.q[4 + i], y[4 + i], s1);
        }
        return ds[0].x * (w.d[0] * (float)s0 + w.d[1] * (float)s1);
    }
};

// IQ2_XS: group l of sub-block sub is IQ2XS_GRID entry q & 511 of u16 q = qs[4 sub + l], its
// signs from the top 7 bits (parity for the eighth); scales d (0.5 + s) / 4 per 16 values.
template <> struct Mmvq<IQ2_XS> : GridQ {
    static __device__ __forceinline__ void load(const u8* b, int sub, W& w) {
        const float d = ldh(b);
        const u32 sc = b[66 + sub];
        w.d[0] = d * (0.5f + (float)(sc & 15u)) * 0.25f;
        w.d[1] = d * (0.5f + (float)(sc >> 4)) * 0.25f;
        const u16* qs = (const u16*)(b + 2) + 4 * sub;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const u32 q = qs[l];
            const u64 g = IQ2XS_GRID[q & 511u];
            const u32 s = iq_signs(q >> 9);
            w.q[2 * l] = signed4((u32)g, s);
            w.q[2 * l + 1] = signed4((u32)(g >> 32), s >> 4);
        }
    }
};

// IQ3_S: values 8 l .. 8 l + 8 of sub-block sub are IQ3S_GRID entries of 9-bit indices
// (qs[8 sub + 2 l + h] and bit 2 l + h of qh[sub]) with sign byte signs[4 sub + l]; one scale
// d (1 + 2 s) per sub-block.
template <> struct Mmvq<IQ3_S> : GridQ {
    static __device__ __forceinline__ void load(const u8* b, int sub, W& w) {
        const u32 sc = (b[106 + sub / 2] >> (4 * (sub % 2))) & 15u;
        w.d[0] = w.d[1] = ldh(b) * (float)(1 + 2 * sc);
        const u8* qs = b + 2 + 8 * sub;
        const u32 qh = b[66 + sub];
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const u32 s = b[74 + 4 * sub + l];
            const u32 g1 = IQ3S_GRID[(u32)qs[2 * l] | ((qh << (8 - 2 * l)) & 256u)];
            const u32 g2 = IQ3S_GRID[(u32)qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256u)];
            w.q[2 * l] = signed4(g1, s);
            w.q[2 * l + 1] = signed4(g2, s >> 4);
        }
    }
};

// out[0..N) = the N words at p (N a multiple of 4, p 16-byte aligned), as 16-byte loads (a
// quarter of the instructions of 4-byte ones, and in shared memory no bank conflicts where lanes
// read 32 bytes 144 or 176 bytes apart, which 4-byte loads have 4 ways).
template <int N> __device__ __forceinline__ void ld16(const u8* p, int* out) {
#pragma unroll
    for (int i = 0; i < N / 4; i++) {
        const int4 v = *(const int4*)(p + 16 * i);
        out[4 * i] = v.x;
        out[4 * i + 1] = v.y;
        out[4 * i + 2] = v.z;
        out[4 * i + 3] = v.w;
    }
}

// The 6-bit scales (sc) and mins (m) of sub-blocks 2 k and 2 k + 1 of a Q4_K/Q5_K block, in bytes
// 0 and 1 of each (higher bits zero), from the block's 12-byte scales field as three words s:
// sub-block j < 4 has its scale in the low 6 bits of byte j of s[0] and its min in those of
// s[1]; sub-block j >= 4 its scale in the low nibble of byte j - 4 of s[2] with the top two bits
// of byte j - 4 of s[0] above it, its min in the high nibble with the top two bits of s[1]'s
// byte. Both bytes at once, word-wide, without branches.
__device__ __forceinline__ void k45_scales(int k, const int* s, u32& sc, u32& m) {
    const int sh = 16 * (k & 1);
    const u32 a = (u32)s[0] >> sh, b = (u32)s[1] >> sh, c = (u32)s[2] >> sh;
    const bool high = k >= 2;
    sc = high ? (c & 0x0F0Fu) | ((a >> 2) & 0x3030u) : a & 0x3F3Fu;
    m = high ? ((c >> 4) & 0x0F0Fu) | ((b >> 2) & 0x3030u) : b & 0x3F3Fu;
}

// Q4_K / Q5_K: task sub of a block is its sub-blocks 2 sub and 2 sub + 1 (the low and high
// nibbles of the same 32 qs bytes). d and dmin are read as one word, the scales field as three
// (k45_scales), the qs (and Q5_K's 32 qh bytes) as 16-byte loads: the rows are 16-byte aligned
// (mmvq_align in matmul.rs), so every block is (144 and 176 bytes are multiples of 16). Q5_K
// keeps only the task's two qh bits of each byte, packed four words to one register.
template <int Q> struct MmvqK45 : Consecutive<64> {
    static const int TV = 64;
    static const bool EARLY = true;   // early weights (BENCHMARKS.md, "early weights")
    static const int SL = 4;
    static const int ROWS = 4, KS = 2;
    struct W {
        int q[8];   // the 32 qs bytes
        int h[2];   // Q5_K: bits 2 i, 2 i + 1 of byte b of h[p]: the sub-blocks' qh bits of byte b
                    // of qh word 4 p + i
        float d, dmin;
        u32 sc, m;  // scales and mins of the two sub-blocks (k45_scales)
    };
    static __device__ __forceinline__ void load(const u8* b, int k, W& w) {
        const u32 dm = (u32)ld4(b);
        w.d = h2f((u16)dm);
        w.dmin = h2f((u16)(dm >> 16));
        int s[3];
#pragma unroll
        for (int i = 0; i < 3; i++) s[i] = ld4(b + 4 + 4 * i);
        k45_scales(k, s, w.sc, w.m);
        ld16<8>(b + (Q == Q4_K ? 16 : 48) + 32 * k, w.q);
        if (Q == Q5_K) {
            int h[8];
            ld16<8>(b + 16, h);
#pragma unroll
            for (int p = 0; p < 2; p++) {
                u32 v = 0;
#pragma unroll
                for (int i = 0; i < 4; i++) v |= (((u32)h[4 * p + i] >> (2 * k)) & 0x03030303u) << (2 * i);
                w.h[p] = (int)v;
            }
        }
    }
    static __device__ __forceinline__ float dot(const W& w, const int* y, const float2* ds) {
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int lo = w.q[i] & 0x0F0F0F0F, hi = (w.q[i] >> 4) & 0x0F0F0F0F;
            if (Q == Q5_K) {
                const u32 hb = (u32)w.h[i / 4] >> (2 * (i % 4));
                lo |= (int)((hb & 0x01010101u) << 4);
                hi |= (int)((hb & 0x02020202u) << 3);
            }
            s0 = __dp4a(lo, y[i], s0);
            s1 = __dp4a(hi, y[8 + i], s1);
        }
        const int sc0 = (int)(w.sc & 0xFF), sc1 = (int)(w.sc >> 8);
        const int m0 = (int)(w.m & 0xFF), m1 = (int)(w.m >> 8);
        return w.d * (ds[0].x * (float)(sc0 * s0) + ds[1].x * (float)(sc1 * s1))
             - w.dmin * ((float)m0 * ds[0].y + (float)m1 * ds[1].y);
    }
};
template <> struct Mmvq<Q4_K> : MmvqK45<Q4_K> {};
template <> struct Mmvq<Q5_K> : MmvqK45<Q5_K> {};

// Q6_K: task k of a block (k < 4) takes, in half n = k / 2 of the block (128 values, value l of
// group m at 128 n + 32 m + l), the 32 ql bytes 32 (k % 2) .. + 31 of the half's 64: their low
// nibbles are group m = k % 2, their high nibbles group m + 2 (the q8_1 blocks 2 k - k % 2 and
// 2 k - k % 2 + 2 of the block's 8, blk), whose high bits are bits 2 m and 2 m + 4 of the
// half's 32 qh bytes: each ql and qh byte is read by one task (qh by two). Values are kept as
// the unsigned 6-bit q (0..63, so int8 for dp4a) and the offset is taken out of the sums:
// sum (q - 32) y = sum q y - 32 sum y, the last a dp4a of y with bytes of -32, the same for every
// row (the compiler computes it once). Rows are 2-byte aligned (blocks of 210 bytes): words are
// aligned loads and funnel shifts, which also shift the qh bits into place.
template <> struct Mmvq<Q6_K> {
    static const int TV = 64;
    static const bool EARLY = false;  // early weights: the kernel spills more, slower
    static const int SL = 4;
    static const int ROWS = 4, KS = 2;
    static __device__ __forceinline__ int blk(int t, int i) { return 2 * t - (t & 1) + 2 * i; }
    struct W {
        int lo[8], hi[8];  // the 6-bit values of groups m and m + 2
        u32 sc;            // bytes 0, 1: the scales of group m's two 16-value halves; 2, 3: m + 2's
        float d;
    };
    // out[i] = the 4-byte value at byte 4 (o + i) + odd of a (odd: 0 or 2) shifted right by sh
    // (< 16) bits, the bits above from the next word (zeros past the N words). Reads at most 2
    // bytes past the N words.
    template <int N> static __device__ __forceinline__ void words(const u32* a, int o, int odd, int sh, u32* out) {
        u32 w[N + 1];
#pragma unroll
        for (int i = 0; i < N; i++) w[i] = a[o + i];
        w[N] = odd ? a[o + N] : 0u;
#pragma unroll
        for (int i = 0; i < N; i++) out[i] = __funnelshift_r(w[i], w[i + 1], 8 * odd + sh);
    }
    static __device__ __forceinline__ void load(const u8* b, int k, W& w) {
        const int n = k / 2, m = k % 2;
        const int odd = (int)((size_t)b & 2);  // the block's offset from a 4-byte boundary
        const u32* a = (const u32*)(b - odd);
        w.d = ldh(b + 208);
        u32 q[8], h[8], s[2];
        words<8>(a, 8 * k, odd, 0, q);            // ql bytes 32 k ..
        words<8>(a, 32 + 8 * n, odd, 2 * m, h);  // qh bytes 128 + 32 n ..: bits 2 m, 2 m + 1 (and
                                                  // 2 m + 4, 2 m + 5) to 0, 1 (4, 5)
        words<2>(a, 48 + 2 * n, odd, 0, s);      // scales 192 + 8 n ..
        w.sc = __byte_perm(s[0], s[1], m ? 0x7632 : 0x5410);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const u32 hb = h[i] & 0x33333333u;
            // Bits 0-3 of each byte from the first operand, 4-7 from the second (0x0F0F0F0F
            // selects): 4 + 2 high bits, the two above zero.
            w.lo[i] = (int)((q[i] & 0x0F0F0F0Fu) | ((hb << 4) & 0xF0F0F0F0u));
            w.hi[i] = (int)(((q[i] >> 4) & 0x0F0F0F0Fu) | (hb & 0xF0F0F0F0u));
        }
    }
    static __device__ __forceinline__ float dot(const W& w, const int* y, const float2* ds) {
        float r = 0.0f;
#pragma unroll
        for (int g = 0; g < 2; g++) {
            const int* v = g ? w.hi : w.lo;
            const int* yy = y + 8 * g;
            int sa = 0, sb = 0;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                sa = __dp4a(yy[i], (int)0xE0E0E0E0, sa);  // -32 sum y
                sb = __dp4a(yy[4 + i], (int)0xE0E0E0E0, sb);
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                sa = __dp4a(v[i], yy[i], sa);
                sb = __dp4a(v[4 + i], yy[4 + i], sb);
            }
            const int s0 = (int)(i8)(w.sc >> (16 * g)), s1 = (int)(i8)(w.sc >> (16 * g + 8));
            r += ds[g].x * (float)(s0 * sa + s1 * sb);
        }
        return w.d * r;
    }
};

// ---- the engine ----

// Adds the products of task t's weights, decoded for S rows into w, with columns c0 .. c0 + NC - 1
// to acc.
template <int Q, int NC, int S>
__device__ __forceinline__ void task_dots(const typename Mmvq<Q>::W (&w)[S], const Act& act, i64 c0, int t,
                                          float (&acc)[S][NC]) {
#pragma unroll
    for (int c = 0; c < NC; c++) {
        Y<Mmvq<Q>> y;
        act.template load<Mmvq<Q>>(c0 + c, t, y.y, y.ds);
#pragma unroll
        for (int s = 0; s < S; s++) acc[s][c] += Mmvq<Q>::dot(w[s], y.y, y.ds);
    }
}

// Tiles of type Q: TPB tasks per block, BYTES per tile of 32 tasks (a multiple of 16), SLOT bytes
// of shared memory per tile and row (a row's tile starts at its address modulo 16), SMEM bytes
// of tile slots per block (4 warps), CPL copies a lane per row and tile; ROWS rows per block of
// the plain kernels, in groups of RPG rows, KS warps per group (warp w: group w / KS, tiles
// w % KS, w % KS + KS, ...).
template <int Q> struct Tile {
    static const int TPB = QInfo<Q>::block / Mmvq<Q>::TV;
    static const int BYTES = 32 / TPB * QInfo<Q>::bytes;
    static const int SLOT = BYTES + 16;
    static const int SMEM = 4 * Mmvq<Q>::SL * SLOT;
    // The most 16-byte chunks a lane copies of a row's tile: a tile is BYTES / 16 chunks, one
    // more where the row starts off a 16-byte boundary.
    static const int CPL = (BYTES / 16 + 1 + 31) / 32;
    static const int ROWS = Mmvq<Q>::ROWS, KS = Mmvq<Q>::KS, RPG = ROWS * KS / 4;
    // Whether the staged engine can take the type: its tiles are whole 16-byte chunks (not so
    // for IQ2_XS and IQ3_S, whose 32-value tasks always take the direct geometry).
    static const bool STAGED = BYTES % 16 == 0;
    static_assert(STAGED || Mmvq<Q>::TV == 32, "a staged type's tile is whole 16-byte chunks");
    static_assert(RPG >= 1 && RPG <= Mmvq<Q>::SL, "a group's rows fit the warp's slots");
};

// 16 bytes from global src to shared dst (both 16-byte aligned), asynchronously, through L2 only.
__device__ __forceinline__ void cp_async16(u8* dst, const u8* src) {
    const u32 s = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most N of this thread's committed copy groups are still in flight.
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// One warp's share of S weight rows ("streams") of type Q times NC columns, in G passes: pass g
// covers the tiles j0, j0 + KS, ... (j < ceil(tasks / 32)) of rows ptr(g, 0..S) (global row
// addresses). Tiles are copied into sm (this warp's NBUF * S slots), NBUF - 1 tiles ahead of the
// one computed. With one column a lane loads its task's activations once, before it waits for
// the tile, and then takes the rows one at a time (weights, dot: fewer registers live). At the
// end of each pass every lane calls fin(g, acc) with its partial sums acc[s][c] (zeros when the
// warp has no tiles); summing them over the warp is fin's job. wait() (the kernel's pdl_wait and
// whatever must follow it) is called once: after the first tiles' copies are issued when early,
// else before them.
// A tile's copy may read up to 15 bytes past a row's end, within the row's last aligned 16 bytes.
template <int Q, int NC, int S, int NBUF, class Ptr, class Fin, class Wait>
__device__ __forceinline__ void stream_rows(int G, int tasks, int j0, int KS, const Act& act, i64 c0, u8* sm, Ptr ptr, Fin fin,
                                            bool early, Wait wait) {
    typedef Tile<Q> T;
    const int QB = QInfo<Q>::bytes;
    const int lane = threadIdx.x % 32;
    const int ntiles = (tasks + 31) / 32;
    const int ntw = j0 < ntiles ? (ntiles - 1 - j0) / KS + 1 : 0;
    float acc[S][NC];
#pragma unroll
    for (int s = 0; s < S; s++)
#pragma unroll
        for (int c = 0; c < NC; c++) acc[s][c] = 0.0f;
    if (ntw == 0) {
        wait();
        for (int g = 0; g < G; g++) fin(g, acc);
        return;
    }
    const int total = G * ntw;
    // The next tile to copy: pass ig, the warp's tile ij of that pass, into slot ib.
    int ig = 0, ij = 0, ib = 0;
    auto issue = [&]() {
        if (ig < G) {
            const int j = j0 + ij * KS;
            const int bytes = min(32, tasks - 32 * j) / T::TPB * QB;
            u8* dst = sm + ib * (S * T::SLOT);
#pragma unroll
            for (int s = 0; s < S; s++) {
                const u64 a = (u64)ptr(ig, s) + (u64)j * T::BYTES;
                const u8* src = (const u8*)(a & ~(u64)15);
                const int n = ((int)(a & 15) + bytes + 15) >> 4;
                // Chunks lane, lane + 32, ... below n. At most T::CPL a lane: up to 3 as a
                // fixed count of predicated copies (no loop to run); Q6_K's 4 as a loop (the
                // fixed count makes its one-column kernels spill registers).
                const u8* from = src + 16 * lane;
                u8* to = dst + s * T::SLOT + 16 * lane;
                if (T::CPL <= 3) {
#pragma unroll
                    for (int i = 0; i < T::CPL; i++)
                        if (lane + 32 * i < n) cp_async16(to + 512 * i, from + 512 * i);
                } else {
                    for (int c = lane; c < n; c += 32) cp_async16(to + 16 * (c - lane), from + 16 * (c - lane));
                }
            }
            if (++ij == ntw) {
                ij = 0;
                ig++;
            }
            ib = ib == NBUF - 1 ? 0 : ib + 1;
        }
        cp_commit();
    };
    if (!early) wait();
#pragma unroll
    for (int b = 0; b < NBUF - 1; b++) issue();
    if (early) wait();
    // The tile computed: pass g, the warp's tile jj of that pass, in slot cb.
    int g = 0, jj = 0, cb = 0;
    for (int i = 0; i < total; i++) {
        issue();
        const int t = 32 * (j0 + jj * KS) + lane;
        // One column: the task's activations are loaded before the wait for its tile, so that
        // their latency overlaps the copy's instead of following it.
        Y<Mmvq<Q>> y;
        if (NC == 1 && t < tasks) act.template load<Mmvq<Q>>(c0, t, y.y, y.ds);
        cp_wait<NBUF - 1>();
        __syncwarp();
        if (t < tasks) {
            const u8* tile = sm + cb * (S * T::SLOT) + lane / T::TPB * QB;
            // Row s's weights of this task in the tile.
            auto wt = [&](int s, typename Mmvq<Q>::W& w) {
                Mmvq<Q>::load(tile + s * T::SLOT + (int)((u64)ptr(g, s) & 15), lane % T::TPB, w);
            };
            if (NC == 1) {
#pragma unroll
                for (int s = 0; s < S; s++) {
                    typename Mmvq<Q>::W w;
                    wt(s, w);
                    acc[s][0] += Mmvq<Q>::dot(w, y.y, y.ds);
                }
            } else {
                typename Mmvq<Q>::W w[S];
#pragma unroll
                for (int s = 0; s < S; s++) wt(s, w[s]);
                task_dots<Q, NC, S>(w, act, c0, t, acc);
            }
        }
        __syncwarp();
        cb = cb == NBUF - 1 ? 0 : cb + 1;
        if (++jj == ntw) {
            jj = 0;
            fin(g, acc);
            g++;
#pragma unroll
            for (int s = 0; s < S; s++)
#pragma unroll
                for (int c = 0; c < NC; c++) acc[s][c] = 0.0f;
        }
    }
}

// The `wait` of the engines where nothing else follows the kernel's pdl_wait().
struct PdlWait {
    __device__ __forceinline__ void operator()() const { pdl_wait(); }
};

// The geometry of a block of the mat-vec kernels for rows of `tasks` tasks: the staged engine's
// (ROWS rows a block, KS warps sharing each group of RPG rows) for k-quant rows of at least KS
// tiles; else narrow (one row per warp, direct loads). `rows` per block.
template <int Q> struct Geom {
    bool narrow, early;
    int rows;
    __device__ Geom(int tasks, int flags) {
        early = Mmvq<Q>::EARLY && (flags & 4) != 0;
        // The host leaves i[3] & 3 at 0 (each type's default geometry), but the choice stays a
        // run-time test of it: with the geometry known at compile time, ptxas allocates the
        // fused mat-vecs differently and they run slower (BENCHMARKS.md has the measurement).
        const int mode = flags & 3;
        const bool staged = Tile<Q>::STAGED && (mode == 2 || (mode == 0 && Mmvq<Q>::TV > 32));
        narrow = !staged || (tasks + 31) / 32 < Tile<Q>::KS;
        rows = narrow ? 4 : Tile<Q>::ROWS;
    }
};

// The narrow geometry's warp: S rows (ptr(s), global addresses) of type Q times NC columns, each
// lane taking tasks lane, lane + 32, ... with its weights loaded straight from global memory.
// Returns the warp's sums in every lane.
template <int Q, int NC, int S, class Ptr>
__device__ __forceinline__ void direct_rows(int tasks, const Act& act, i64 c0, Ptr ptr, float (&acc)[S][NC]) {
    const int TPB = Tile<Q>::TPB, QB = QInfo<Q>::bytes;
#pragma unroll
    for (int s = 0; s < S; s++)
#pragma unroll
        for (int c = 0; c < NC; c++) acc[s][c] = 0.0f;
    for (int t = threadIdx.x % 32; t < tasks; t += 32) {
        typename Mmvq<Q>::W w[S];
#pragma unroll
        for (int s = 0; s < S; s++) Mmvq<Q>::load(ptr(s) + (i64)(t / TPB) * QB, t % TPB, w[s]);
        task_dots<Q, NC, S>(w, act, c0, t, acc);
    }
#pragma unroll
    for (int s = 0; s < S; s++)
#pragma unroll
        for (int c = 0; c < NC; c++) acc[s][c] = warp_sum(acc[s][c]);
}

// Row r of the stacked matrices of mmvq_multi (rows n[0], n[1], n[2]): its matrix j and row there.
__device__ __forceinline__ i64 stacked_row(i64 r, const int* n, int& j) {
    j = 0;
    while (j < 2 && r >= n[j]) {
        r -= n[j];
        j++;
    }
    return r;
}

// Stores result v of row `row`, column c, batch (i2, i3) of mmvq's dst, plus the residual
// where i[2] is set; with i[4] = rank + 1 (one column, dst a flat f32 vector read next by the
// small peer all-reduce, which then does not send), also sends it to the group's other ranks
// (presend_value: aux[2] this rank's signal block, aux[3] the region bytes, i[5] the ranks).
__device__ __forceinline__ void store_row(const KParams& p, i64 row, int c, i64 i2, i64 i3, float v) {
    const float o = p.i[2] ? v + F32::load(at(p.t[2], row, c, i2, i3)) : v;
    F32::store(at(p.t[0], row, c, i2, i3), o);
    if (p.i[4] != 0) {
        presend_value((const ArSignal*)p.aux[2], p.aux[3], p.i[4] - 1, p.i[5], row, o);
    }
}

template <int Q, int NC> __device__ void mmvq(const KParams& p) {
    typedef Tile<Q> T;
    const int R = T::RPG;
    __shared__ __align__(16) u8 sm[T::SMEM];
    __shared__ float red[4][R][NC];
    const TArg& d = p.t[0];
    const TArg& w = p.t[1];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int tasks = (int)(w.ne[0] / Mmvq<Q>::TV);
    const Geom<Q> gm(tasks, p.i[3]);
    const i64 i2 = blockIdx.y % d.ne[2], i3 = blockIdx.y / d.ne[2];
    const u8* base = (const u8*)at(w, 0, 0, i2 / p.i[0], i3 / p.i[1]);
    const Act act = {(const u8*)p.aux[0], (const float2*)p.aux[1], w.ne[0] / 32};
    const i64 last = w.ne[1] - 1;
    if (gm.narrow) {
        const i64 row = (i64)blockIdx.x * 4 + warp;
        float a[1][NC];
        pdl_wait();
        direct_rows<Q, NC, 1>(tasks, act, (i64)blockIdx.y * NC, [&](int) { return base + min(row, last) * w.nb[1]; }, a);
        if (lane < NC && row <= last) {
            float v = 0.0f;
#pragma unroll
            for (int c = 0; c < NC; c++) v = c == lane ? a[0][c] : v;
            store_row(p, row, lane, i2, i3, v);
        }
        return;
    }
    const int KS = T::KS;
    const i64 row0 = (i64)blockIdx.x * T::ROWS + warp / KS * R;
    auto ptr = [&](int, int s) { return base + min(row0 + s, last) * w.nb[1]; };
    auto fin = [&](int, float(&a)[R][NC]) {
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int c = 0; c < NC; c++) {
                const float v = warp_sum(a[r][c]);
                if (lane == 0) red[warp][r][c] = v;
            }
    };
    stream_rows<Q, NC, R, Mmvq<Q>::SL / R>(1, tasks, warp % KS, KS, act, (i64)blockIdx.y * NC,
                                           sm + warp * Mmvq<Q>::SL * T::SLOT, ptr, fin, gm.early, PdlWait());
    __syncthreads();
    if (threadIdx.x < T::ROWS * NC) {
        const int r = threadIdx.x / NC % R, c = threadIdx.x % NC, w0 = threadIdx.x / NC / R * KS;
        const i64 row = (i64)blockIdx.x * T::ROWS + threadIdx.x / NC;
        if (row <= last) {
            float v = red[w0][r][c];
#pragma unroll
            for (int k = 1; k < KS; k++) v += red[w0 + k][r][c];
            store_row(p, row, c, i2, i3, v);
        }
    }
}

struct NoWait {
    __device__ __forceinline__ void operator()() const {}
};

// mmvq_id_<type>: mul_mat_id (the experts a router picked, moe.cu's layout) as one mat-vec per
// (slot, token): t[0] dst f32 [m, n_used, n_tokens], t[1] the experts [k, m, n_expert] of type
// Q (rows contiguous), t[2] the i32 ids [n_used, n_tokens], aux[0], aux[1] the rows [k, n_b,
// n_tokens] quantized as quantize_q8_1 writes them; i[0] the id of the first expert t[1] holds,
// i[1] n_b (slot e of token t reads row e % n_b of token t). Grid (ceil(m / R), up to 65535)
// as mmvq_<type>_1's, blockIdx.y + i[2] = e + n_used t (i[2]: the first (slot, token) of this
// launch, where n_used n_tokens takes several). The weights' address depends on the
// ids the kernel ahead writes, so nothing is read before pdl_wait; an expert t[1] does not hold
// gives zeros.
template <int Q> __device__ void mmvq_id(const KParams& p) {
    typedef Tile<Q> T;
    const int R = T::RPG;
    __shared__ __align__(16) u8 sm[T::SMEM];
    __shared__ float red[4][R][1];
    const TArg& d = p.t[0];
    const TArg& w = p.t[1];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int tasks = (int)(w.ne[0] / Mmvq<Q>::TV);
    const Geom<Q> gm(tasks, 0);
    const i64 y = blockIdx.y + (i64)p.i[2];
    const i64 e = y % d.ne[1], t = y / d.ne[1];
    const i64 last = w.ne[1] - 1;
    pdl_wait();
    const int x = *(const int*)at(p.t[2], e, t, 0, 0) - p.i[0];
    if (x < 0 || x >= w.ne[2]) {
        for (i64 r = threadIdx.x; r < gm.rows; r += blockDim.x) {
            const i64 row = (i64)blockIdx.x * gm.rows + r;
            if (row <= last) F32::store(at(d, row, e, t, 0), 0.0f);
        }
        return;
    }
    const u8* base = (const u8*)at(w, 0, 0, x, 0);
    const Act act = {(const u8*)p.aux[0], (const float2*)p.aux[1], w.ne[0] / 32};
    const i64 col = t * p.i[1] + e % p.i[1];
    if (gm.narrow) {
        const i64 row = (i64)blockIdx.x * 4 + warp;
        float a[1][1];
        direct_rows<Q, 1, 1>(tasks, act, col, [&](int) { return base + min(row, last) * w.nb[1]; }, a);
        if (lane == 0 && row <= last) F32::store(at(d, row, e, t, 0), a[0][0]);
        return;
    }
    const int KS = T::KS;
    const i64 row0 = (i64)blockIdx.x * T::ROWS + warp / KS * R;
    auto ptr = [&](int, int s) { return base + min(row0 + s, last) * w.nb[1]; };
    auto fin = [&](int, float(&a)[R][1]) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float v = warp_sum(a[r][0]);
            if (lane == 0) red[warp][r][0] = v;
        }
    };
    stream_rows<Q, 1, R, Mmvq<Q>::SL / R>(1, tasks, warp % KS, KS, act, col, sm + warp * Mmvq<Q>::SL * T::SLOT, ptr, fin,
                                          false, NoWait());
    __syncthreads();
    if (threadIdx.x < T::ROWS) {
        const int r = threadIdx.x % R, w0 = threadIdx.x / R * KS;
        const i64 row = (i64)blockIdx.x * T::ROWS + threadIdx.x;
        if (row <= last) {
            float v = red[w0][r][0];
#pragma unroll
            for (int k = 1; k < KS; k++) v += red[w0 + k][r][0];
            F32::store(at(d, row, e, t, 0), v);
        }
    }
}

// The gate's activation of mmvq_glu: i[6] 0 SiLU (SwiGLU), 1 GELU tanh (GEGLU).
__device__ __forceinline__ float glu_act(const KParams& p, float g) { return p.i[6] ? act_gelu(g) : act_silu(g); }

template <int Q> __device__ void mmvq_glu(const KParams& p) {
    typedef Tile<Q> T;
    const int R = T::RPG;
    const int PG = R / 2 > 0 ? R / 2 : 1;  // rows per pass (gate and up: 2 PG streams)
    const int S = 2 * PG, NBUF = Mmvq<Q>::SL / S;
    __shared__ __align__(16) u8 sm[T::SMEM];
    __shared__ float red[4][R][2];
    const TArg& d = p.t[0];
    const TArg& wg = p.t[1];
    const TArg& wu = p.t[2];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const i64 m = wg.ne[1];
    const int tasks = (int)(wg.ne[0] / Mmvq<Q>::TV);
    const Geom<Q> gm(tasks, p.i[3]);
    const Act act = {(const u8*)p.aux[0], (const float2*)p.aux[1], wg.ne[0] / 32};
    const i64 row0 = (i64)blockIdx.x * gm.rows;
    if (gm.narrow) {
        const i64 r = min(row0 + warp, m - 1);
        float a[2][1];
        pdl_wait();
        direct_rows<Q, 1, 2>(tasks, act, 0, [&](int s) {
            return s == 0 ? (const u8*)wg.ptr + r * wg.nb[1] : (const u8*)wu.ptr + r * wu.nb[1];
        }, a);
        if (lane == 0 && row0 + warp < m) F32::store(at(d, row0 + warp, 0, 0, 0), glu_act(p, a[0][0]) * a[1][0]);
    } else {
        const int KS = T::KS;
        const i64 r0 = row0 + warp / KS * R;
        // Streams 0..PG are gate rows r0 + g PG + s, PG..2 PG the same rows of up.
        auto rows = [&](int g, int s) {
            const i64 r = min(r0 + g * PG + s % PG, m - 1);
            return s < PG ? (const u8*)wg.ptr + r * wg.nb[1] : (const u8*)wu.ptr + r * wu.nb[1];
        };
        auto fin = [&](int g, float(&a)[S][1]) {
#pragma unroll
            for (int s = 0; s < S; s++) {
                const float v = warp_sum(a[s][0]);
                if (lane == 0) red[warp][g * PG + s % PG][s / PG] = v;
            }
        };
        stream_rows<Q, 1, S, NBUF>(R / PG, tasks, warp % KS, KS, act, 0, sm + warp * Mmvq<Q>::SL * T::SLOT, rows, fin,
                                   gm.early, PdlWait());
        __syncthreads();
        if (threadIdx.x < T::ROWS && row0 + threadIdx.x < m) {
            const int r = threadIdx.x % R, w0 = threadIdx.x / R * KS;
            float vg = red[w0][r][0], vu = red[w0][r][1];
#pragma unroll
            for (int k = 1; k < KS; k++) {
                vg += red[w0 + k][r][0];
                vu += red[w0 + k][r][1];
            }
            F32::store(at(d, row0 + threadIdx.x, 0, 0, 0), glu_act(p, vg) * vu);
        }
    }
    if (p.aux[2] == 0 || p.aux[3] == 0 || p.t[3].ptr == 0) return;

    // The quantized result: the block that finishes a 32-row block's last rows (counted per
    // 32-row block, the counter set back to zero for the next launch) quantizes them, reading
    // the other blocks' results from L2 after the count.
    __shared__ int LAST;
    const int per = 32 / gm.rows;  // blocks per 32-row block
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        LAST = 1;
        if (per > 1) {
            unsigned* cnt = (unsigned*)p.t[3].ptr + row0 / 32;
            LAST = atomicAdd(cnt, 1u) == (unsigned)(per - 1);
            if (LAST) atomicExch(cnt, 0u);
        }
    }
    __syncthreads();
    if (!LAST || warp != 0) return;
    __threadfence();
    const i64 q0 = row0 / 32 * 32;
    const float v = __ldcg((const float*)at(d, q0 + lane, 0, 0, 0));
    q8_1_block(v, (i8*)p.aux[2] + q0, (float2*)p.aux[3] + q0 / 32);
}

// mmvq_id_glu_<type>: mmvq_id of two expert tensors in one launch, the experts' gate (t[1]) and
// up (t[3], same type, shape and strides) projections by the same quantized rows and ids
// (t[2]): dst (t[0], f32 [m, n_used, n_tokens]) = act(gate) * up with act as mmvq_glu's (i[6]);
// i[0], i[1], i[2], aux[0], aux[1] and the grid as mmvq_id's. An expert t[1] does not hold gives 0.
template <int Q> __device__ void mmvq_id_glu(const KParams& p) {
    typedef Tile<Q> T;
    const int R = T::RPG;
    const int PG = R / 2 > 0 ? R / 2 : 1;  // rows per pass (gate and up: 2 PG streams)
    const int S = 2 * PG, NBUF = Mmvq<Q>::SL / S;
    __shared__ __align__(16) u8 sm[T::SMEM];
    __shared__ float red[4][R][2];
    const TArg& d = p.t[0];
    const TArg& wg = p.t[1];
    const TArg& wu = p.t[3];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const i64 m = wg.ne[1];
    const int tasks = (int)(wg.ne[0] / Mmvq<Q>::TV);
    const Geom<Q> gm(tasks, 0);
    const i64 y = blockIdx.y + (i64)p.i[2];
    const i64 e = y % d.ne[1], t = y / d.ne[1];
    const i64 row0 = (i64)blockIdx.x * gm.rows;
    pdl_wait();
    const int x = *(const int*)at(p.t[2], e, t, 0, 0) - p.i[0];
    if (x < 0 || x >= wg.ne[2]) {
        for (i64 r = threadIdx.x; r < gm.rows; r += blockDim.x)
            if (row0 + r < m) F32::store(at(d, row0 + r, e, t, 0), 0.0f);
        return;
    }
    const u8* bg = (const u8*)at(wg, 0, 0, x, 0);
    const u8* bu = (const u8*)at(wu, 0, 0, x, 0);
    const Act act = {(const u8*)p.aux[0], (const float2*)p.aux[1], wg.ne[0] / 32};
    const i64 col = t * p.i[1] + e % p.i[1];
    if (gm.narrow) {
        const i64 r = min(row0 + warp, m - 1);
        float a[2][1];
        direct_rows<Q, 1, 2>(tasks, act, col, [&](int s) { return (s == 0 ? bg : bu) + r * wg.nb[1]; }, a);
        if (lane == 0 && row0 + warp < m) F32::store(at(d, row0 + warp, e, t, 0), glu_act(p, a[0][0]) * a[1][0]);
        return;
    }
    const int KS = T::KS;
    const i64 r0 = row0 + warp / KS * R;
    // Streams 0..PG are gate rows r0 + g PG + s, PG..2 PG the same rows of up.
    auto rows = [&](int g, int s) {
        const i64 r = min(r0 + g * PG + s % PG, m - 1);
        return (s < PG ? bg : bu) + r * wg.nb[1];
    };
    auto fin = [&](int g, float(&a)[S][1]) {
#pragma unroll
        for (int s = 0; s < S; s++) {
            const float v = warp_sum(a[s][0]);
            if (lane == 0) red[warp][g * PG + s % PG][s / PG] = v;
        }
    };
    stream_rows<Q, 1, S, NBUF>(R / PG, tasks, warp % KS, KS, act, col, sm + warp * Mmvq<Q>::SL * T::SLOT, rows, fin,
                               false, NoWait());
    __syncthreads();
    if (threadIdx.x < T::ROWS && row0 + threadIdx.x < m) {
        const int r = threadIdx.x % R, w0 = threadIdx.x / R * KS;
        float vg = red[w0][r][0], vu = red[w0][r][1];
#pragma unroll
        for (int k = 1; k < KS; k++) {
            vg += red[w0 + k][r][0];
            vu += red[w0 + k][r][1];
        }
        F32::store(at(d, row0 + threadIdx.x, e, t, 0), glu_act(p, vg) * vu);
    }
}

// Stores the results x0, x1 of stacked rows row, row + 1 (row even) of mmvq_multi_rope: V rows
// to the V cache, Q and K rows rotated as the pair they are, to the rotated Q or the K cache;
// pos: the position, crow: the cache row.
__device__ void multi_rope_store(const KParams& p, i64 row, float x0, float x1, float pos, i64 crow) {
    int j;
    const i64 r = stacked_row(row, p.i, j);
    const TArg& kc = p.t[4];
    const bool in_cache = crow >= 0 && crow < kc.ne[1];
    float y0 = x0, y1 = x1;
    const int hd = p.i[6];
    const i64 h = r / hd, a = r % hd;
    if (j < 2 && a < p.i[4]) rope_rotate(p, pos, (int)(a / 2), x0, x1, y0, y1);
    if (j == 0) {
        F32::store(at(p.t[0], a, h, 0, 0), y0);
        F32::store(at(p.t[0], a + 1, h, 0, 0), y1);
    } else if (in_cache) {
        const TArg& c = j == 1 ? kc : p.t[5];
        F16::store(at(c, r, crow, 0, 0), y0);
        F16::store(at(c, r + 1, crow, 0, 0), y1);
    }
}

template <int Q, bool ROPE> __device__ void mmvq_multi(const KParams& p) {
    typedef Tile<Q> T;
    const int R = T::RPG;
    __shared__ __align__(16) u8 sm[T::SMEM];
    __shared__ float red[4][R];
    __shared__ float vals[4];  // ROPE: the block's results, rotated in pairs at the end
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // ROPE: the position and cache row, loaded right after the wait so that their latency
    // hides behind the products (threads 0 and 1 store the pairs).
    float pos = 0.0f;
    i64 crow = -1;
    auto wait = [&]() {
        pdl_wait();
        if (ROPE && threadIdx.x < 2) {
            pos = (float)*(const int*)p.t[6].ptr;
            crow = p.i[5] ? *(const i64*)p.t[7].ptr : (i64) * (const int*)p.t[7].ptr;
        }
    };
    const int tasks = (int)(p.t[1].ne[0] / Mmvq<Q>::TV);
    const Geom<Q> gm(tasks, p.i[3]);
    const i64 total = (i64)p.i[0] + p.i[1] + p.i[2];
    const Act act = {(const u8*)p.aux[0], (const float2*)p.aux[1], p.t[1].ne[0] / 32};
    // Row `row` of the stacked matrices (clamped to the last): its address; its matrix in j.
    auto row_at = [&](i64 row, int& j) {
        const i64 r = stacked_row(min(row, total - 1), p.i, j);
        return (const u8*)at(p.t[1 + j], 0, r, 0, 0);
    };
    // Stores result v of stacked row `row`.
    auto store = [&](i64 row, float v) {
        int j;
        const i64 r = stacked_row(row, p.i, j);
        float* d = (float*)(j == 0 ? p.t[0].ptr : j == 1 ? p.t[4].ptr : p.aux[2]);
        d[r] = v;
    };
    if (gm.narrow) {
        const i64 row = (i64)blockIdx.x * 4 + warp;
        int j;
        const u8* wrow = row_at(row, j);
        float a[1][1];
        wait();
        direct_rows<Q, 1, 1>(tasks, act, 0, [&](int) { return wrow; }, a);
        if (lane == 0 && row < total) {
            if (ROPE) vals[warp] = a[0][0];
            else store(row, a[0][0]);
        }
        if (ROPE) {
            __syncthreads();
            const i64 r0 = (i64)blockIdx.x * 4 + 2 * threadIdx.x;
            if (threadIdx.x < 2 && r0 < total) multi_rope_store(p, r0, vals[2 * threadIdx.x], vals[2 * threadIdx.x + 1], pos, crow);
        }
        return;
    }
    const int KS = T::KS;
    const i64 row0 = (i64)blockIdx.x * T::ROWS + warp / KS * R;
    const u8* rowp[R];
#pragma unroll
    for (int s = 0; s < R; s++) {
        int j;
        rowp[s] = row_at(row0 + s, j);
    }
    auto ptr = [&](int, int s) { return rowp[s]; };
    auto fin = [&](int, float(&a)[R][1]) {
#pragma unroll
        for (int s = 0; s < R; s++) {
            const float v = warp_sum(a[s][0]);
            if (lane == 0) red[warp][s] = v;
        }
    };
    stream_rows<Q, 1, R, Mmvq<Q>::SL / R>(1, tasks, warp % KS, KS, act, 0, sm + warp * Mmvq<Q>::SL * T::SLOT, ptr, fin,
                                          gm.early, wait);
    __syncthreads();
    const i64 row = (i64)blockIdx.x * T::ROWS + threadIdx.x;
    if (threadIdx.x < T::ROWS && row < total) {
        const int s = threadIdx.x % R, w0 = threadIdx.x / R * KS;
        float v = red[w0][s];
#pragma unroll
        for (int k = 1; k < KS; k++) v += red[w0 + k][s];
        if (ROPE) vals[threadIdx.x] = v;
        else store(row, v);
    }
    if (ROPE) {
        __syncthreads();
        const i64 r0 = (i64)blockIdx.x * T::ROWS + 2 * threadIdx.x;
        if (2 * threadIdx.x < T::ROWS && r0 < total) multi_rope_store(p, r0, vals[2 * threadIdx.x], vals[2 * threadIdx.x + 1], pos, crow);
    }
}

// 128 threads; the one-column plain and multi kernels at most 64 registers, so that 8 blocks
// fit an SM.
#define MMVQ_KERNEL extern "C" __global__ void __launch_bounds__(128)
#define MMVQ_KERNEL_1 extern "C" __global__ void __launch_bounds__(128, 8)

#define MMVQ(nq, Q)                                                               \
    MMVQ_KERNEL_1 mmvq_##nq##_1(const KParams p) { pdl_wait_later(); mmvq<Q, 1>(p); }   \
    MMVQ_KERNEL mmvq_##nq##_2(const KParams p) { pdl_wait_later(); mmvq<Q, 2>(p); }     \
    MMVQ_KERNEL mmvq_##nq##_3(const KParams p) { pdl_wait_later(); mmvq<Q, 3>(p); }     \
    MMVQ_KERNEL mmvq_##nq##_4(const KParams p) { pdl_wait_later(); mmvq<Q, 4>(p); }     \
    MMVQ_KERNEL mmvq_##nq##_5(const KParams p) { pdl_wait_later(); mmvq<Q, 5>(p); }     \
    MMVQ_KERNEL mmvq_##nq##_6(const KParams p) { pdl_wait_later(); mmvq<Q, 6>(p); }     \
    MMVQ_KERNEL mmvq_##nq##_7(const KParams p) { pdl_wait_later(); mmvq<Q, 7>(p); }     \
    MMVQ_KERNEL mmvq_##nq##_8(const KParams p) { pdl_wait_later(); mmvq<Q, 8>(p); }     \
    MMVQ_KERNEL mmvq_glu_##nq(const KParams p) { pdl_wait_later(); mmvq_glu<Q>(p); }    \
    MMVQ_KERNEL_1 mmvq_multi_##nq(const KParams p) { pdl_wait_later(); mmvq_multi<Q, false>(p); } \
    MMVQ_KERNEL_1 mmvq_multi_rope_##nq(const KParams p) { pdl_wait_later(); mmvq_multi<Q, true>(p); }

MMVQ(q4_0, Q4_0)
MMVQ(q4_1, Q4_1)
MMVQ(q5_0, Q5_0)
MMVQ(q5_1, Q5_1)
MMVQ(q8_0, Q8_0)
MMVQ(q4_K, Q4_K)
MMVQ(q5_K, Q5_K)
MMVQ(q6_K, Q6_K)
MMVQ(iq4_nl, IQ4_NL)
MMVQ(iq4_xs, IQ4_XS)
MMVQ(mxfp4, MXFP4)
MMVQ(iq2_xs, IQ2_XS)
MMVQ(iq3_s, IQ3_S)

#define MMVQ_ID(nq, Q)                                                              \
    MMVQ_KERNEL_1 mmvq_id_##nq(const KParams p) { pdl_wait_later(); mmvq_id<Q>(p); } \
    MMVQ_KERNEL mmvq_id_glu_##nq(const KParams p) { pdl_wait_later(); mmvq_id_glu<Q>(p); }

MMVQ_ID(q4_0, Q4_0)
MMVQ_ID(q4_1, Q4_1)
MMVQ_ID(q5_0, Q5_0)
MMVQ_ID(q5_1, Q5_1)
MMVQ_ID(q8_0, Q8_0)
MMVQ_ID(q4_K, Q4_K)
MMVQ_ID(q5_K, Q5_K)
MMVQ_ID(q6_K, Q6_K)
MMVQ_ID(iq4_nl, IQ4_NL)
MMVQ_ID(iq4_xs, IQ4_XS)
MMVQ_ID(mxfp4, MXFP4)
MMVQ_ID(iq2_xs, IQ2_XS)
MMVQ_ID(iq3_s, IQ3_S)

// ---- mmq: quantized weights times 2 to 64 columns on int8 tensor cores ----
//
// mmq_<type>_<NT>: t[0] dst f32 [m, n] (columns nb[1] apart), t[1] the weights [k, m] (rows
// contiguous, nb[1] apart; 2-D), aux[0], aux[1] the n columns quantized as quantize_q8_1
// writes them, i[0] = n. Grid (ceil(m / 128), column tiles, S), 128 threads. Block (x, y, z)
// computes rows 128 x .. + 128 (32 a warp) by columns 8 NT y .. + 8 NT over the z-th of S equal
// runs of k's stages (256 values: 8 blocks of 32, one super-block of the k-quants). With S = 1
// it stores dst. Otherwise, with i[1] = 1, the S blocks of a tile are one thread-block cluster
// (up to 8, sm_90) that adds up its sums through distributed shared memory; else its sums go
// to the partials at aux[2] (f32 [m, n] per z, contiguous), which mmq_sum adds into dst. Both
// add in order of z (no atomics: the same inputs give the same bits). Dynamic shared memory:
// MmqSmem<Q, NT>::BYTES.
//
// A stage is copied to shared memory with asynchronous copies, every copy of a warp covering
// consecutive bytes: each warp its rows' bytes (as the aligned words that hold them), the block
// the column tile's 8-bit blocks; the copies of the next stage are issued before the current
// one is computed (MMQ_NBUF buffers), so that the memory stays busy while the tensor cores
// work. Each weight byte is read from memory once per column tile.
// Then per 32-value block of k a warp takes one mma.sync.m16n8k32 (s8 x s8 -> s32) per pair of
// its 2 row tiles (16 rows) and NT column tiles (8 columns), and scales the integer sums into
// float accumulators: d_w d_x sum, plus m_w (d_x sum x) for the types with a per-block offset
// (q8_1's second float); Q6_K, with a scale per 16 values, takes two m16n8k16 products per block,
// one per half. In mma's layout lane (g, t) holds values 4 t .. 4 t + 3 (lo) and 16 + 4 t ..
// (hi) of rows g and g + 8 of a tile, and the same of column g of a column tile: MmqA<Q>::load
// decodes exactly those words from the staged block. Rows and columns past the ends are read
// clamped to the last one and not stored. Needs sm_80 (mmq_fits in
// backend-cuda/src/ops/matmul.rs checks).
//
// mmq_id_<type>_<NT>: mul_mat_id (moe.cu's layout) over the (slot, token) pairs grouped by
// expert (mmid_bucket in moe.cu): t[0] dst f32 [m, n_used, n_tokens], t[1] the experts [k, m,
// n_expert] (rows contiguous), aux[0], aux[1] the rows [k, n_b, n_tokens] quantized as
// quantize_q8_1 writes them, aux[2] the tile table and aux[3] the pairs by expert (with the
// row of src1 each reads), as mmid_bucket writes them. Grid
// (ceil(m / 128), the table's entries), 128 threads. Block (x, y) computes rows 128 x .. + 128
// of table entry y's expert by its (at most 8 NT) pairs' rows, as mmq's block (x, 0, 0) over
// those columns, and stores each result at its (row, slot, token); an entry of expert -1 (the
// pairs routed to experts t[1] does not hold) stores zeros, an entry of no pairs returns at
// once. Dynamic shared memory: MmqSmem<Q, NT>::BYTES, as mmq's (every stage reads its pairs'
// rows from the list in global memory: a few cached loads, and no shared memory that would
// leave an SM room for fewer blocks).

// A 4-byte word at a 2-byte aligned address.
__device__ __forceinline__ int ld4a2(const u8* p) {
    const u16* h = (const u16*)p;
    return (int)((u32)h[0] | ((u32)h[1] << 16));
}

// c = a (16 x 32, s8, rows g and g + 8: a0/a1 values 4t.., a2/a3 values 16 + 4t..) times
// b (32 x 8, column g: b0 values 4 t.., b1 values 16 + 4 t..), s32.
__device__ __forceinline__ void mma_k32(int (&c)[4], int a0, int a1, int a2, int a3, int b0, int b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
#else
    __trap();
#endif
}

// The same over 16 values: a0/a1 values 4 t.. of rows g and g + 8, b0 values 4 t.. of column g.
__device__ __forceinline__ void mma_k16(int (&c)[4], int a0, int a1, int b0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%7,%7,%7,%7};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(0));
#else
    __trap();
#endif
}

// MmqA<Q>: SB bytes of 256 values of a row; MODE 0: value = s0 q; 1: s0 q + s1 (a per-block
// offset); 2: s0 q for values 0-15 of a block, s1 q for 16-31. load(row, j, t, lo, hi, s0, s1):
// block j (32 values, j < 8 for the 256-value types) from row, lo its int8 values 4 t .. 4 t + 3
// and hi 16 + 4 t .. 16 + 4 t + 3.
template <int Q> struct MmqA;

__device__ __forceinline__ int lo4(u32 w) { return (int)(w & 0x0F0F0F0Fu); }
__device__ __forceinline__ int hi4(u32 w) { return (int)((w >> 4) & 0x0F0F0F0Fu); }

template <> struct MmqA<Q4_0> {
    static const int SB = 144;
    static const int MODE = 0;
    static __device__ __forceinline__ void load(const u8* row, int j, int t, int& lo, int& hi, float& s0, float& s1) {
        const u8* b = row + (i64)j * 18;
        s0 = ldh(b);
        s1 = 0.0f;
        const u32 w = (u32)ld4a2(b + 2 + 4 * t);
        lo = (int)__vsub4((u32)lo4(w), 0x08080808u);
        hi = (int)__vsub4((u32)hi4(w), 0x08080808u);
    }
};

template <> struct MmqA<Q4_1> {
    static const int SB = 160;
    static const int MODE = 1;
    static __device__ __forceinline__ void load(const u8* row, int j, int t, int& lo, int& hi, float& s0, float& s1) {
        const u8* b = row + (i64)j * 20;
        s0 = ldh(b);
        s1 = ldh(b + 2);
        const u32 w = (u32)ld4(b + 4 + 4 * t);
        lo = lo4(w);
        hi = hi4(w);
    }
};

template <> struct MmqA<Q5_0> {
    static const int SB = 176;
    static const int MODE = 0;
    static __device__ __forceinline__ void load(const u8* row, int j, int t, int& lo, int& hi, float& s0, float& s1) {
        const u8* b = row + (i64)j * 22;
        s0 = ldh(b);
        s1 = 0.0f;
        const u32 qh = (u32)ld4a2(b + 2);
        const u32 w = (u32)ld4a2(b + 6 + 4 * t);
        lo = (int)__vsub4((u32)(lo4(w) | spread4(qh >> (4 * t))), 0x10101010u);
        hi = (int)__vsub4((u32)(hi4(w) | spread4(qh >> (16 + 4 * t))), 0x10101010u);
    }
};

template <> struct MmqA<Q5_1> {
    static const int SB = 192;
    static const int MODE = 1;
    static __device__ __forceinline__ void load(const u8* row, int j, int t, int& lo, int& hi, float& s0, float& s1) {
        const u8* b = row + (i64)j * 24;
        s0 = ldh(b);
        s1 = ldh(b + 2);
        const u32 qh = (u32)ld4(b + 4);
        const u32 w = (u32)ld4(b + 8 + 4 * t);
        lo = lo4(w) | spread4(qh >> (4 * t));
        hi = hi4(w) | spread4(qh >> (16 + 4 * t));
    }
};

template <> struct MmqA<Q8_0> {
    static const int SB = 272;
    static const int MODE = 0;
    static __device__ __forceinline__ void load(const u8* row, int j, int t, int& lo, int& hi, float& s0, float& s1) {
        const u8* b = row + (i64)j * 34;
        s0 = ldh(b);
        s1 = 0.0f;
        lo = ld4a2(b + 2 + 4 * t);
        hi = ld4a2(b + 18 + 4 * t);
    }
};

// Q4_K / Q5_K: block j is sub-block jj = j % 8 of super-block j / 8: the low (jj even) or high
// nibbles of qs bytes 32 (jj / 2) .., Q5_K's fifth bit bit jj of qh byte l for value l; scale
// d sc and offset -dmin m (k45_scales).
template <int Q> struct MmqK45 {
    static const int SB = Q == Q4_K ? 144 : 176;
    static const int MODE = 1;
    static __device__ __forceinline__ void load(const u8* row, int j, int t, int& lo, int& hi, float& s0, float& s1) {
        const u8* b = row + (i64)(j / 8) * (Q == Q4_K ? 144 : 176);
        const int jj = j % 8, c = jj / 2, sh = 4 * (jj & 1);
        const u32 dm = (u32)ld4(b);
        int s[3];
#pragma unroll
        for (int i = 0; i < 3; i++) s[i] = ld4(b + 4 + 4 * i);
        u32 sc, mn;
        k45_scales(c, s, sc, mn);
        s0 = h2f((u16)dm) * (float)((sc >> (2 * sh)) & 0xFFu);
        s1 = -h2f((u16)(dm >> 16)) * (float)((mn >> (2 * sh)) & 0xFFu);
        const u8* q = b + (Q == Q4_K ? 16 : 48) + 32 * c + 4 * t;
        lo = (int)(((u32)ld4(q) >> sh) & 0x0F0F0F0Fu);
        hi = (int)(((u32)ld4(q + 16) >> sh) & 0x0F0F0F0Fu);
        if (Q == Q5_K) {
            lo |= (int)((((u32)ld4(b + 16 + 4 * t) >> jj) & 0x01010101u) << 4);
            hi |= (int)((((u32)ld4(b + 32 + 4 * t) >> jj) & 0x01010101u) << 4);
        }
    }
};
template <> struct MmqA<Q4_K> : MmqK45<Q4_K> {};
template <> struct MmqA<Q5_K> : MmqK45<Q5_K> {};

// Q6_K: block j is group g = jj % 4 of half n = jj / 4 (jj = j % 8) of super-block j / 8: value
// l is nibble g / 2 of ql byte 64 n + 32 (g % 2) + l with bits 2 g, 2 g + 1 of qh byte
// 128 + 32 n + l above it, minus 32; values 0-15 scaled by d sc[8 n + 2 g], 16-31 by
// d sc[8 n + 2 g + 1].
template <> struct MmqA<Q6_K> {
    static const int SB = 210;
    static const int MODE = 2;
    static __device__ __forceinline__ void load(const u8* row, int j, int t, int& lo, int& hi, float& s0, float& s1) {
        const u8* b = row + (i64)(j / 8) * 210;
        const int jj = j % 8, n = jj / 4, g = jj % 4;
        const float d = ldh(b + 208);
        const u32 sc = (u32)*(const u16*)(b + 192 + 8 * n + 2 * g);
        s0 = d * (float)(int)(i8)(sc & 0xFFu);
        s1 = d * (float)(int)(i8)(sc >> 8);
        const u8* ql = b + 64 * n + 32 * (g % 2) + 4 * t;
        const u8* qh = b + 128 + 32 * n + 4 * t;
        const int sh = 4 * (g / 2);
        const u32 l0 = ((u32)ld4a2(ql) >> sh) & 0x0F0F0F0Fu, l1 = ((u32)ld4a2(ql + 16) >> sh) & 0x0F0F0F0Fu;
        const u32 h0 = (((u32)ld4a2(qh) >> (2 * g)) & 0x03030303u) << 4;
        const u32 h1 = (((u32)ld4a2(qh + 16) >> (2 * g)) & 0x03030303u) << 4;
        lo = (int)__vsub4(l0 | h0, 0x20202020u);
        hi = (int)__vsub4(l1 | h1, 0x20202020u);
    }
};

// The table types: 4-bit indices into TableQ's tables, one scale per 32 values.
// The table entries of the low and high nibbles of the 4 bytes of w.
__device__ __forceinline__ void mmq_lut(u32 w, const u32 (&tab)[4], int& lo, int& hi) {
    const u32 l = w & 0x0F0F0F0Fu, h = (w >> 4) & 0x0F0F0F0Fu;
    const u32 l2 = l | (l >> 4), h2 = h | (h >> 4);
    lo = TableQ::lut((l2 & 0xFFu) | ((l2 >> 8) & 0xFF00u), tab);
    hi = TableQ::lut((h2 & 0xFFu) | ((h2 >> 8) & 0xFF00u), tab);
}

template <> struct MmqA<IQ4_NL> {
    static const int SB = 144;
    static const int MODE = 0;
    static __device__ __forceinline__ void load(const u8* row, int j, int t, int& lo, int& hi, float& s0, float& s1) {
        const u32 tab[4] = IQ4_TABLE;
        const u8* b = row + (i64)j * 18;
        s0 = ldh(b);
        s1 = 0.0f;
        mmq_lut((u32)ld4a2(b + 2 + 4 * t), tab, lo, hi);
    }
};

// IQ4_XS: block j is sub-block ib = j % 8 of super-block j / 8 (136 bytes), scaled by
// d (ls - 32), its nibbles at 8 + 16 ib as IQ4_NL's.
template <> struct MmqA<IQ4_XS> {
    static const int SB = 136;
    static const int MODE = 0;
    static __device__ __forceinline__ void load(const u8* row, int j, int t, int& lo, int& hi, float& s0, float& s1) {
        const u32 tab[4] = IQ4_TABLE;
        const u8* b = row + (i64)(j / 8) * 136;
        const int ib = j % 8;
        const u32 sh = (u32)*(const u16*)(b + 2);
        const int ls = (int)(((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3u) << 4));
        s0 = ldh(b) * (float)(ls - 32);
        s1 = 0.0f;
        mmq_lut((u32)ld4a2(b + 8 + 16 * ib + 4 * t), tab, lo, hi);
    }
};

// MXFP4: 17-byte blocks, so its words are read a byte at a time.
template <> struct MmqA<MXFP4> {
    static const int SB = 136;
    static const int MODE = 0;
    static __device__ __forceinline__ void load(const u8* row, int j, int t, int& lo, int& hi, float& s0, float& s1) {
        const u32 tab[4] = MXFP4_TABLE;
        const u8* b = row + (i64)j * 17;
        s0 = e8m0_half(b[0]);
        s1 = 0.0f;
        const u8* q = b + 1 + 4 * t;
        const u32 w = (u32)q[0] | ((u32)q[1] << 8) | ((u32)q[2] << 16) | ((u32)q[3] << 24);
        mmq_lut(w, tab, lo, hi);
    }
};

// Asynchronous copies of N = 4 or 8 bytes from global to shared memory (through L1).
template <int N> __device__ __forceinline__ void cp_async_ca(void* dst, const void* src) {
    const u32 s = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(s), "l"(src), "n"(N) : "memory");
}

// Stages of k a block of mmq keeps in shared memory: the copies of the next one are in flight
// while the warps compute on the current one.
#define MMQ_NBUF 2

// The shared memory of mmq<Q, NT>, in 4-byte words: MMQ_NBUF stages, each the 4 warps' rows
// (WS: 32 rows of SW words a warp, room for an unaligned start), the column tile's int8 blocks
// (XQ: 8 NT columns of XS words, padded so that the lanes of one fragment load hit 32 different
// banks) and their (d, d sum) pairs (XD: [8 blocks][8 NT columns] float2). BYTES is what the
// host passes as dynamic shared memory (mmq_smem in backend-cuda/src/ops/matmul.rs mirrors it).
template <int Q, int NT> struct MmqSmem {
    static const int SW = (MmqA<Q>::SB + 3) / 4 + 1;
    static const int XS = 68;
    static const int WS = 4 * 32 * SW;
    static const int XQ = 8 * NT * XS;
    static const int XD = 8 * 8 * NT * 2;
    static const int STAGE = WS + XQ + XD;
    static const int BYTES = MMQ_NBUF * STAGE * 4;
};

// Stores v as row r of pair y = e + n_used t of mmq_id's dst.
__device__ __forceinline__ void mmq_id_store(const KParams& p, int y, i64 r, float v) {
    const TArg& d = p.t[0];
    F32::store(at(d, r, y % d.ne[1], y / d.ne[1], 0), v);
}

// ID: mmq_id's block (the column tile from the tile table), else mmq's.
template <int Q, int NT, bool ID> __device__ __forceinline__ void mmq(const KParams& p) {
    typedef MmqA<Q> A;
    typedef MmqSmem<Q, NT> L;
    const int MT = 2;  // 16-row tiles per warp: 32 rows a warp, 128 a block
    const int SW = L::SW, XS = L::XS;
    extern __shared__ __align__(16) u32 mmq_sm[];
    const TArg& a = p.t[1];
    const i64 m = a.ne[1];
    const int nblk = (int)(a.ne[0] / 32), n = p.i[0];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const i64 r0 = (i64)blockIdx.x * 128 + 32 * warp;
    const int c0 = ID ? 0 : blockIdx.y * 8 * NT;
    const u8* wbase = (const u8*)a.ptr;
    // mmq_id: the tile's pairs (its nc entries of the list: (column of the quantized rows,
    // pair)), of the weights' expert x.
    const int2* pairs = (const int2*)p.aux[3];
    int nc = 0;
    if (ID) {
        const int* tile = (const int*)p.aux[2] + 3 * (i64)blockIdx.y;
        const int x = tile[0];
        pairs += tile[1];
        nc = tile[2];
        if (nc == 0) return;
        if (x < 0) {
            for (int i = threadIdx.x; i < 128 * nc; i += 128) {
                const i64 r = (i64)blockIdx.x * 128 + i % 128;
                if (r < m) mmq_id_store(p, pairs[i / 128].y, r, 0.0f);
            }
            return;
        }
        wbase += x * a.nb[2];
    }
    // The column of the quantized rows that column c of the tile reads (a tile of fewer pairs
    // repeats its last one's).
    auto qcol = [&](int c) -> i64 { return ID ? (i64)pairs[min(c, nc - 1)].x : (i64)min(c0 + c, n - 1); };
    const int ns = (nblk + 7) / 8;
    const int s0 = (int)((i64)ns * blockIdx.z / gridDim.z), s1 = (int)((i64)ns * (blockIdx.z + 1) / gridDim.z);
    const u8* qs = (const u8*)p.aux[0];
    const float2* ds = (const float2*)p.aux[1];
    // Buffer b's parts: the warp's rows [32][SW], the column blocks [8 NT][XS], the scales [8][8 NT].
    auto ws = [&](int b) { return mmq_sm + b * L::STAGE + warp * 32 * SW; };
    auto xq = [&](int b) { return mmq_sm + b * L::STAGE + L::WS; };
    auto xd = [&](int b) { return (float2*)(mmq_sm + b * L::STAGE + L::WS + L::XQ); };
    // Where row r (of the warp's 32) of stage s starts in global memory.
    auto src_row = [&](int r, int s) {
        return wbase + min(r0 + r, m - 1) * a.nb[1] + (i64)s * A::SB;
    };
    // Copies stage s into buffer b (nothing past the block's last stage), one commit group.
    auto issue = [&](int s, int b) {
        if (s < s1) {
            const int jb = 8 * s, nbk = min(8, nblk - jb);
            const u32 bytes = (u32)(nbk * A::SB / 8);
            // The warp's rows: the aligned words that hold the stage's bytes (the last word may
            // end up to 3 bytes past them, inside the row or the allocation's padding).
            u32* w = ws(b);
            for (int x = lane; x < 32 * SW; x += 32) {
                const int r = x / SW, wi = x % SW;
                const u8* src = src_row(r, s);
                const u32 off = (u32)((size_t)src & 3);
                if (4 * (u32)wi < off + bytes) cp_async_ca<4>(&w[r * SW + wi], src - off + 4 * wi);
            }
            // The column tile's blocks jb .. jb + nbk: 16-byte halves of the int8, then (d, d sum).
            u32* q = xq(b);
            for (int x = threadIdx.x; x < 8 * NT * 16; x += 128) {
                const int c = x / 16, jj = x / 2 % 8, h = x % 2;
                if (jj < nbk) cp_async16((u8*)&q[c * XS + 8 * jj + 4 * h], qs + (qcol(c) * nblk + jb + jj) * 32 + 16 * h);
            }
            float2* d = xd(b);
            for (int x = threadIdx.x; x < 8 * NT * 8; x += 128) {
                const int c = x / 8, jj = x % 8;
                if (jj < nbk) cp_async_ca<8>(&d[jj * 8 * NT + c], ds + qcol(c) * nblk + jb + jj);
            }
        }
        cp_commit();
    };

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int c = 0; c < NT; c++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][c][e] = 0.0f;

#pragma unroll
    for (int b = 0; b < MMQ_NBUF - 1; b++) issue(s0 + b, b);
    for (int s = s0, b = 0; s < s1; s++, b = b == MMQ_NBUF - 1 ? 0 : b + 1) {
        // The buffer computed in the step before this one takes stage s + NBUF - 1.
        issue(s + MMQ_NBUF - 1, b == 0 ? MMQ_NBUF - 1 : b - 1);
        cp_wait<MMQ_NBUF - 1>();
        __syncthreads();
        const int nbk = min(8, nblk - 8 * s);
        const u32* w = ws(b);
        const u32* q = xq(b);
        const float2* d = xd(b);
        const u8* rows[MT][2];
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = 16 * i + 8 * h + g;
                rows[i][h] = (const u8*)&w[r * SW] + ((size_t)src_row(r, s) & 3);
            }
        for (int jj = 0; jj < nbk; jj++) {
            int al[MT][2], ah[MT][2];
            float w0[MT][2], w1[MT][2];
#pragma unroll
            for (int i = 0; i < MT; i++)
#pragma unroll
                for (int h = 0; h < 2; h++) A::load(rows[i][h], jj, t, al[i][h], ah[i][h], w0[i][h], w1[i][h]);
#pragma unroll
            for (int c = 0; c < NT; c++) {
                const int bl = (int)q[(8 * c + g) * XS + 8 * jj + t], bh = (int)q[(8 * c + g) * XS + 8 * jj + 4 + t];
                const float2 y0 = d[jj * 8 * NT + 8 * c + 2 * t], y1 = d[jj * 8 * NT + 8 * c + 2 * t + 1];
#pragma unroll
                for (int i = 0; i < MT; i++) {
                    if (A::MODE == 2) {
                        int cl[4], ch[4];
                        mma_k16(cl, al[i][0], al[i][1], bl);
                        mma_k16(ch, ah[i][0], ah[i][1], bh);
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            acc[i][c][e] += (e & 1 ? y1.x : y0.x) * (w0[i][e >> 1] * (float)cl[e] + w1[i][e >> 1] * (float)ch[e]);
                    } else {
                        int cs[4];
                        mma_k32(cs, al[i][0], al[i][1], ah[i][0], ah[i][1], bl, bh);
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const float2 y = e & 1 ? y1 : y0;
                            acc[i][c][e] += w0[i][e >> 1] * y.x * (float)cs[e];
                            if (A::MODE == 1) acc[i][c][e] += w1[i][e >> 1] * y.y;
                        }
                    }
                }
            }
        }
        __syncthreads();
    }

    if (ID) {
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int c = 0; c < NT; c++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const i64 r = r0 + 16 * i + 8 * (e >> 1) + g;
                    const int col = 8 * c + 2 * t + (e & 1);
                    if (r < m && col < nc) mmq_id_store(p, pairs[col].y, r, acc[i][c][e]);
                }
        return;
    }
    const i64 ld = p.t[0].nb[1] / 4;
    if (p.i[1] == 1) {
        // The k split is one thread-block cluster: every block leaves its sums in its shared
        // memory ([8 NT columns][128 rows], the stages being done with), and after a cluster
        // barrier block z adds up the z-th slice of them over the cluster's blocks in order of
        // rank, as mmq_sum would (the same bits), and stores it.
        float* red = (float*)mmq_sm;
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int c = 0; c < NT; c++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    red[(8 * c + 2 * t + (e & 1)) * 128 + 32 * warp + 16 * i + 8 * (e >> 1) + g] = acc[i][c][e];
        cluster_sync();
        const int S = gridDim.z, total = 128 * 8 * NT, slice = (total + S - 1) / S;
        const int lo = (int)cluster_rank() * slice, hi = min(total, lo + slice);
        for (int x = lo + threadIdx.x; x < hi; x += 128) {
            float v = 0.0f;
            for (int z = 0; z < S; z++) v += ld_cluster(red + x, z);
            const i64 r = (i64)blockIdx.x * 128 + x % 128, col = c0 + x / 128;
            if (r < m && col < n) ((float*)p.t[0].ptr)[col * ld + r] = v;
        }
        // The other blocks read this one's shared memory until here.
        cluster_sync();
        return;
    }
    const bool partial = gridDim.z > 1;
    float* out = partial ? (float*)p.aux[2] + (i64)blockIdx.z * m * n : (float*)p.t[0].ptr;
    const i64 ldo = partial ? m : ld;
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int c = 0; c < NT; c++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const i64 r = r0 + 16 * i + 8 * (e >> 1) + g;
                const i64 col = c0 + 8 * c + 2 * t + (e & 1);
                if (r < m && col < n) out[col * ldo + r] = acc[i][c][e];
            }
}

// mmq_sum: dst (t[0], f32 [m, n], columns nb[1] apart) = the sum over z < i[1] of the partials
// at aux[2] (f32 [m, n] contiguous, one after another), in order of z.
KERNEL mmq_sum(const KParams p) {
    pdl_wait();
    const TArg& d = p.t[0];
    const i64 m = d.ne[0], total = m * d.ne[1];
    const float* part = (const float*)p.aux[2];
    for (i64 x = (i64)blockIdx.x * blockDim.x + threadIdx.x; x < total; x += (i64)gridDim.x * blockDim.x) {
        float v = 0.0f;
        for (int z = 0; z < p.i[1]; z++) v += part[z * total + x];
        *(float*)at(d, x % m, x / m, 0, 0) = v;
    }
}

#define MMQ(nq, Q)                                                                              \
    MMVQ_KERNEL mmq_##nq##_1(const KParams p) { pdl_wait(); mmq<Q, 1, false>(p); }              \
    MMVQ_KERNEL mmq_##nq##_2(const KParams p) { pdl_wait(); mmq<Q, 2, false>(p); }              \
    MMVQ_KERNEL mmq_##nq##_3(const KParams p) { pdl_wait(); mmq<Q, 3, false>(p); }              \
    MMVQ_KERNEL mmq_##nq##_4(const KParams p) { pdl_wait(); mmq<Q, 4, false>(p); }              \
    MMVQ_KERNEL mmq_id_##nq##_4(const KParams p) { pdl_wait(); mmq<Q, 4, true>(p); }

MMQ(q4_0, Q4_0)
MMQ(q4_1, Q4_1)
MMQ(q5_0, Q5_0)
MMQ(q5_1, Q5_1)
MMQ(q8_0, Q8_0)
MMQ(q4_K, Q4_K)
MMQ(q5_K, Q5_K)
MMQ(q6_K, Q6_K)
MMQ(iq4_nl, IQ4_NL)
MMQ(iq4_xs, IQ4_XS)
MMQ(mxfp4, MXFP4)

// ---- mmt: quantized weights times 2 to 32 columns, each weight byte read once ----
//
// quantize_q8_1_tiles_<f32|f16>: the columns of src1 (t[1], f32 or f16, [k, n], 2-D, any
// strides) quantized as quantize_q8_1 does, laid out as mma.m16n8k32 takes its B operand:
// columns in tiles of 8 (ceil(n / 8) tiles; the columns past n are zeros), block j of tile T
// 256 bytes at aux[0] + (T nblk + j) 256, where lane 4 g + t of a warp finds its two registers
// as the 8 bytes at 8 (4 g + t): values 4 t .. 4 t + 3 of the tile's column g, then 16 + 4 t ..
// 16 + 4 t + 3; the tile's 8 pairs (d, d * sum(q)) at aux[1] + (T nblk + j) 64, column g's at
// 8 g. Grid ceil(8 tiles nblk / 8) blocks of 256 threads, one warp per 32-value block.
//
// mmt_<type>_<NT>_<V>: t[0] dst f32 [m, n] (any strides), t[1] the weights [k, m] (rows
// contiguous, nb[1] apart; 2-D), aux[0], aux[1] the columns as quantize_q8_1_tiles writes
// them, i[0] = n (at most 8 NT); i[2] = 1: t[2] is an f32 residual of dst's shape added to
// each result (a fused add); i[3] & 4: the weights are read early, as the mat-vecs' are (see
// "Early weights" above). MmtGeom<V> gives MT, the 16-row tiles of a warp (R = 16 MT rows),
// and NBUF, the stages a warp holds. Grid ceil(m / R) blocks of W warps (W = blockDim.x / 32,
// 1 to 8). Block x computes rows R x .. R x + R - 1 by all n columns: its W warps split k's
// stages of 256 values (8 blocks of 32, one super-block of the k-quants), warp w taking stages
// w, w + W, w + 2 W, ...; at the end their sums are added through shared memory in order of
// warp (no atomics: the same inputs give the same bits).
// Each warp copies its stages' R rows (the aligned 16-byte chunks that hold them, through L2
// only) into its own ring of NBUF stage slots in shared memory with asynchronous copies, NBUF
// - 1 stages ahead of the one it computes, and waits for nobody else until the end: every
// weight byte is read from memory once, and a block keeps W (NBUF - 1) stages of its rows in
// flight. Per 32-value block a warp takes mma.m16n8k32 (s8 x s8 -> s32) of each of its 16-row
// tiles with each of the NT column tiles: A fragments decoded from the slot by MmqA<Q>::load
// (as mmq's), B fragments one 8-byte load a lane (loaded two blocks ahead of their
// products), the integer sums scaled into float accumulators as mmq does. Rows past the
// end are read clamped to the last one and not stored. Needs sm_80 (mmt_fits in
// backend-cuda/src/ops/matmul.rs checks). Dynamic shared memory: W NBUF R MmtSlot<Q>::BYTES
// (mmt_smem there mirrors it).

template <class S> __device__ void quantize_q8_1_tiles(const KParams& p) {
    const TArg& s = p.t[1];
    const i64 nblk = s.ne[0] / 32, cols = (s.ne[1] + 7) / 8 * 8;
    const i64 gi = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (gi >= nblk * cols) return;
    const int l = threadIdx.x % 32;
    const i64 c = gi / nblk, j = gi % nblk;
    const float x = c < s.ne[1] ? S::load(at(s, 32 * j + l, c, 0, 0)) : 0.0f;
    // As q8_1_block, value l stored where lane 4 g + (l % 16) / 4 finds it (register l / 16).
    const float amax = warp_max(fabsf(x));
    const float d = amax / 127.0f;
    const int q = d == 0.0f ? 0 : __float2int_rn(x / d);
    const float sum = warp_sum((float)q);
    const i64 tb = (c / 8) * nblk + j;
    const int g = (int)(c % 8);
    ((i8*)p.aux[0])[tb * 256 + 8 * (4 * g + l % 16 / 4) + 4 * (l / 16) + l % 4] = (i8)q;
    if (l == 0) ((float2*)p.aux[1])[tb * 8 + g] = make_float2(d, d * sum);
}

KERNEL quantize_q8_1_tiles_f32(const KParams p) { pdl_wait(); quantize_q8_1_tiles<F32>(p); }
KERNEL quantize_q8_1_tiles_f16(const KParams p) { pdl_wait(); quantize_q8_1_tiles<F16>(p); }

// The geometries of mmt: MT 16-row tiles a warp, NBUF stage slots a warp.
template <int V> struct MmtGeom;
template <> struct MmtGeom<0> { static const int MT = 1, NBUF = 4; };
template <> struct MmtGeom<1> { static const int MT = 2, NBUF = 3; };

// A row's stage slot in mmt's shared memory: CH, the most 16-byte chunks a stage of SB bytes
// spans from any offset; BYTES, those chunks rounded up to an odd count, so that the 8 rows one
// fragment load reads (SLOT bytes apart) start in 8 different groups of 4 banks.
template <int Q> struct MmtSlot {
    static const int CH = (MmqA<Q>::SB + 30) / 16;
    static const int BYTES = (CH | 1) * 16;
};

// An int32 x of magnitude below 2^22 as float: its bits added to those of M = 1.5 * 2^23 make
// the float M + x exactly, and a float add takes M off again (two full-rate operations where a
// conversion runs at a quarter of the rate). The integer sums of mmt stay below 2^22: 32
// products of at most 128 * 127.
__device__ __forceinline__ float small_i2f(int x) { return __int_as_float(0x4B400000 + x) - 12582912.0f; }

// w x for such an x, given wm = -M w: one fused multiply-add of w and M + x, whose exact
// product less M w is w x, rounded once. wm is exact where w has at most 21 significant bits
// (M is 3 * 2^22): so for the scales of mmt's types, an f16, or an f16 times a 6-bit scale.
__device__ __forceinline__ float scaled_i2f(int x, float w, float wm) { return fmaf(w, __int_as_float(0x4B400000 + x), wm); }

template <int Q, int NT, int V> __device__ __forceinline__ void mmt(const KParams& p) {
    typedef MmqA<Q> A;
    const int MT = MmtGeom<V>::MT, NBUF = MmtGeom<V>::NBUF, R = 16 * MT;
    const int SLOT = MmtSlot<Q>::BYTES, CH = MmtSlot<Q>::CH;
    extern __shared__ __align__(16) u8 mmt_sm[];
    const TArg& a = p.t[1];
    const i64 m = a.ne[1];
    const int nblk = (int)(a.ne[0] / 32), n = p.i[0];
    const int W = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const i64 r0 = (i64)blockIdx.x * R;
    const int ns = (nblk + 7) / 8;
    const int cnt = warp < ns ? (ns - 1 - warp) / W + 1 : 0;
    u8* ring = mmt_sm + warp * (NBUF * R * SLOT);
    const u8* wbase = (const u8*)a.ptr;
    // Where row r (of the block's R) of stage s starts in global memory.
    auto src_row = [&](int r, int s) { return wbase + min(r0 + r, m - 1) * a.nb[1] + (i64)s * A::SB; };
    // Copies the warp's i-th stage into its slot (nothing past the warp's last), one commit group.
    auto issue = [&](int i) {
        if (i < cnt) {
            const int s = warp + i * W;
            const int bytes = nblk - 8 * s >= 8 ? A::SB : (nblk - 8 * s) * (A::SB / 8);
            u8* dst = ring + (i % NBUF) * (R * SLOT);
#pragma unroll
            for (int x0 = 0; x0 < R * CH; x0 += 32) {
                const int x = x0 + lane, r = x / CH, c = x % CH;
                const u8* src = src_row(r, s);
                const int off = (int)((size_t)src & 15);
                if (x < R * CH && 16 * c < off + bytes) cp_async16(dst + r * SLOT + 16 * c, src - off + 16 * c);
            }
        }
        cp_commit();
    };
    // The column tiles' block j: this lane's B registers and the (d, d sum) of columns 2 t and
    // 2 t + 1 of each tile.
    const int2* bq = (const int2*)p.aux[0] + lane;
    const float4* bd = (const float4*)p.aux[1] + t;
    auto load_b = [&](int j, int2 (&q)[NT], float4 (&y)[NT]) {
#pragma unroll
        for (int c = 0; c < NT; c++) {
            const i64 tb = (i64)c * nblk + j;
            q[c] = __ldg(bq + tb * 32);
            y[c] = __ldg(bd + tb * 4);
        }
    };

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int c = 0; c < NT; c++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][c][e] = 0.0f;

    // Early weights (i[3] & 4, where no node of the graph writes them): the first stages' copies
    // go out before the wait for the kernel ahead, the columns and outputs only after it.
    const bool early = (p.i[3] & 4) != 0;
    if (!early) pdl_wait();
#pragma unroll
    for (int i = 0; i < NBUF - 1; i++) issue(i);
    if (early) pdl_wait();
    for (int i = 0; i < cnt; i++) {
        // The slot computed in the step before this one takes stage i + NBUF - 1.
        issue(i + NBUF - 1);
        const int s = warp + i * W;
        const int nbk = min(8, nblk - 8 * s);
        // The column tiles of the stage's first two blocks; each block's step loads those of the
        // one two ahead.
        int2 q[NT], q1[NT];
        float4 y[NT], y1[NT];
        load_b(8 * s, q, y);
        load_b(8 * s + min(1, nbk - 1), q1, y1);
        cp_wait<NBUF - 1>();
        __syncwarp();
        const u8* st = ring + (i % NBUF) * (R * SLOT);
        const u8* rows[MT][2];
#pragma unroll
        for (int i2 = 0; i2 < MT; i2++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = 16 * i2 + 8 * h + g;
                rows[i2][h] = st + r * SLOT + ((size_t)src_row(r, s) & 15);
            }
#pragma unroll
        for (int jj = 0; jj < 8; jj++) {
            if (jj < nbk) {
                int2 qn[NT];
                float4 yn[NT];
                load_b(8 * s + min(jj + 2, nbk - 1), qn, yn);
                int al[MT][2], ah[MT][2];
                float w0[MT][2], w1[MT][2];
#pragma unroll
                for (int i2 = 0; i2 < MT; i2++)
#pragma unroll
                    for (int h = 0; h < 2; h++) A::load(rows[i2][h], jj, t, al[i2][h], ah[i2][h], w0[i2][h], w1[i2][h]);
                float wm[MT][2];
#pragma unroll
                for (int i2 = 0; i2 < MT; i2++)
#pragma unroll
                    for (int h = 0; h < 2; h++) wm[i2][h] = -12582912.0f * w0[i2][h];
#pragma unroll
                for (int c = 0; c < NT; c++) {
#pragma unroll
                    for (int i2 = 0; i2 < MT; i2++) {
                        if (A::MODE == 2) {
                            int cl[4], ch[4];
                            mma_k16(cl, al[i2][0], al[i2][1], q[c].x);
                            mma_k16(ch, ah[i2][0], ah[i2][1], q[c].y);
#pragma unroll
                            for (int e = 0; e < 4; e++)
                                acc[i2][c][e] += (e & 1 ? y[c].z : y[c].x)
                                               * (w0[i2][e >> 1] * small_i2f(cl[e]) + w1[i2][e >> 1] * small_i2f(ch[e]));
                        } else {
                            int cs[4];
                            mma_k32(cs, al[i2][0], al[i2][1], ah[i2][0], ah[i2][1], q[c].x, q[c].y);
#pragma unroll
                            for (int e = 0; e < 4; e++) {
                                const float dx = e & 1 ? y[c].z : y[c].x, sx = e & 1 ? y[c].w : y[c].y;
                                acc[i2][c][e] += dx * scaled_i2f(cs[e], w0[i2][e >> 1], wm[i2][e >> 1]);
                                if (A::MODE == 1) acc[i2][c][e] += w1[i2][e >> 1] * sx;
                            }
                        }
                    }
                }
#pragma unroll
                for (int c = 0; c < NT; c++) {
                    q[c] = q1[c];
                    y[c] = y1[c];
                    q1[c] = qn[c];
                    y1[c] = yn[c];
                }
            }
        }
        // Every lane is done with the slot before the next step's copies overwrite it.
        __syncwarp();
    }
    cp_wait<0>();

    // The warps' sums, [W][8 NT columns][R rows], in the slots (all computed by now).
    __syncthreads();
    float* red = (float*)mmt_sm;
#pragma unroll
    for (int i2 = 0; i2 < MT; i2++)
#pragma unroll
        for (int c = 0; c < NT; c++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                red[(warp * 8 * NT + 8 * c + 2 * t + (e & 1)) * R + 16 * i2 + 8 * (e >> 1) + g] = acc[i2][c][e];
    __syncthreads();
    for (int x = threadIdx.x; x < 8 * NT * R; x += blockDim.x) {
        const int col = x / R, r = x % R;
        if (col >= n || r0 + r >= m) continue;
        float v = 0.0f;
        for (int w = 0; w < W; w++) v += red[w * 8 * NT * R + x];
        if (p.i[2]) v += F32::load(at(p.t[2], r0 + r, col, 0, 0));
        F32::store(at(p.t[0], r0 + r, col, 0, 0), v);
    }
}

// 8 warps at most a block.
#define MMT_KERNEL extern "C" __global__ void __launch_bounds__(256)
#define MMT_V(nq, Q, V)                                                                 \
    MMT_KERNEL mmt_##nq##_1_##V(const KParams p) { pdl_wait_later(); mmt<Q, 1, V>(p); } \
    MMT_KERNEL mmt_##nq##_2_##V(const KParams p) { pdl_wait_later(); mmt<Q, 2, V>(p); } \
    MMT_KERNEL mmt_##nq##_3_##V(const KParams p) { pdl_wait_later(); mmt<Q, 3, V>(p); } \
    MMT_KERNEL mmt_##nq##_4_##V(const KParams p) { pdl_wait_later(); mmt<Q, 4, V>(p); }
#define MMT(nq, Q) MMT_V(nq, Q, 0) MMT_V(nq, Q, 1)

MMT(q4_0, Q4_0)
MMT(q8_0, Q8_0)
MMT(q4_K, Q4_K)
MMT(q5_K, Q5_K)
MMT(q6_K, Q6_K)
