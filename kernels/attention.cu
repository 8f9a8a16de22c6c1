// flash_attn_ext: softmax(q k^T * scale [softcapped] + slope * mask) v, without materialising
// the scores.
//
// fattn_<k>_<v>_<rpw>: t[0] dst f32 [dv, heads, nq, b] (contiguous), t[1] q f32 [d, nq, heads, b],
// t[2] k [d, nkv, kv_heads, bk], t[3] v [dv, nkv, kv_heads, bk] (f32 or f16, any strides),
// t[4] mask [nkv, >= nq, m2, m3] (i[4]: 0 none, 1 f32, 2 f16; dims 2-3 broadcast by modulo).
// f[0] scale (already divided by the softcap when one is set), f[1] softcap (0: none),
// f[2] m0, f[3] m1, i[0] n_head_log2, i[1] ALiBi on; i[2] number of KV splits; i[5] = 1 when
// K and V rows are aligned to four elements (loaded four at a time). d and dv are multiples of 4.
//
// The query rows of one KV head (nq * gqa of them: query i of head g*gqa + j is row i*gqa + j)
// are cut into tiles of 4 * rpw rows; a block of 4 warps takes one tile, one KV head and one
// split of the KV range, each warp rpw rows. K and V come through shared memory 32 keys at a
// time; each lane scores one key, the softmax runs online per row, and each lane accumulates
// dv/32 output columns. With one split the block writes the result; with several it writes
// (max, sum, unnormalised output) per row to aux[0] and fattn_combine merges them.
//
// fattn_vec_<k>_<v>: the same parameters, for at most VEC_ROWS query rows per KV head (one
// token's heads in decoding), K and V rows aligned to four elements, dv a power of two from 8
// to 256. A block of 256 threads takes one KV head and one split of at most 1024 keys (the host
// splits longer ranges): each thread scores whole keys against every row (scores kept in
// shared memory), one warp per row takes the softmax, then groups of dv / 8 lanes (8 columns a
// lane) sum probability times V over their share of the keys; the groups of a warp are added
// by shuffles, the warps through shared memory. Splits are combined as above.
//
// fattn_dec<D>_<rows>: decoding with f16 K and V, d == dv (64, 128 or 256), at most `rows` (4 or
// 8) query rows per KV head, K and V rows aligned to 16 bytes. A block of 4 warps takes one KV
// head and one split of the keys (the host makes splits short, so that short caches still fill
// the GPU), in chunks of 8 passes: in a pass, each group of d / 8 lanes reads one K row and one
// V row (16 bytes a lane, coalesced), all loads of a chunk issued before any is used. Scores
// are reduced within the group, the online softmax runs one warp per row, and each lane keeps
// 8 output columns of every row for its keys; groups and warps are summed at the end. Split, it
// writes partials as fattn does; with aux[3] != 0 (a zeroed u32 counter per (KV head, batch),
// grid y, which the kernel leaves at zero) the last block of each KV head to finish also merges
// them (no fattn_combine launch); with i[3] = 1 (the default on sm_90 for at most 8 splits) the
// splits of a KV head are one thread-block cluster instead (launched so): each block keeps its partials in its
// shared memory, and after a cluster barrier every block merges a slice of the results through
// distributed shared memory (no partials in global memory, no fences, no counters).
//
// Quantized output (fattn_dec, and fattn_combine after any kernel): with aux[1] != 0 (dst
// contiguous, dv a multiple of 32) the kernel that writes the final result also writes it as
// q8_1 blocks, in the layout quantize_q8_1_f32 (mmvq.cu) writes for dst's flat values: block j
// (values 32 j .. 32 j + 31, within one head) has its int8 at aux[1] + 32 j and (d, d * sum) at
// aux[2] + 8 j. The o projection that reads the result next then skips its quantize kernel.
//
// fattn_mma<D>: prompts with f16 K and V, d == dv (64 or 128), K and V rows aligned to 16
// bytes, on tensor cores (mma.sync m16n8k16, f16 inputs, f32 sums). A block of 4 warps takes 64
// query rows of one KV head (each warp 16) and one split of the keys. K and V come in tiles of
// 64 keys through shared memory (cp.async, two buffers: the next tile loads while this one is
// used); Q (scaled, as f16) stays in registers. S = Q K^T and O += P V run on tensor cores,
// the softmax on S's accumulators in registers (P becomes the A operand of P V without leaving
// them). Tiles where the mask is -inf for every row of the block (a causal prompt's future)
// are skipped: the block first scans its mask rows for the first and last tile that matter.
#include "common.cuh"

#define KTILE 32
#define MAXDV 256

// Four consecutive elements of a K or V row (aligned to four elements) as floats.
template <class T> __device__ __forceinline__ float4 load4(const char* p);
template <> __device__ __forceinline__ float4 load4<F32>(const char* p) { return *(const float4*)p; }
template <> __device__ __forceinline__ float4 load4<F16>(const char* p) { return unpack4_f16(*(const uint2*)p); }

