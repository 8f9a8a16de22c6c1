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
#include "common.cuh"

#define KTILE 32
#define MAXDV 256

// Four consecutive elements of a K or V row (aligned to four elements) as floats.
template <class T> __device__ __forceinline__ float4 load4(const char* p);
template <> __device__ __forceinline__ float4 load4<F32>(const char* p) { return *(const float4*)p; }
template <> __device__ __forceinline__ float4 load4<F16>(const char* p) {
    const uint2 u = *(const uint2*)p;
    return make_float4(h2f((u16)u.x), h2f((u16)(u.x >> 16)), h2f((u16)u.y), h2f((u16)(u.y >> 16)));
}

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
    KERNEL fattn_##nk##_##nv##_1(const KParams p) { fattn<K, V, 1>(p); }                   \
    KERNEL fattn_##nk##_##nv##_2(const KParams p) { fattn<K, V, 2>(p); }                   \
    KERNEL fattn_##nk##_##nv##_4(const KParams p) { fattn<K, V, 4>(p); }
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

KERNEL fattn_vec_f32_f32(const KParams p) { fattn_vec<F32, F32>(p); }
KERNEL fattn_vec_f32_f16(const KParams p) { fattn_vec<F32, F16>(p); }
KERNEL fattn_vec_f16_f32(const KParams p) { fattn_vec<F16, F32>(p); }
KERNEL fattn_vec_f16_f16(const KParams p) { fattn_vec<F16, F16>(p); }

// One block of 256 threads per query row (in the partials' order), nsplit <= 256: the splits'
// weights are found in parallel, then each thread sums its output columns over the splits.
// t[0] dst, t[1] q, t[2] k, t[3] v as above.
KERNEL fattn_combine(const KParams p) {
    __shared__ float wts[256];
    const TArg& dst = p.t[0];
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
    const float mx = block_max(ms);
    const float wv = (s < nsplit && ms != NEG_INF) ? expf(ms - mx) : 0.0f;
    if (s < 256) wts[s] = wv;
    const float total = block_sum(s < nsplit ? wv * part[s * (DV + 2) + 1] : 0.0f);
    const float inv = total == 0.0f ? 0.0f : 1.0f / total;
    for (int col = threadIdx.x; col < DV; col += blockDim.x) {
        float acc = 0.0f;
#pragma unroll 4
        for (int i = 0; i < nsplit; i++) acc += wts[i] * part[i * (DV + 2) + 2 + col];
        F32::store(at(dst, col, h, iq, b), acc * inv);
    }
}
