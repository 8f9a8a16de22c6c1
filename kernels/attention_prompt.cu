// flash_attn_ext for prompts (many query rows per KV head); parameters in attention.cuh.
//
// fattn_<k>_<v>_<rpw>: any head dims, f32 or f16 K and V. The query rows of one KV head are cut
// into tiles of 4 * rpw rows; a block of 4 warps takes one tile, one KV head and one split of
// the KV range, each warp rpw rows. K and V come through shared memory 32 keys at a time (not
// those the mask hides from every row of the block); each
// lane scores one key, the softmax runs online per row, and each lane accumulates dv/32 output
// columns. With one split the block writes the result; with several it writes partials.
//
// fattn_mma<D>: f16 K and V, d == dv (64 or 128), K and V rows aligned to 16 bytes, on tensor
// cores (mma.sync m16n8k16, f16 inputs, f32 sums). A block of 4 warps takes 64 query rows of one
// KV head (each warp 16) and one split of the keys. K and V come in tiles of 64 keys through
// shared memory (cp.async, two buffers: the next tile loads while this one is used); Q (scaled,
// as f16) stays in registers. S = Q K^T and O += P V run on tensor cores, the softmax on S's
// accumulators in registers (P becomes the A operand of P V without leaving them). Tiles where
// the mask is -inf for every row of the block (a causal prompt's future, another sequence's
// pages of a shared KV cache) are skipped: the block first scans its mask rows and marks, in a
// bitmap in shared memory, the tiles where some row has a value other than -inf (the first
// MMA_VIS_WORDS * 32 tiles of its split; later ones count as shown), and visits those only. A
// skipped tile would add nothing: its scores are -inf, so the row maxima, sums and outputs keep
// their values.
#include "attention.cuh"

#define KTILE 32
#define MAXDV 256

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
        // A tile whose keys the mask hides from every row of the block adds nothing (its
        // scores are -inf): it is not loaded. The barrier also guards the tiles' reuse.
        bool shown = mask_type == 0;
#pragma unroll
        for (int j = 0; j < RPW; j++) {
            if (mask_type && valid[j] && c0 + lane < kv1) {
                const char* mp = at(mask, c0 + lane, iqs[j], bcast(hs[j], mask.ne[2]), bcast(b, mask.ne[3]));
                shown |= (mask_type == 1 ? F32::load(mp) : F16::load(mp)) != NEG_INF;
            }
        }
        if (!__syncthreads_or(shown)) continue;
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
            const float inv = softmax_end(p, hs[j], m[j], l[j]);
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

// ---- prompts with f16 K and V on tensor cores (fattn_mma) ----

#define MMA_BQ 64          // query rows per block (16 per warp)
#define MMA_BK 64          // keys per tile
#define MMA_THREADS 128
#define MMA_VIS_WORDS 32   // words of the shown-tile bitmap (tiles of a split it holds / 32)
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
    __shared__ u32 vis[MMA_VIS_WORDS];

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
    const int t00 = t0;
    if (mtype) {
        if (tid == 0) {
            range[0] = 0x7fffffff;
            range[1] = -1;
        }
        for (int i = tid; i < MMA_VIS_WORDS; i += MMA_THREADS) vis[i] = 0u;
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
                const int ti = (int)(c / MMA_BK) - t00;
                if (ti < MMA_VIS_WORDS * 32 && !(vis[ti / 32] & (1u << (ti % 32)))) atomicOr(&vis[ti / 32], 1u << (ti % 32));
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
    // The first tile from t on that some row of the block sees (t1 when none).
    auto next_tile = [&](int t) {
        if (!mtype) return t;
        for (; t < t1; t++) {
            const int ti = t - t00;
            if (ti >= MMA_VIS_WORDS * 32 || (vis[ti / 32] >> (ti % 32)) & 1u) break;
        }
        return t;
    };
    t0 = next_tile(t0);

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

    int buf = 0;
    for (int t = t0; t < t1; buf ^= 1) {
        const int tn = next_tile(t + 1);
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
        if (tn < t1) {
            load_kv(tn, buf ^ 1);
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
        t = tn;
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
            // m is in log2 units here.
            const float mx = m[j] == NEG_INF ? NEG_INF : m[j] * (1.0f / LOG2E);
            const float inv = softmax_end(p, hh[j], mx, l[j]);
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
