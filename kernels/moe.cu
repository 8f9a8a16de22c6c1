// The mixture-of-experts ops: mul_mat_id, add_id, argsort and top_k.
//
// mul_mat_id_<w>_<b>: t[0] f32 dst [m, n_used, n_tokens], t[1] experts [k, m, n_expert] of type
// <w> (rows contiguous), t[2] rows [k, n_b, n_tokens] of type <b>, t[3] i32 ids
// [n_used, n_tokens]: dst[i, e, t] = experts[:, i, ids[e, t] - i[0]] . rows[:, e % n_b, t]
// (i[0]: the id of the first expert t[1] holds). One warp per result; grid (m / warps per
// block, n_used, n_tokens). An expert t[1] does not hold gives 0.
// add_id_f32: t[0] dst [n, n_used, n_tokens], t[1] a (same shape), t[2] rows [n, n_rows],
// t[3] i32 ids [n_used, n_tokens]: dst[i, e, t] = a[i, e, t] + rows[i, ids[e, t]] (an id out of
// range adds 0).
// mmid_bucket: the (slot, token) pairs y = e + n_used t of mul_mat_id grouped by expert for
// mmq_id (mmvq.cu), in one block: t[1] the i32 ids [n_used, n_tokens]; i[0] the id of the first
// expert the weights hold, i[1] how many they hold (X), i[2] the columns of a tile (W), i[3] the
// tile table's entries (T, at least ceil(pairs / W) + min(X + 1, pairs)), i[4] n_b (the rows
// per token of mul_mat_id's src1). Bucket x < X takes the pairs routed to the weights' expert
// x, bucket X those routed to experts they do not hold. aux[0] gets the pairs bucket after
// bucket as i32 pairs (t n_b + e % n_b: the src1 row the pair reads, counted over every token;
// y), n_used n_tokens of them, within a bucket in no set order (which mmq_id's results do not
// depend on); aux[1] the tile table: T entries of three
// i32 (the expert, -1 for bucket X; the entry's first pair in aux[0]; its pairs, 1 to W), one
// per W pairs of each bucket in bucket order, and (0, 0, 0) past the last. Dynamic shared
// memory: 3 (X + 1) i32.
// sort_f32: one block per row of t[1] (f32, at most i[1] values padded to the power of two
// i[1], in dynamic shared memory); t[0] i32 [k, rows...] gets the first k indices of the row in
// order: largest first when i[0] is 1, smallest first otherwise; NaNs last, equal values in
// index order (a stable order, as the CPU's).
// moe_router: a MoE router's selection, one warp per token (blocks of ROUTER_WARPS warps): t[1]
// the scores [n_expert, n] (f32, at most 1024 a token), t[0] the weights (f32, n_used a token
// at strides t[0].nb[0], nb[1]), t[2] the ids (i32 [n_used, n], at most 32 a token). With i[0]
// set the scores are first soft_max(scores * f[0]) over the experts (as soft_max_f32 computes
// it). The n_used largest scores are selected in top_k's order (largest first, NaNs last, equal
// values in index order, as sort_f32), their ids stored, and their scores normalized by i[1]:
// 0 as they are, 1 soft_max(s * f[1]) over the selected, 2 s / clamp(sum(s), f[2], f[3]).
// Dynamic shared memory: n_expert f32 a warp.
// moe_weighted_sum: t[0] out [d, n] (f32), t[1] the experts' outputs [d, n_used, n] (f32),
// t[2] the weights [1, n_used, n] (f32), t[3] a residual [d, n] (f32) when i[0] is set:
// out[:, t] = (residual) + sum_e w[e, t] down[:, e, t], the slots added in order. One thread an
// output; grid (d / threads, n).
#include "quant.cuh"
#include "quant_k.cuh"