// A tile of KTILE rows (keys c0 .. c0+KTILE, zero past kv1) of t, n elements each, into smem
// rows `stride` floats apart. vec: rows are aligned to four elements (load four at a time).
template <class T>
__device__ __forceinline__ void load_tile(const TArg& t, float* dst, int n, int stride, i64 c0, i64 kv1, int g, i64 bk, bool vec) {
    if (vec) {
        const int nq = n / 4;
        for (int idx = threadIdx.x; idx < KTILE * nq; idx += blockDim.x) {
            const int c = idx / nq, d4 = (idx - c * nq) * 4;
            const float4 x = c0 + c < kv1 ? load4<T>(at(t, d4, c0 + c, g, bk)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            *(float4*)(dst + c * stride + d4) = x;
        }
    } else {
        for (int idx = threadIdx.x; idx < KTILE * n; idx += blockDim.x) {
            const int c = idx / n, dd = idx - c * n;
            dst[c * stride + dd] = c0 + c < kv1 ? T::load(at(t, dd, c0 + c, g, bk)) : 0.0f;
        }
    }
}

__device__ __forceinline__ float alibi_slope(const KParams& p, int h) {
    if (!p.i[1]) return 1.0f;
    const int nl = p.i[0];
    return h < nl ? powf(p.f[2], (float)(h + 1)) : powf(p.f[3], (float)(2 * (h - nl) + 1));
}

template <class K, class V, int RPW> __device__ void fattn(const KParams& p) {
    extern __shared__ float4 smem4[];
    float* smem = (float*)smem4;
    const TArg& dst = p.t[0];
    const TArg& q = p.t[1];
    const TArg& k = p.t[2];
    const TArg& v = p.t[3];
    const TArg& mask = p.t[4];
    const int D = (int)q.ne[0], DV = (int)v.ne[0];
    const int QT = 4 * RPW;
    const int heads = (int)q.ne[2], kv_heads = (int)k.ne[2];
    const int gqa = heads / kv_heads;
    const i64 nq = q.ne[1], nkv = k.ne[1];
    const i64 rows = nq * gqa;
    const int g = blockIdx.y % kv_heads;
    const i64 b = blockIdx.y / kv_heads;
    const i64 bk = b / (q.ne[3] / k.ne[3]);
    const int nsplit = p.i[2], split = blockIdx.z;
    const i64 per_split = (nkv + nsplit - 1) / nsplit;
    const i64 kv0 = split * per_split, kv1 = min(nkv, kv0 + per_split);
    const int mask_type = p.i[4];

    float* Qs = smem;                      // [QT][D]
    float* Ks = Qs + QT * D;               // [KTILE][D + 4]
    float* Vs = Ks + KTILE * (D + 4);      // [KTILE][DV]
    float* Ps = Vs + KTILE * DV;           // [QT][KTILE]

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const i64 r0 = (i64)blockIdx.x * QT;

    for (int idx = tid; idx < QT * D; idx += blockDim.x) {
        const int rr = idx / D, dd = idx % D;
        const i64 r = r0 + rr;
        float x = 0.0f;
        if (r < rows) {
            const i64 iq = r / gqa;
            const int h = g * gqa + (int)(r % gqa);
            x = F32::load(at(q, dd, iq, h, b)) * p.f[0];
        }
        Qs[idx] = x;
    }

    float m[RPW], l[RPW], o[RPW][MAXDV / 32];
    float slope[RPW];
    i64 iqs[RPW];
    int hs[RPW];
    bool valid[RPW];
#pragma unroll
    for (int j = 0; j < RPW; j++) {
        const i64 r = r0 + warp * RPW + j;
        valid[j] = r < rows;
        iqs[j] = valid[j] ? r / gqa : 0;
        hs[j] = g * gqa + (int)(valid[j] ? r % gqa : 0);
        slope[j] = alibi_slope(p, hs[j]);
        m[j] = NEG_INF;
        l[j] = 0.0f;
#pragma unroll
        for (int i = 0; i < MAXDV / 32; i++) o[j][i] = 0.0f;
    }

    for (i64 c0 = kv0; c0 < kv1; c0 += KTILE) {
        __syncthreads();
        load_tile<K>(k, Ks, D, D + 4, c0, kv1, g, bk, p.i[5] != 0);
        load_tile<V>(v, Vs, DV, DV, c0, kv1, g, bk, p.i[5] != 0);
        __syncthreads();
#pragma unroll
        for (int j = 0; j < RPW; j++) {
            if (!valid[j]) continue;
            const int rr = warp * RPW + j;
            const i64 c = c0 + lane;
            float s = NEG_INF;
            if (c < kv1) {
                const float4* qr = (const float4*)(Qs + rr * D);
                const float4* kr = (const float4*)(Ks + lane * (D + 4));
                float acc = 0.0f;
#pragma unroll 4
                for (int dd = 0; dd < D / 4; dd++) {
                    const float4 a = qr[dd], b = kr[dd];
                    acc += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
                }
                s = acc;
                if (p.f[1] != 0.0f) s = p.f[1] * tanhf(s);
                if (mask_type) {
                    const char* mp = at(mask, c, iqs[j], bcast(hs[j], mask.ne[2]), bcast(b, mask.ne[3]));
                    s += slope[j] * (mask_type == 1 ? F32::load(mp) : F16::load(mp));
                }
            }
            const float mt = warp_max(s);
            const float mn = fmaxf(m[j], mt);
            const float pv = mn == NEG_INF ? 0.0f : expf(s - mn);
            const float alpha = m[j] == NEG_INF ? (mn == NEG_INF ? 1.0f : 0.0f) : expf(m[j] - mn);
            l[j] = l[j] * alpha + warp_sum(pv);
            m[j] = mn;
            Ps[rr * KTILE + lane] = pv;
#pragma unroll
            for (int i = 0; i < MAXDV / 32; i++) o[j][i] *= alpha;
        }
        __syncwarp();
#pragma unroll
        for (int j = 0; j < RPW; j++) {
            if (!valid[j]) continue;
            const float* pr = Ps + (warp * RPW + j) * KTILE;
            for (int c = 0; c < KTILE; c++) {
                const float pc = pr[c];
                const float* vr = Vs + c * DV;
#pragma unroll
                for (int i = 0; i < MAXDV / 32; i++) {
                    const int col = lane + 32 * i;
                    if (col < DV) o[j][i] += pc * vr[col];
                }
            }
        }
    }

#pragma unroll
    for (int j = 0; j < RPW; j++) {
        if (!valid[j]) continue;
        if (nsplit == 1) {
            const float inv = l[j] == 0.0f ? 0.0f : 1.0f / l[j];
#pragma unroll
            for (int i = 0; i < MAXDV / 32; i++) {
                const int col = lane + 32 * i;
                if (col < DV) F32::store(at(dst, col, hs[j], iqs[j], b), o[j][i] * inv);
            }
        } else {
            const i64 row = (b * kv_heads + g) * rows + r0 + warp * RPW + j;
            float* part = (float*)p.aux[0] + (row * nsplit + split) * (DV + 2);
            if (lane == 0) {
                part[0] = m[j];
                part[1] = l[j];
            }
#pragma unroll
            for (int i = 0; i < MAXDV / 32; i++) {
                const int col = lane + 32 * i;
                if (col < DV) part[2 + col] = o[j][i];
            }
        }
    }
}

#define FATTN(nk, K, nv, V)                                                                \
    KERNEL fattn_##nk##_##nv##_1(const KParams p) { pdl_wait(); fattn<K, V, 1>(p); }       \
    KERNEL fattn_##nk##_##nv##_2(const KParams p) { pdl_wait(); fattn<K, V, 2>(p); }       \
    KERNEL fattn_##nk##_##nv##_4(const KParams p) { pdl_wait(); fattn<K, V, 4>(p); }
FATTN(f32, F32, f32, F32)
FATTN(f32, F32, f16, F16)
FATTN(f16, F16, f32, F32)
FATTN(f16, F16, f16, F16)

#define VEC_ROWS 4

template <class K, class V> __device__ void fattn_vec(const KParams& p) {
    extern __shared__ float4 smem4[];
    float* smem = (float*)smem4;
    const TArg& dst = p.t[0];
    const TArg& q = p.t[1];
    const TArg& k = p.t[2];
    const TArg& v = p.t[3];
    const TArg& mask = p.t[4];
    const int D = (int)q.ne[0], DV = (int)v.ne[0];
    const int heads = (int)q.ne[2], kv_heads = (int)k.ne[2];
    const int gqa = heads / kv_heads;
    const i64 nkv = k.ne[1];
    const int R = (int)(q.ne[1] * gqa);
    const int g = blockIdx.y % kv_heads;
    const i64 b = blockIdx.y / kv_heads;
    const i64 bk = b / (q.ne[3] / k.ne[3]);
    const int nsplit = p.i[2], split = blockIdx.z;
    const i64 per_split = (nkv + nsplit - 1) / nsplit;
    const i64 kv0 = min(nkv, split * per_split);
    const int kvn = (int)(min(nkv, kv0 + per_split) - kv0);
    const int mask_type = p.i[4];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;

    float* Qs = smem;                   // [VEC_ROWS][D]
    float* S = Qs + VEC_ROWS * D;       // [VEC_ROWS][per_split]: scores, then probabilities
    float* ML = S + VEC_ROWS * per_split;  // [VEC_ROWS][2]: max and sum per row
    float* O = ML + 2 * VEC_ROWS;       // [warps][VEC_ROWS][DV]: the warps' output sums

    int hs[VEC_ROWS];
    i64 iqs[VEC_ROWS];
    float slope[VEC_ROWS];
#pragma unroll
    for (int r = 0; r < VEC_ROWS; r++) {
        const int rr = r < R ? r : 0;
        iqs[r] = rr / gqa;
        hs[r] = g * gqa + rr % gqa;
        slope[r] = alibi_slope(p, hs[r]);
    }
    for (int idx = tid; idx < R * D; idx += blockDim.x) {
        const int r = idx / D, dd = idx - r * D;
        Qs[idx] = F32::load(at(q, dd, r / gqa, g * gqa + r % gqa, b)) * p.f[0];
    }
    __syncthreads();

    // Scores: one key per thread at a time, against every row.
    for (int c = tid; c < kvn; c += blockDim.x) {
        const char* kr = at(k, 0, kv0 + c, g, bk);
        float acc[VEC_ROWS];
#pragma unroll
        for (int r = 0; r < VEC_ROWS; r++) acc[r] = 0.0f;
#pragma unroll 8
        for (int d4 = 0; d4 < D / 4; d4++) {
            const float4 kv = load4<K>(kr + 4 * d4 * K::size);
#pragma unroll
            for (int r = 0; r < VEC_ROWS; r++) {
                if (r < R) {
                    const float4 qv = *(const float4*)(Qs + r * D + 4 * d4);
                    acc[r] += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
                }
            }
        }
#pragma unroll
        for (int r = 0; r < VEC_ROWS; r++) {
            if (r >= R) continue;
            float s = acc[r];
            if (p.f[1] != 0.0f) s = p.f[1] * tanhf(s);
            if (mask_type) {
                const char* mp = at(mask, kv0 + c, iqs[r], bcast(hs[r], mask.ne[2]), bcast(b, mask.ne[3]));
                s += slope[r] * (mask_type == 1 ? F32::load(mp) : F16::load(mp));
            }
            S[r * per_split + c] = s;
        }
    }
    __syncthreads();

    // Softmax numerators: one warp per row.
    for (int r = warp; r < R; r += blockDim.x / 32) {
        float* sr = S + r * per_split;
        float mx = NEG_INF;
        for (int c = lane; c < kvn; c += 32) mx = fmaxf(mx, sr[c]);
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int c = lane; c < kvn; c += 32) {
            const float e = mx == NEG_INF ? 0.0f : expf(sr[c] - mx);
            sr[c] = e;
            sum += e;
        }
        sum = warp_sum(sum);
        if (lane == 0) {
            ML[2 * r] = mx;
            ML[2 * r + 1] = sum;
        }
    }
    __syncthreads();

    // Probability times V: a lane takes 8 consecutive columns (a chunk) of every key of its
    // group; the DV / 8 lanes of a group cover a V row, the groups of a warp are summed by
    // shuffles and the warps' sums in shared memory.
    const int chunks = DV / 8, gpw = 32 / chunks, warps = blockDim.x / 32;
    const int grp = warp * gpw + lane / chunks, ch = lane % chunks, groups = warps * gpw;
    float acc[VEC_ROWS][8];
#pragma unroll
    for (int r = 0; r < VEC_ROWS; r++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[r][e] = 0.0f;
#pragma unroll 2
    for (int c = grp; c < kvn; c += groups) {
        const char* vr = at(v, 8 * ch, kv0 + c, g, bk);
        const float4 v0 = load4<V>(vr), v1 = load4<V>(vr + 4 * V::size);
        const float vv[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
        for (int r = 0; r < VEC_ROWS; r++) {
            if (r < R) {
                const float pc = S[r * per_split + c];
#pragma unroll
                for (int e = 0; e < 8; e++) acc[r][e] += pc * vv[e];
            }
        }
    }
#pragma unroll
    for (int r = 0; r < VEC_ROWS; r++) {
#pragma unroll
        for (int e = 0; e < 8; e++) {
            for (int o = chunks; o < 32; o <<= 1) acc[r][e] += __shfl_xor_sync(0xffffffffu, acc[r][e], o);
        }
    }
    if (lane < chunks) {
#pragma unroll
        for (int r = 0; r < VEC_ROWS; r++) {
            if (r < R) {
                float* dst8 = O + (warp * VEC_ROWS + r) * DV + 8 * ch;
#pragma unroll
                for (int e = 0; e < 8; e++) dst8[e] = acc[r][e];
            }
        }
    }
    __syncthreads();

    for (int idx = tid; idx < R * DV; idx += blockDim.x) {
        const int r = idx / DV, col = idx - r * DV;
        float o = 0.0f;
        for (int wi = 0; wi < warps; wi++) o += O[(wi * VEC_ROWS + r) * DV + col];
        const float l = ML[2 * r + 1];
        if (nsplit == 1) {
            F32::store(at(dst, col, g * gqa + r % gqa, r / gqa, b), l == 0.0f ? 0.0f : o / l);
        } else {
            const i64 row = (b * kv_heads + g) * R + r;
            float* part = (float*)p.aux[0] + (row * nsplit + split) * (DV + 2);
            if (col == 0) {
                part[0] = ML[2 * r];
                part[1] = l;
            }
            part[2 + col] = o;
        }
    }
}

KERNEL fattn_vec_f32_f32(const KParams p) { pdl_wait(); fattn_vec<F32, F32>(p); }
KERNEL fattn_vec_f32_f16(const KParams p) { pdl_wait(); fattn_vec<F32, F16>(p); }
KERNEL fattn_vec_f16_f32(const KParams p) { pdl_wait(); fattn_vec<F16, F32>(p); }
KERNEL fattn_vec_f16_f16(const KParams p) { pdl_wait(); fattn_vec<F16, F16>(p); }

// ---- decoding with f16 K and V (fattn_dec) ----

// Eight f16 values (16 bytes) as floats.
__device__ __forceinline__ void h8_to_f(const uint4 u, float* f) {
    const u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = h2f((u16)w[i]);
        f[2 * i + 1] = h2f((u16)(w[i] >> 16));
    }
}

// A mask value of row r (query iq, head h) at key c, times the row's ALiBi slope.
__device__ __forceinline__ float mask_at(const KParams& p, i64 c, i64 iq, int h, i64 b, float slope) {
    const TArg& mask = p.t[4];
    const char* mp = at(mask, c, iq, bcast(h, mask.ne[2]), bcast(b, mask.ne[3]));
    return slope * (p.i[4] == 1 ? F32::load(mp) : F16::load(mp));
}

// Stores result value x at (col, h, iq, b) of dst (t[0]), and, when aux[1] is set, quantized
// (see the header): the whole warp calls it, lane l holding column 32 j + l of one head.
__device__ __forceinline__ void store_out(const KParams& p, float x, int col, int h, i64 iq, i64 b) {
    char* o = at(p.t[0], col, h, iq, b);
    F32::store(o, x);
    if (p.aux[1] != 0) {
        const i64 blk = (o - (char*)p.t[0].ptr) / (32 * 4);
        q8_1_block(x, (i8*)p.aux[1] + blk * 32, (float2*)p.aux[2] + blk);
    }
}

#define DEC_WARPS 4
#define DEC_PASSES 8

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

// The merge of fattn_dec's nsplit partials of rows 0 .. R - 1 of (KV head g, batch b) when the
// splits are one cluster (i[3]): block s of the cluster holds its output sums at O0[r * D + col]
// and its max and sum at ML[2 r], ML[2 r + 1] in shared memory. Every block computes the split
// weights, then merges its own slice of the R * D results (whole warps of 32 columns), with the
// nsplit loads of a result in flight together; the sums run in split order, as dec_merge's do.
// Every block waits at the end until all have merged (its shared memory must outlive the reads).
template <int D>
__device__ void dec_cluster_merge(const KParams& p, int R, int g, i64 b, int nsplit, const float* O0, const float* ML) {
    __shared__ float CW[8][8];  // split weights exp(max_s - max) per row (nsplit <= 8)
    __shared__ float CINV[8];   // 1 / the row's total
    const int kv_heads = (int)p.t[2].ne[2], gqa = (int)p.t[1].ne[2] / kv_heads;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    cluster_sync();
    for (int r = warp; r < R; r += warps) {
        const float ms = lane < nsplit ? ld_cluster(ML + 2 * r, lane) : NEG_INF;
        const float ls = lane < nsplit ? ld_cluster(ML + 2 * r + 1, lane) : 0.0f;
        const float mx = warp_max(ms);
        const float w = ms == NEG_INF ? 0.0f : expf(ms - mx);
        const float tot = warp_sum(w * ls);
        if (lane < nsplit) CW[r][lane] = w;
        if (lane == 0) CINV[r] = tot == 0.0f ? 0.0f : 1.0f / tot;
    }
    __syncthreads();
    const int total = R * D, slice = ((total + nsplit - 1) / nsplit + 31) / 32 * 32;
    const int lo = (int)cluster_rank() * slice, hi = min(total, lo + slice);
    for (int idx = lo + threadIdx.x; idx < hi; idx += blockDim.x) {
        const int r = idx / D, col = idx - r * D;
        float part[8];
#pragma unroll
        for (int s = 0; s < 8; s++) part[s] = s < nsplit ? ld_cluster(O0 + idx, s) : 0.0f;
        float acc = 0.0f;
#pragma unroll
        for (int s = 0; s < 8; s++)
            if (s < nsplit) acc += CW[r][s] * part[s];
        store_out(p, acc * CINV[r], col, g * gqa + r % gqa, r / gqa, b);
    }
    cluster_sync();
}

// Merges the nsplit partials of rows 0 .. R - 1 of (KV head g, batch b) at aux[0] (written by
// this launch's blocks) into the result, as fattn_combine does, in one block of DEC_WARPS
// warps. W: shared memory for R * 256 split weights, INV: for R floats.
template <int D>
__device__ void dec_merge(const KParams& p, int R, int g, i64 b, int nsplit, float* W, float* INV) {
    const int kv_heads = (int)p.t[2].ne[2], gqa = (int)p.t[1].ne[2] / kv_heads;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const float* part0 = (const float*)p.aux[0] + (b * kv_heads + g) * R * nsplit * (i64)(D + 2);
    // One warp per row: the splits' weights exp(max_s - max) and the row's total.
    for (int r = warp; r < R; r += DEC_WARPS) {
        const float* part = part0 + (i64)r * nsplit * (D + 2);
        float mx = NEG_INF;
        for (int s = lane; s < nsplit; s += 32) mx = fmaxf(mx, __ldcg(part + s * (D + 2)));
        mx = warp_max(mx);
        float tot = 0.0f;
        for (int s = lane; s < nsplit; s += 32) {
            const float ms = __ldcg(part + s * (D + 2));
            const float w = ms == NEG_INF ? 0.0f : expf(ms - mx);
            W[r * 256 + s] = w;
            tot += w * __ldcg(part + s * (D + 2) + 1);
        }
        tot = warp_sum(tot);
        if (lane == 0) INV[r] = tot == 0.0f ? 0.0f : 1.0f / tot;
    }
    __syncthreads();
    // Each column of each row summed over the splits; a warp's 32 columns lie in one row.
    for (int idx = threadIdx.x; idx < R * D; idx += blockDim.x) {
        const int r = idx / D, col = idx - r * D;
        const float* part = part0 + (i64)r * nsplit * (D + 2) + 2 + col;
        const float* w = W + r * 256;
        float acc = 0.0f;
#pragma unroll 8
        for (int s = 0; s < nsplit; s++) acc += w[s] * __ldcg(part + (i64)s * (D + 2));
        store_out(p, acc * INV[r], col, g * gqa + r % gqa, r / gqa, b);
    }
}

template <int D, int RM> __device__ void fattn_dec(const KParams& p) {
    constexpr int L = D / 8;                  // lanes per K or V row
    constexpr int KPW = 32 / L;               // rows a warp reads in one pass
    constexpr int KPB = DEC_WARPS * KPW;      // rows the block reads in one pass
    constexpr int CH = DEC_PASSES * KPB;      // keys per chunk
    constexpr int CPL = CH / 32;              // keys per lane in the softmax
    constexpr int RPW = RM / DEC_WARPS;       // softmax rows per warp
    __shared__ float S[RM][CH];               // scores, then probabilities
    __shared__ float ALPHA[RM];               // per chunk: rescaling of the old sums
    __shared__ float ML[RM][2];               // at the end: max and sum per row
    __shared__ float O[DEC_WARPS][RM][D];     // at the end: the warps' output sums

    const TArg& q = p.t[1];
    const TArg& k = p.t[2];
    const TArg& v = p.t[3];
    const int heads = (int)q.ne[2], kv_heads = (int)k.ne[2];
    const int gqa = heads / kv_heads;
    const i64 nkv = k.ne[1];
    const int R = (int)(q.ne[1] * gqa);
    const int g = blockIdx.y % kv_heads;
    const i64 b = blockIdx.y / kv_heads;
    const i64 bk = b / (q.ne[3] / k.ne[3]);
    const int nsplit = p.i[2], split = blockIdx.z;
    const i64 per_split = (nkv + nsplit - 1) / nsplit;
    const i64 kv0 = min(nkv, split * per_split), kv1 = min(nkv, kv0 + per_split);
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int sub = lane % L, slot = warp * KPW + lane / L;

    // This lane's 8 columns of every query row, scaled (rows past R are zero).
    float qr[RM][8];
#pragma unroll
    for (int r = 0; r < RM; r++) {
        const char* qp = at(q, 8 * sub, r / gqa, g * gqa + r % gqa, b);
#pragma unroll
        for (int e = 0; e < 8; e++) qr[r][e] = r < R ? F32::load(qp + e * q.nb[0]) * p.f[0] : 0.0f;
    }
    // The softmax rows of this warp: row warp + DEC_WARPS * j.
    float m[RPW], l[RPW], slope[RPW];
    i64 iqs[RPW];
    int hs[RPW];
#pragma unroll
    for (int j = 0; j < RPW; j++) {
        const int r = warp + DEC_WARPS * j;
        const int rr = r < R ? r : 0;
        iqs[j] = rr / gqa;
        hs[j] = g * gqa + rr % gqa;
        slope[j] = alibi_slope(p, hs[j]);
        m[j] = NEG_INF;
        l[j] = 0.0f;
    }
    float acc[RM][8];
#pragma unroll
    for (int r = 0; r < RM; r++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[r][e] = 0.0f;

    const char* kbase = at(k, 8 * sub, 0, g, bk);
    const char* vbase = at(v, 8 * sub, 0, g, bk);
    // K rows, V rows and this warp's mask values of the chunk at c0: the loads of the next
    // chunk are issued as soon as the registers they land in are free (K after the scores, the
    // mask after the softmax, V after the sums), so they overlap this chunk's work.
    uint4 kr[DEC_PASSES], vr[DEC_PASSES];
    float mk[RPW][CPL];
    auto load_rows = [&](uint4* dstr, const char* base, i64 stride, i64 c0) {
#pragma unroll
        for (int i = 0; i < DEC_PASSES; i++) {
            const i64 c = c0 + i * KPB + slot;
            dstr[i] = c < kv1 ? *(const uint4*)(base + c * stride) : make_uint4(0, 0, 0, 0);
        }
    };
    auto load_mask = [&](i64 c0) {
#pragma unroll
        for (int j = 0; j < RPW; j++)
#pragma unroll
            for (int t = 0; t < CPL; t++) {
                const i64 c = c0 + lane + 32 * t;
                mk[j][t] = (p.i[4] && c < kv1) ? mask_at(p, c, iqs[j], hs[j], b, slope[j]) : 0.0f;
            }
    };
    load_rows(kr, kbase, k.nb[1], kv0);
    load_rows(vr, vbase, v.nb[1], kv0);
    load_mask(kv0);
    for (i64 c0 = kv0; c0 < kv1; c0 += CH) {
        const bool more = c0 + CH < kv1;

        // Scores: a group of L lanes per key; the group's sums are reduced and scattered, so
        // that lane sub of the group ends with row sub / (L / RM) (RM - 1 + log2(L / RM)
        // shuffles instead of RM log2(L)).
#pragma unroll
        for (int i = 0; i < DEC_PASSES; i++) {
            float kf[8];
            h8_to_f(kr[i], kf);
            float s[RM];
#pragma unroll
            for (int r = 0; r < RM; r++) {
                float a = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; e++) a += qr[r][e] * kf[e];
                s[r] = a;
            }
#pragma unroll
            for (int n = RM, o = L / 2; n > 1; n >>= 1, o >>= 1) {
                const bool hi = (lane & o) != 0;
#pragma unroll
                for (int r = 0; r < n / 2; r++) {
                    const float keep = hi ? s[r + n / 2] : s[r];
                    const float send = hi ? s[r] : s[r + n / 2];
                    s[r] = keep + __shfl_xor_sync(0xffffffffu, send, o);
                }
            }
#pragma unroll
            for (int o = L / RM / 2; o > 0; o >>= 1) s[0] += __shfl_xor_sync(0xffffffffu, s[0], o);
            if (sub % (L / RM) == 0) {
                const int cc = i * KPB + slot;
                float x = s[0];
                if (p.f[1] != 0.0f) x = p.f[1] * tanhf(x);
                S[sub / (L / RM)][cc] = c0 + cc < kv1 ? x : NEG_INF;
            }
        }
        if (more) load_rows(kr, kbase, k.nb[1], c0 + CH);
        __syncthreads();

        // Online softmax, one warp per row.
#pragma unroll
        for (int j = 0; j < RPW; j++) {
            const int r = warp + DEC_WARPS * j;
            if (r >= R) continue;
            float x[CPL];
            float mx = NEG_INF;
#pragma unroll
            for (int t = 0; t < CPL; t++) {
                x[t] = S[r][lane + 32 * t] + mk[j][t];
                mx = fmaxf(mx, x[t]);
            }
            mx = warp_max(mx);
            const float mn = fmaxf(m[j], mx);
            float sum = 0.0f;
#pragma unroll
            for (int t = 0; t < CPL; t++) {
                const float e = mn == NEG_INF ? 0.0f : __expf(x[t] - mn);
                S[r][lane + 32 * t] = e;
                sum += e;
            }
            const float alpha = m[j] == NEG_INF ? 0.0f : __expf(m[j] - mn);
            l[j] = l[j] * alpha + warp_sum(sum);
            m[j] = mn;
            if (lane == 0) ALPHA[r] = alpha;
        }
        if (more) load_mask(c0 + CH);
        __syncthreads();

        // Probabilities times V.
#pragma unroll
        for (int r = 0; r < RM; r++) {
            const float a = r < R ? ALPHA[r] : 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++) acc[r][e] *= a;
        }
#pragma unroll
        for (int i = 0; i < DEC_PASSES; i++) {
            float vf[8];
            h8_to_f(vr[i], vf);
            const int cc = i * KPB + slot;
#pragma unroll
            for (int r = 0; r < RM; r++) {
                const float pc = r < R ? S[r][cc] : 0.0f;
#pragma unroll
                for (int e = 0; e < 8; e++) acc[r][e] += pc * vf[e];
            }
        }
        if (more) load_rows(vr, vbase, v.nb[1], c0 + CH);
        __syncthreads();
    }

    // Sum the groups of each warp, then the warps.
#pragma unroll
    for (int r = 0; r < RM; r++)
#pragma unroll
        for (int e = 0; e < 8; e++)
#pragma unroll
            for (int o = L; o < 32; o <<= 1) acc[r][e] += __shfl_xor_sync(0xffffffffu, acc[r][e], o);
    if (lane < L) {
#pragma unroll
        for (int r = 0; r < RM; r++)
#pragma unroll
            for (int e = 0; e < 8; e++) O[warp][r][8 * sub + e] = acc[r][e];
    }
#pragma unroll
    for (int j = 0; j < RPW; j++) {
        const int r = warp + DEC_WARPS * j;
        if (lane == 0 && r < R) {
            ML[r][0] = m[j];
            ML[r][1] = l[j];
        }
    }
    __syncthreads();
    for (int idx = tid; idx < R * D; idx += blockDim.x) {
        const int r = idx / D, col = idx - r * D;
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++) o += O[w][r][col];
        const float sum = ML[r][1];
        if (nsplit == 1) {
            store_out(p, sum == 0.0f ? 0.0f : o / sum, col, g * gqa + r % gqa, r / gqa, b);
        } else if (p.i[3]) {
            O[0][r][col] = o;  // this thread's own (r, col): read above, by no other thread
        } else {
            const i64 row = (b * kv_heads + g) * R + r;
            float* part = (float*)p.aux[0] + (row * nsplit + split) * (D + 2);
            if (col == 0) {
                part[0] = ML[r][0];
                part[1] = sum;
            }
            part[2 + col] = o;
        }
    }
    if (nsplit > 1 && p.i[3]) {
        dec_cluster_merge<D>(p, R, g, b, nsplit, &O[0][0][0], &ML[0][0]);
        return;
    }
    if (nsplit == 1 || p.aux[3] == 0) return;

    // One launch for all splits: the block that finishes last among this (KV head, batch)'s
    // splits merges their partials. Each thread's partials are made visible to the whole device
    // before thread 0 counts the block in; the last block sets the counter back to zero for
    // the next launch (a CUDA graph replays the same counters) and reads the partials after
    // the count, from L2.
    __shared__ int LAST;
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        unsigned* cnt = (unsigned*)p.aux[3] + blockIdx.y;
        LAST = atomicAdd(cnt, 1u) == (unsigned)(nsplit - 1);
        if (LAST) atomicExch(cnt, 0u);
    }
    __syncthreads();
    if (!LAST) return;
    __threadfence();
    dec_merge<D>(p, R, g, b, nsplit, &O[0][0][0], &ML[0][0]);
}

