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