template <class W, class B> __device__ void mmid_float(const KParams& p) {
    const TArg& d = p.t[0];
    const TArg& a = p.t[1];
    const TArg& b = p.t[2];
    const int lane = threadIdx.x % 32;
    const i64 i = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const i64 e = blockIdx.y, t = blockIdx.z;
    if (i >= d.ne[0]) return;
    const int x = *(const int*)at(p.t[3], e, t, 0, 0) - p.i[0];
    float acc = 0.0f;
    if (x >= 0 && x < a.ne[2]) {
        const char* w = at(a, 0, i, x, 0);
        const char* y = at(b, 0, e % b.ne[1], t, 0);
        for (i64 j = lane; j < a.ne[0]; j += 32) acc += W::load(w + j * a.nb[0]) * B::load(y + j * b.nb[0]);
    }
    acc = warp_sum(acc);
    if (lane == 0) F32::store(at(d, i, e, t, 0), acc);
}

// Each lane dequantizes 32-value groups of the expert's row in turn.
template <int Q, class B> __device__ void mmid_quant(const KParams& p) {
    const TArg& d = p.t[0];
    const TArg& a = p.t[1];
    const TArg& b = p.t[2];
    const int lane = threadIdx.x % 32;
    const i64 i = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const i64 e = blockIdx.y, t = blockIdx.z;
    if (i >= d.ne[0]) return;
    const int x = *(const int*)at(p.t[3], e, t, 0, 0) - p.i[0];
    float acc = 0.0f;
    if (x >= 0 && x < a.ne[2]) {
        const u8* w = (const u8*)at(a, 0, i, x, 0);
        const char* y = at(b, 0, e % b.ne[1], t, 0);
        const int subs = QInfo<Q>::block / 32;
        for (i64 g = lane; g < a.ne[0] / 32; g += 32) {
            float v[32];
            deq32<Q>(w + (g / subs) * QInfo<Q>::bytes, (int)(g % subs), v);
            for (int k = 0; k < 32; k++) acc += v[k] * B::load(y + (32 * g + k) * b.nb[0]);
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) F32::store(at(d, i, e, t, 0), acc);
}

#define MMID_FLOAT(nw, W)                                                                   \
    KERNEL mul_mat_id_##nw##_f32(const KParams p) { pdl_wait(); mmid_float<W, F32>(p); } \
    KERNEL mul_mat_id_##nw##_f16(const KParams p) { pdl_wait(); mmid_float<W, F16>(p); }
MMID_FLOAT(f32, F32)
MMID_FLOAT(f16, F16)
MMID_FLOAT(bf16, BF16)

#define MMID_Q(nq, Q)                                                                       \
    KERNEL mul_mat_id_##nq##_f32(const KParams p) { pdl_wait(); mmid_quant<Q, F32>(p); } \
    KERNEL mul_mat_id_##nq##_f16(const KParams p) { pdl_wait(); mmid_quant<Q, F16>(p); }
MMID_Q(q4_0, Q4_0)
MMID_Q(q4_1, Q4_1)
MMID_Q(q5_0, Q5_0)
MMID_Q(q5_1, Q5_1)
MMID_Q(q8_0, Q8_0)
MMID_Q(q2_K, Q2_K)
MMID_Q(q3_K, Q3_K)
MMID_Q(q4_K, Q4_K)
MMID_Q(q5_K, Q5_K)
MMID_Q(q6_K, Q6_K)

KERNEL add_id_f32(const KParams p) {
    pdl_wait();
    const TArg& d = p.t[0];
    const TArg& b = p.t[2];
    FOR_EACH_ELEMENT(d.ne) {
        const int r = *(const int*)at(p.t[3], i1, i2, 0, 0);
        const float bias = (r >= 0 && r < b.ne[1]) ? F32::load(at(b, i0, r, 0, 0)) : 0.0f;
        F32::store(at(d, i0, i1, i2, i3), F32::load(at(p.t[1], i0, i1, i2, i3)) + bias);
    }
}

KERNEL mmid_bucket(const KParams p) {
    pdl_wait();
    extern __shared__ int mmid_sm[];
    const TArg& ids = p.t[1];
    const int first = p.i[0], X = p.i[1], W = p.i[2], T = p.i[3];
    const int nb = X + 1, n_used = (int)ids.ne[0], pairs = n_used * (int)ids.ne[1];
    int* cnt = mmid_sm;   // pairs per bucket
    int* off = cnt + nb;  // the bucket's first pair in aux[0], then the next free place
    int* til = off + nb;  // the bucket's first tile
    __shared__ int tiles;
    int2* list = (int2*)p.aux[0];
    const int n_b = p.i[4];
    int* table = (int*)p.aux[1];
    auto bucket = [&](int y) {
        const int x = *(const int*)at(ids, y % n_used, y / n_used, 0, 0) - first;
        return x >= 0 && x < X ? x : X;
    };
    for (int b = threadIdx.x; b < nb; b += blockDim.x) cnt[b] = 0;
    __syncthreads();
    for (int y = threadIdx.x; y < pairs; y += blockDim.x) atomicAdd(&cnt[bucket(y)], 1);
    __syncthreads();
    // Exclusive prefix sums of the counts and tiles: each lane of warp 0 a run of buckets.
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x, per = (nb + 31) / 32, b0 = min(nb, lane * per), b1 = min(nb, b0 + per);
        int sp = 0, st = 0;
        for (int b = b0; b < b1; b++) {
            sp += cnt[b];
            st += (cnt[b] + W - 1) / W;
        }
        int ip = sp, it = st;
        for (int o = 1; o < 32; o <<= 1) {
            const int a = __shfl_up_sync(0xFFFFFFFFu, ip, o), c = __shfl_up_sync(0xFFFFFFFFu, it, o);
            if (lane >= o) {
                ip += a;
                it += c;
            }
        }
        if (lane == 31) tiles = it;
        ip -= sp;
        it -= st;
        for (int b = b0; b < b1; b++) {
            off[b] = ip;
            til[b] = it;
            ip += cnt[b];
            it += (cnt[b] + W - 1) / W;
        }
    }
    __syncthreads();
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
        for (int j = 0; j * W < cnt[b]; j++) {
            int* e = table + 3 * (i64)(til[b] + j);
            e[0] = b < X ? b : -1;
            e[1] = off[b] + j * W;
            e[2] = min(W, cnt[b] - j * W);
        }
    }
    for (int j = tiles + threadIdx.x; j < T; j += blockDim.x) {
        int* e = table + 3 * (i64)j;
        e[0] = 0;
        e[1] = 0;
        e[2] = 0;
    }
    __syncthreads();
    for (int y = threadIdx.x; y < pairs; y += blockDim.x) {
        const int e = y % n_used, t = y / n_used;
        list[atomicAdd(&off[bucket(y)], 1)] = make_int2(t * n_b + e % n_b, y);
    }
}