#define FATTN_DEC(d)                                                             \
    KERNEL fattn_dec##d##_4(const KParams p) { pdl_wait(); fattn_dec<d, 4>(p); } \
    KERNEL fattn_dec##d##_8(const KParams p) { pdl_wait(); fattn_dec<d, 8>(p); }
FATTN_DEC(64)
FATTN_DEC(128)
FATTN_DEC(256)

// ---- prompts with f16 K and V on tensor cores (fattn_mma) ----

#define MMA_BQ 64          // query rows per block (16 per warp)
#define MMA_BK 64          // keys per tile
#define MMA_THREADS 128
#define LOG2E 1.4426950408889634f

// 16 bytes from global to shared memory without passing registers; zero-filled when !ok.
__device__ __forceinline__ void cp16(u32 dst, const void* src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

__device__ __forceinline__ void ldsm4(u32 addr, u32* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm4t(u32 addr, u32* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// d += a b for one m16n8k16 tile (a row-major 16x16 f16, b column-major 16x8 f16, d f32).
__device__ __forceinline__ void mma16816(float* d, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as f16x2, lo in the low half.
__device__ __forceinline__ u32 pack_h2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Mask values at keys c and c + 1 of a mask row (c + 1 < nkv or not: past nkv is -inf).
__device__ __forceinline__ float2 mask_pair(const char* row, const TArg& mask, int type, bool pairs, i64 c, i64 nkv) {
    float2 r;
    if (pairs && c + 1 < nkv) {
        const char* mp = row + c * mask.nb[0];
        if (type == 2) {
            const u32 u = *(const u32*)mp;
            r.x = h2f((u16)u);
            r.y = h2f((u16)(u >> 16));
        } else {
            r = *(const float2*)mp;
        }
        return r;
    }
    r.x = c < nkv ? (type == 2 ? F16::load(row + c * mask.nb[0]) : F32::load(row + c * mask.nb[0])) : NEG_INF;
    r.y = c + 1 < nkv ? (type == 2 ? F16::load(row + (c + 1) * mask.nb[0]) : F32::load(row + (c + 1) * mask.nb[0])) : NEG_INF;
    return r;
}

// Whether a mask value (its bits) is -inf.
__device__ __forceinline__ bool h_neg_inf(u32 h) { return (h & 0xffffu) == 0xfc00u; }

template <int D, bool CAP> __device__ void fattn_mma(const KParams& p) {
    constexpr int ST = D + 8;                 // shared row stride in halves (no bank conflicts)
    constexpr int NT = MMA_BK / 8;            // key tiles of 8 in S
    constexpr int KS = D / 16;                // k-steps of Q K^T
    constexpr int DT = D / 8;                 // output column tiles of 8
    constexpr int CPR = D / 8;                // 16-byte chunks per row
    constexpr int MST = MMA_BK + 8;           // shared mask row stride in halves
    constexpr int MCP = MMA_BQ * (MMA_BK / 8) / MMA_THREADS;  // mask chunks a thread copies
    extern __shared__ float4 smem4[];
    u16* Qs = (u16*)smem4;                    // [MMA_BQ][ST]
    u16* Ks = Qs + MMA_BQ * ST;               // [2][MMA_BK][ST]
    u16* Vs = Ks + 2 * MMA_BK * ST;           // [2][MMA_BK][ST]
    u16* Ms = Vs + 2 * MMA_BK * ST;           // [2][MMA_BQ][MST]: f16 mask tiles (i[7])
    __shared__ int range[2];

    const TArg& dst = p.t[0];
    const TArg& q = p.t[1];
    const TArg& k = p.t[2];
    const TArg& v = p.t[3];
    const TArg& mask = p.t[4];
    const int mtype = p.i[4];
    const int heads = (int)q.ne[2], kv_heads = (int)k.ne[2];
    const int gqa = heads / kv_heads;
    const i64 nq = q.ne[1], nkv = k.ne[1];
    const i64 rows = nq * gqa;
    const int g = blockIdx.y % kv_heads;
    const i64 b = blockIdx.y / kv_heads;
    const i64 bk = b / (q.ne[3] / k.ne[3]);
    const int nsplit = p.i[2], split = blockIdx.z;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int gr = lane / 4, qd = lane % 4;
    const i64 r0 = (i64)blockIdx.x * MMA_BQ;
    const i64 rlast = min(rows, r0 + MMA_BQ) - 1;

    // Q rows of the block, loaded first (their latency overlaps the mask scan and the first
    // K and V tile); stored scaled (to log2 units unless softcapped) as f16 below.
    constexpr int QI = MMA_BQ * D / 2 / MMA_THREADS;
    float2 qv[QI];
#pragma unroll
    for (int i = 0; i < QI; i++) {
        const int idx = tid + i * MMA_THREADS;
        const int rr = idx / (D / 2), d2 = (idx - rr * (D / 2)) * 2;
        const i64 r = r0 + rr;
        qv[i] = make_float2(0.0f, 0.0f);
        if (r < rows) {
            const char* qp = at(q, d2, r / gqa, g * gqa + (int)(r % gqa), b);
            qv[i] = make_float2(F32::load(qp), F32::load(qp + q.nb[0]));
        }
    }

    // The tiles of this split, narrowed to those where some row of the block has a mask
    // value other than -inf.
    const int ntiles = (int)((nkv + MMA_BK - 1) / MMA_BK);
    const int per = (ntiles + nsplit - 1) / nsplit;
    int t0 = min(ntiles, split * per), t1 = min(ntiles, t0 + per);
    if (mtype) {
        if (tid == 0) {
            range[0] = 0x7fffffff;
            range[1] = -1;
        }
        __syncthreads();
        // Rows of the block with distinct mask rows: per query when the mask ignores heads.
        const bool by_q = mask.ne[2] == 1;
        const i64 sr0 = by_q ? r0 / gqa : r0;
        const int nsr = (int)((by_q ? rlast / gqa : rlast) - sr0 + 1);
        const i64 key0 = (i64)t0 * MMA_BK, key1 = min(nkv, (i64)t1 * MMA_BK);
        const int unit = p.i[7] ? 8 : 1;
        const i64 units = (key1 - key0 + unit - 1) / unit;
        i64 lo = 0x7fffffffffffll, hi = -1;
#pragma unroll 4
        for (i64 idx = tid; idx < nsr * units; idx += MMA_THREADS) {
            const int sr = (int)(idx / units);
            const i64 c = key0 + (idx - (i64)sr * units) * unit;
            const i64 r = by_q ? (sr0 + sr) * gqa : sr0 + sr;
            const char* mp = at(mask, c, r / gqa, bcast(g * gqa + r % gqa, mask.ne[2]), bcast(b, mask.ne[3]));
            bool any;
            if (unit == 8) {
                const uint4 u = *(const uint4*)mp;
                any = !(h_neg_inf(u.x) && h_neg_inf(u.x >> 16) && h_neg_inf(u.y) && h_neg_inf(u.y >> 16) &&
                        h_neg_inf(u.z) && h_neg_inf(u.z >> 16) && h_neg_inf(u.w) && h_neg_inf(u.w >> 16));
            } else {
                any = (mtype == 1 ? F32::load(mp) : F16::load(mp)) != NEG_INF;
            }
            if (any) {
                lo = min(lo, c);
                hi = max(hi, c);
            }
        }
        if (hi >= 0) {
            atomicMin(&range[0], (int)(lo / MMA_BK));
            atomicMax(&range[1], (int)(hi / MMA_BK));
        }
        __syncthreads();
        t0 = max(t0, range[0]);
        t1 = min(t1, range[1] + 1);
    }

    // f16 masks with rows on 16 bytes come through shared memory with K and V: the mask rows
    // of the block rows this thread copies (rows tid / 8 + 16 i, chunk tid % 8).
    const bool msm = mtype == 2 && p.i[7];
    const char* mcp[MCP];
#pragma unroll
    for (int i = 0; i < MCP; i++) {
        const i64 r = min(rows - 1, r0 + tid / 8 + 16 * i);
        mcp[i] = msm ? at(mask, 0, r / gqa, bcast(g * gqa + r % gqa, mask.ne[2]), bcast(b, mask.ne[3])) : nullptr;
    }

    // K and V tile t (and the mask tile) into buffer buf.
    auto load_kv = [&](int t, int buf) {
        const i64 c0 = (i64)t * MMA_BK;
        u16* kd = Ks + buf * MMA_BK * ST;
        u16* vd = Vs + buf * MMA_BK * ST;
#pragma unroll
        for (int i = 0; i < MMA_BK * CPR / MMA_THREADS; i++) {
            const int idx = tid + i * MMA_THREADS;
            const int rr = idx / CPR, ch = idx % CPR;
            const i64 c = c0 + rr;
            const bool ok = c < nkv;
            const i64 cs = ok ? c : 0;
            cp16(smem_u32(kd + rr * ST + 8 * ch), at(k, 8 * ch, cs, g, bk), ok);
            cp16(smem_u32(vd + rr * ST + 8 * ch), at(v, 8 * ch, cs, g, bk), ok);
        }
        if (msm) {
            u16* md = Ms + buf * MMA_BQ * MST;
#pragma unroll
            for (int i = 0; i < MCP; i++) {
                const int rr = tid / 8 + 16 * i, ch = tid % 8;
                const i64 c = c0 + 8 * ch;
                const bool ok = c < nkv;
                cp16(smem_u32(md + rr * MST + 8 * ch), mcp[i] + (ok ? c : 0) * 2, ok);
            }
        }
    };
    if (t0 < t1) load_kv(t0, 0);
    cp_commit();

    const float qscale = CAP ? p.f[0] : p.f[0] * LOG2E;
#pragma unroll
    for (int i = 0; i < QI; i++) {
        const int idx = tid + i * MMA_THREADS;
        const int rr = idx / (D / 2), d2 = (idx - rr * (D / 2)) * 2;
        *(u32*)(Qs + rr * ST + d2) = pack_h2(qv[i].x * qscale, qv[i].y * qscale);
    }
    __syncthreads();
    u32 qf[KS][4];
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        const int rr = warp * 16 + lane % 8 + 8 * ((lane / 8) % 2);
        ldsm4(smem_u32(Qs + rr * ST + 16 * ks + 8 * (lane / 16)), qf[ks]);
    }

    // This thread's two rows (gr and gr + 8 of the warp's 16).
    i64 iq[2];
    int hh[2];
    float slope[2];
    const char* mrow[2];
#pragma unroll
    for (int j = 0; j < 2; j++) {
        i64 r = r0 + warp * 16 + gr + 8 * j;
        r = min(r, rows - 1);
        iq[j] = r / gqa;
        hh[j] = g * gqa + (int)(r % gqa);
        slope[j] = alibi_slope(p, hh[j]) * LOG2E;
        mrow[j] = mtype ? at(mask, 0, iq[j], bcast(hh[j], mask.ne[2]), bcast(b, mask.ne[3])) : nullptr;
    }
    const float cap = p.f[1] * LOG2E;
    const bool pairs = p.i[6] != 0;

    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
    float o[DT][4];
#pragma unroll
    for (int i = 0; i < DT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;

    for (int t = t0; t < t1; t++) {
        const int buf = (t - t0) & 1;
        const i64 c0 = (i64)t * MMA_BK;
        // The mask values of this tile (log2 units, slope applied), loaded before waiting
        // unless they come through shared memory: without a softcap they start the sums of S.
        float mk[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const i64 c = c0 + 8 * nt + 2 * qd;
#pragma unroll
            for (int j = 0; j < 2; j++) {
                float2 x = make_float2(0.0f, 0.0f);
                if (msm) {
                } else if (mtype) {
                    x = mask_pair(mrow[j], mask, mtype, pairs, c, nkv);
                } else {
                    x.x = c < nkv ? 0.0f : NEG_INF;
                    x.y = c + 1 < nkv ? 0.0f : NEG_INF;
                }
                mk[nt][2 * j] = x.x * slope[j];
                mk[nt][2 * j + 1] = x.y * slope[j];
            }
        }
        if (t + 1 < t1) {
            load_kv(t + 1, buf ^ 1);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        const u16* kt = Ks + buf * MMA_BK * ST;
        const u16* vt = Vs + buf * MMA_BK * ST;
        if (msm) {
            const u16* mt = Ms + buf * MMA_BQ * MST;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int cc = 8 * nt + 2 * qd;
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const u32 u = *(const u32*)(mt + (warp * 16 + gr + 8 * j) * MST + cc);
                    mk[nt][2 * j] = c0 + cc < nkv ? h2f((u16)u) * slope[j] : NEG_INF;
                    mk[nt][2 * j + 1] = c0 + cc + 1 < nkv ? h2f((u16)(u >> 16)) * slope[j] : NEG_INF;
                }
            }
        }

        // S = Q K^T (+ mask), in log2 units.
        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) s[nt][e] = CAP ? 0.0f : mk[nt][e];
#pragma unroll
            for (int ks2 = 0; ks2 < KS / 2; ks2++) {
                u32 bfr[4];
                ldsm4(smem_u32(kt + (8 * nt + lane % 8) * ST + 32 * ks2 + 8 * (lane / 8)), bfr);
                mma16816(s[nt], qf[2 * ks2], bfr[0], bfr[1]);
                mma16816(s[nt], qf[2 * ks2 + 1], bfr[2], bfr[3]);
            }
        }
        // Softcap, mask, online softmax (rows gr: elements 0 and 1, gr + 8: 2 and 3).
        float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if (CAP) s[nt][e] = tanhf(s[nt][e]) * cap + mk[nt][e];
                mx[e / 2] = fmaxf(mx[e / 2], s[nt][e]);
            }
        }
        float alpha[2];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 1));
            mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 2));
            const float mn = fmaxf(m[j], mx[j]);
            alpha[j] = m[j] == NEG_INF ? 0.0f : fast_exp2(m[j] - mn);
            m[j] = mn;
            l[j] *= alpha[j];
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float mn = m[e / 2];
                const float pe = mn == NEG_INF ? 0.0f : fast_exp2(s[nt][e] - mn);
                s[nt][e] = pe;
                l[e / 2] += pe;
            }
        }
