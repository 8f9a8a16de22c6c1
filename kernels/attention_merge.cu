// flash_attn_ext's merge of split partials (parameters in attention.cuh): fattn_combine, after
// any kernel that wrote partials without merging them.
#include "attention.cuh"

// One block of 256 threads per query row (in the partials' order), nsplit <= 256: the splits'
// weights are found in parallel, then each column is summed over the splits by 256 / dv
// threads (each a share of the splits) and their sums added through shared memory.
// t[0] dst, t[1] q, t[2] k, t[3] v as in attention.cuh; aux[1], aux[2] the quantized output when
// set.
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
    const float inv = softmax_end(p, h, mx, total);
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