// Whether entry (va, ia) comes before (vb, ib): real entries before padding (index n or more),
// numbers before NaNs, then by value in the order asked, then by index.
__device__ __forceinline__ bool sort_before(float va, int ia, float vb, int ib, int n, bool desc) {
    const bool pa = ia >= n, pb = ib >= n;
    if (pa != pb) return pb;
    const bool na = isnan(va), nb = isnan(vb);
    if (na != nb) return nb;
    if (!na && va != vb) return desc ? va > vb : va < vb;
    return ia < ib;
}

KERNEL sort_f32(const KParams p) {
    pdl_wait();
    extern __shared__ char smem[];
    const TArg& s = p.t[1];
    const TArg& d = p.t[0];
    const int n = (int)s.ne[0], n2 = p.i[1];
    const bool desc = p.i[0] != 0;
    float* v = (float*)smem;
    int* ix = (int*)(v + n2);
    i64 i1, i2, i3;
    split_rows(blockIdx.x, s.ne, i1, i2, i3);
    for (int j = threadIdx.x; j < n2; j += blockDim.x) {
        v[j] = j < n ? F32::load(at(s, j, i1, i2, i3)) : 0.0f;
        ix[j] = j;
    }
    __syncthreads();
    // Bitonic sort of n2 entries: runs of length k merged in passes of stride j.
    for (int k = 2; k <= n2; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int a = threadIdx.x; a < n2; a += blockDim.x) {
                const int b = a ^ j;
                if (b > a) {
                    const bool up = (a & k) == 0;
                    const bool swap = up ? sort_before(v[b], ix[b], v[a], ix[a], n, desc)
                                         : sort_before(v[a], ix[a], v[b], ix[b], n, desc);
                    if (swap) {
                        const float tv = v[a];
                        v[a] = v[b];
                        v[b] = tv;
                        const int ti = ix[a];
                        ix[a] = ix[b];
                        ix[b] = ti;
                    }
                }
            }
            __syncthreads();
        }
    }
    for (int j = threadIdx.x; j < d.ne[0]; j += blockDim.x) *(int*)at(d, j, i1, i2, i3) = ix[j];
}