#pragma unroll
        for (int i = 0; i < DT; i++) {
            o[i][0] *= alpha[0];
            o[i][1] *= alpha[0];
            o[i][2] *= alpha[1];
            o[i][3] *= alpha[1];
        }
        // O += P V.
#pragma unroll
        for (int kk = 0; kk < MMA_BK / 16; kk++) {
            const u32 a[4] = {pack_h2(s[2 * kk][0], s[2 * kk][1]), pack_h2(s[2 * kk][2], s[2 * kk][3]),
                              pack_h2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_h2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int nd2 = 0; nd2 < DT / 2; nd2++) {
                u32 bfr[4];
                ldsm4t(smem_u32(vt + (16 * kk + lane % 8 + 8 * ((lane / 8) % 2)) * ST + 16 * nd2 + 8 * (lane / 16)),
                       bfr);
                mma16816(o[2 * nd2], a, bfr[0], bfr[1]);
                mma16816(o[2 * nd2 + 1], a, bfr[2], bfr[3]);
            }
        }
        __syncthreads();
    }

    // Row sums over the four lanes of each row, then the output or this split's partials.
#pragma unroll
    for (int j = 0; j < 2; j++) {
        l[j] += __shfl_xor_sync(0xffffffffu, l[j], 1);
        l[j] += __shfl_xor_sync(0xffffffffu, l[j], 2);
    }
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const i64 r = r0 + warp * 16 + gr + 8 * j;
        if (r >= rows) continue;
        if (nsplit == 1) {
            const float inv = l[j] == 0.0f ? 0.0f : 1.0f / l[j];
#pragma unroll
            for (int i = 0; i < DT; i++) {
                float2 x = make_float2(o[i][2 * j] * inv, o[i][2 * j + 1] * inv);
                *(float2*)at(dst, 8 * i + 2 * qd, hh[j], iq[j], b) = x;
            }
        } else {
            const i64 row = (b * kv_heads + g) * rows + r;
            float* part = (float*)p.aux[0] + (row * nsplit + split) * (D + 2);
            if (qd == 0) {
                part[0] = m[j] == NEG_INF ? NEG_INF : m[j] * (1.0f / LOG2E);
                part[1] = l[j];
            }
#pragma unroll
            for (int i = 0; i < DT; i++) {
                part[2 + 8 * i + 2 * qd] = o[i][2 * j];
                part[2 + 8 * i + 2 * qd + 1] = o[i][2 * j + 1];
            }
        }
    }
}

