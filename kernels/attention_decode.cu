// flash_attn_ext for decoding (a few query rows per KV head); parameters in attention.cuh.
//
// fattn_vec_<k>_<v>: at most VEC_ROWS query rows per KV head (one token's heads), K and V rows
// aligned to four elements, dv a power of two from 8 to 256. A block of 256 threads takes one KV
// head and one split of at most 1024 keys (the host splits longer ranges): each thread scores
// whole keys against every row (scores kept in shared memory), one warp per row takes the
// softmax, then groups of dv / 8 lanes (8 columns a lane) sum probability times V over their
// share of the keys; the groups of a warp are added by shuffles, the warps through shared
// memory. The K and V rows of keys the mask hides from every row are not read. Split, the
// partials go to fattn_combine.
//
// fattn_dec<D>_<rows>: f16 K and V, d == dv (64, 128 or 256), at most `rows` (4 or 8) query rows
// per KV head, K and V rows aligned to 16 bytes. A block of 4 warps takes one KV head and one
// split of the keys (the host makes splits short, so that short caches still fill the GPU), in
// chunks of 8 passes (skipping the chunks where the mask is -inf for every row of the block:
// another sequence's pages of a shared KV cache, a causal prompt's future; see dec_shown): in a
// pass, each group of d / 8 lanes reads one K row and one V row (16
// bytes a lane, coalesced), all loads of a chunk issued before any is used. Scores are reduced
// within the group, the online softmax runs one warp per row, and each lane keeps 8 output
// columns of every row for its keys; groups and warps are summed at the end. Split, it writes
// partials; with aux[3] != 0 (a zeroed u32 counter per (KV head, batch), grid y, which the
// kernel leaves at zero) the last block of each KV head to finish also merges them (no
// fattn_combine launch); with i[3] = 1 (on sm_90 for at most 8 splits) the splits of a KV head
// are one thread-block cluster instead (launched so): each block keeps its partials in its
// shared memory, and after a cluster barrier every block merges a slice of the results through
// distributed shared memory (no partials in global memory, no fences, no counters).
#include "attention.cuh"

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

    // Scores: one key per thread at a time, against every row; a key the mask hides from
    // every row scores -inf without its K row being read.
    for (int c = tid; c < kvn; c += blockDim.x) {
        float mv[VEC_ROWS];
        bool shown = !mask_type;
#pragma unroll
        for (int r = 0; r < VEC_ROWS; r++) {
            mv[r] = 0.0f;
            if (mask_type && r < R) {
                const char* mp = at(mask, kv0 + c, iqs[r], bcast(hs[r], mask.ne[2]), bcast(b, mask.ne[3]));
                mv[r] = mask_type == 1 ? F32::load(mp) : F16::load(mp);
                shown |= mv[r] != NEG_INF;
            }
        }
        if (!shown) {
#pragma unroll
            for (int r = 0; r < VEC_ROWS; r++)
                if (r < R) S[r * per_split + c] = NEG_INF;
            continue;
        }
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
            if (mask_type) s += slope[r] * mv[r];
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
        // A key of probability 0 in every row (hidden by the mask) adds nothing: its V row is
        // not read.
        bool used = false;
#pragma unroll
        for (int r = 0; r < VEC_ROWS; r++)
            if (r < R) used |= S[r * per_split + c] != 0.0f;
        if (!used) continue;
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
            const int h = g * gqa + r % gqa;
            F32::store(at(dst, col, h, r / gqa, b), o * softmax_end(p, h, ML[2 * r], l));
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

// ---- fattn_dec ----

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

#define DEC_WARPS 4
#define DEC_PASSES 8
#define DEC_VIS_WORDS 32  // words of fattn_dec's shown-chunk bitmap (chunks of a split it holds / 32)

// Marks in vis (DEC_VIS_WORDS words in shared memory, bit i for chunk i of ch keys from kv0)
// the chunks of keys [kv0, kv1) where some of the R query rows of (KV head g, batch b) has a
// mask value other than -inf (every chunk past the bitmap counts as shown). Every thread of
// the block calls it; a skipped chunk would add nothing (its scores are -inf, so the row
// maxima, sums and outputs keep their values). With i[7] (f16 mask rows on 16 bytes, nkv a
// multiple of 8; kv0 is a multiple of ch, itself of 8) the mask is read 8 values a load.
__device__ void dec_shown(const KParams& p, u32* vis, int R, int g, i64 b, i64 kv0, i64 kv1, int ch) {
    const TArg& mask = p.t[4];
    const int gqa = (int)p.t[1].ne[2] / (int)p.t[2].ne[2];
    for (int i = threadIdx.x; i < DEC_VIS_WORDS; i += blockDim.x) vis[i] = 0u;
    __syncthreads();
    // Rows with distinct mask rows: one per query when the mask ignores heads.
    const bool by_q = mask.ne[2] == 1;
    const int nsr = by_q ? (R + gqa - 1) / gqa : R;
    const int unit = p.i[7] ? 8 : 1;
    const i64 len = (kv1 - kv0 + unit - 1) / unit;
#pragma unroll 4
    for (i64 idx = threadIdx.x; idx < nsr * len; idx += blockDim.x) {
        const int sr = (int)(idx / len);
        const i64 c = kv0 + (idx - (i64)sr * len) * unit;
        const int r = by_q ? sr * gqa : sr;
        const char* mp = at(mask, c, r / gqa, bcast(g * gqa + r % gqa, mask.ne[2]), bcast(b, mask.ne[3]));
        bool any;
        if (unit == 8) {
            const uint4 u = *(const uint4*)mp;
            any = !(h_neg_inf(u.x) && h_neg_inf(u.x >> 16) && h_neg_inf(u.y) && h_neg_inf(u.y >> 16) &&
                    h_neg_inf(u.z) && h_neg_inf(u.z >> 16) && h_neg_inf(u.w) && h_neg_inf(u.w >> 16));
        } else {
            any = (p.i[4] == 1 ? F32::load(mp) : F16::load(mp)) != NEG_INF;
        }
        if (any) {
            const int ci = (int)((c - kv0) / ch);
            if (ci < DEC_VIS_WORDS * 32 && !(vis[ci / 32] & (1u << (ci % 32)))) atomicOr(&vis[ci / 32], 1u << (ci % 32));
        }
    }
    __syncthreads();
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
        if (lane == 0) CINV[r] = softmax_end(p, g * gqa + r % gqa, mx, tot);
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
        if (lane == 0) INV[r] = softmax_end(p, g * gqa + r % gqa, mx, tot);
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
    __shared__ u32 VIS[DEC_VIS_WORDS];        // the chunks some row sees (dec_shown)

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
    // Whole chunks per split (the last splits may be empty), so that the chunks of every split
    // line up with the keys' multiples of CH (a paged cache's pages are whole chunks).
    const i64 per_split = ((nkv + nsplit - 1) / nsplit + CH - 1) / CH * CH;
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
    if (p.i[4]) dec_shown(p, VIS, R, g, b, kv0, kv1, CH);
    // The first chunk from c on that some row sees (kv1 when none).
    auto next_chunk = [&](i64 c) {
        if (!p.i[4]) return c;
        for (; c < kv1; c += CH) {
            const int ci = (int)((c - kv0) / CH);
            if (ci >= DEC_VIS_WORDS * 32 || (VIS[ci / 32] >> (ci % 32)) & 1u) break;
        }
        return min(c, kv1);
    };
    i64 c0 = next_chunk(kv0);
    if (c0 < kv1) {
        load_rows(kr, kbase, k.nb[1], c0);
        load_rows(vr, vbase, v.nb[1], c0);
        load_mask(c0);
    }
    while (c0 < kv1) {
        const i64 cn = next_chunk(c0 + CH);
        const bool more = cn < kv1;

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
        if (more) load_rows(kr, kbase, k.nb[1], cn);
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
        if (more) load_mask(cn);
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
        if (more) load_rows(vr, vbase, v.nb[1], cn);
        __syncthreads();
        c0 = cn;
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
            const int h = g * gqa + r % gqa;
            store_out(p, o * softmax_end(p, h, ML[r][0], sum), col, h, r / gqa, b);
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