#define ROUTER_WARPS 4

KERNEL moe_router(const KParams p) {
    pdl_wait();
    extern __shared__ float router_sm[];
    const TArg& w = p.t[0];
    const TArg& s = p.t[1];
    const TArg& ids = p.t[2];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const i64 t = (i64)blockIdx.x * ROUTER_WARPS + warp;
    if (t >= s.ne[1]) return;
    const int n = (int)s.ne[0], k = (int)ids.ne[0];
    float* v = router_sm + (i64)warp * n;
    const char* row = at(s, 0, t, 0, 0);
    for (int j = lane; j < n; j += 32) v[j] = F32::load(row + j * s.nb[0]);
    if (p.i[0]) {
        const float scale = p.f[0];
        float mx = NEG_INF;
        for (int j = lane; j < n; j += 32) mx = fmaxf(mx, v[j] * scale);
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int j = lane; j < n; j += 32) {
            const float e = expf(v[j] * scale - mx);
            v[j] = e;
            sum += e;
        }
        const float inv = 1.0f / warp_sum(sum);
        for (int j = lane; j < n; j += 32) v[j] *= inv;
    }
    __syncwarp();
    // Entry lane + 32 m is this lane's; bit m of `taken` marks it selected.
    unsigned taken = 0;
    int my_id = 0;
    float my_v = 0.0f;
    for (int r = 0; r < k; r++) {
        // The best so far starts as padding (an index past the experts), which every entry
        // comes before in sort_f32's descending order (top_k's).
        float bv = __int_as_float(0x7fc00000);
        int bi = 0x7fffffff;
        for (int j = lane, m = 0; j < n; j += 32, m++) {
            if (!((taken >> m) & 1u) && sort_before(v[j], j, bv, bi, n, true)) {
                bv = v[j];
                bi = j;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (sort_before(ov, oi, bv, bi, n, true)) {
                bv = ov;
                bi = oi;
            }
        }
        if (bi % 32 == lane) taken |= 1u << (bi / 32);
        if (lane == r) {
            my_id = bi;
            my_v = bv;
        }
    }
    const bool mine = lane < k;
    float out = my_v;
    if (p.i[1] == 1) {
        const float x = my_v * p.f[1];
        const float mx = warp_max(mine ? x : NEG_INF);
        const float e = mine ? expf(x - mx) : 0.0f;
        out = e * (1.0f / warp_sum(e));
    } else if (p.i[1] == 2) {
        const float sum = warp_sum(mine ? my_v : 0.0f);
        out = my_v / fminf(fmaxf(sum, p.f[2]), p.f[3]);
    }
    if (mine) {
        *(int*)at(ids, lane, t, 0, 0) = my_id;
        F32::store(at(w, lane, t, 0, 0), out);
    }
}

KERNEL moe_weighted_sum(const KParams p) {
    pdl_wait();
    const TArg& o = p.t[0];
    const TArg& down = p.t[1];
    const TArg& w = p.t[2];
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (i >= o.ne[0]) return;
    const int n_used = (int)down.ne[1];
    float acc = F32::load(at(w, 0, 0, t, 0)) * F32::load(at(down, i, 0, t, 0));
    for (int e = 1; e < n_used; e++) acc += F32::load(at(w, 0, e, t, 0)) * F32::load(at(down, i, e, t, 0));
    if (p.i[0]) acc = F32::load(at(p.t[3], i, t, 0, 0)) + acc;
    F32::store(at(o, i, t, 0, 0), acc);
}