KERNEL __launch_bounds__(MMA_THREADS) fattn_mma64(const KParams p) { pdl_wait(); fattn_mma<64, false>(p); }
KERNEL __launch_bounds__(MMA_THREADS) fattn_mma128(const KParams p) { pdl_wait(); fattn_mma<128, false>(p); }
KERNEL __launch_bounds__(MMA_THREADS) fattn_mma64_cap(const KParams p) { pdl_wait(); fattn_mma<64, true>(p); }
KERNEL __launch_bounds__(MMA_THREADS) fattn_mma128_cap(const KParams p) { pdl_wait(); fattn_mma<128, true>(p); }

// One block of 256 threads per query row (in the partials' order), nsplit <= 256: the splits'
// weights are found in parallel, then each column is summed over the splits by 256 / dv
// threads (each a share of the splits) and their sums added through shared memory.
// t[0] dst, t[1] q, t[2] k, t[3] v as above; aux[1], aux[2] the quantized output when set.
KERNEL fattn_combine(const KParams p) {
    pdl_wait();
    __shared__ float wts[256];
    __shared__ float red[256];
    const TArg& q = p.t[1];
    const TArg& k = p.t[2];
    const TArg& v = p.t[3];
    const int DV = (int)v.ne[0];
    const int heads = (int)q.ne[2], kv_heads = (int)k.ne[2];
    const int gqa = heads / kv_heads;
    const i64 rows = q.ne[1] * gqa;
    const int nsplit = p.i[2];
    const i64 row = blockIdx.x;
    const i64 r = row % rows;
    const int g = (int)((row / rows) % kv_heads);
    const i64 b = row / rows / kv_heads;
    const i64 iq = r / gqa;
    const int h = g * gqa + (int)(r % gqa);
    const float* part = (const float*)p.aux[0] + row * nsplit * (DV + 2);
    const int s = threadIdx.x;
    const float ms = s < nsplit ? part[s * (DV + 2)] : NEG_INF;
    const float ls = s < nsplit ? part[s * (DV + 2) + 1] : 0.0f;
    const float mx = block_max(ms);
    const float wv = (s < nsplit && ms != NEG_INF) ? expf(ms - mx) : 0.0f;
    wts[s] = wv;
    const float total = block_sum(wv * ls);
    const float inv = total == 0.0f ? 0.0f : 1.0f / total;
    const int groups = (int)blockDim.x / DV, col = s % DV, grp = s / DV;
    float acc = 0.0f;
    if (grp < groups) {
#pragma unroll 8
        for (int i = grp; i < nsplit; i += groups) acc += wts[i] * part[i * (DV + 2) + 2 + col];
    }
    red[s] = acc;
    __syncthreads();
    if (s < DV) {
        float sum = 0.0f;
        for (int j = 0; j < groups; j++) sum += red[j * DV + s];
        store_out(p, sum * inv, s, h, iq, b);
    }
}
