// Shared by the flash_attn_ext kernels (attention_prompt.cu, attention_decode.cu,
// attention_merge.cu): softmax(q k^T * scale [softcapped] + slope * mask) v, without
// materialising the scores.
//
// Every kernel takes the same parameters: t[0] dst f32 [dv, heads, nq, b] (contiguous), t[1] q
// f32 [d, nq, heads, b], t[2] k [d, nkv, kv_heads, bk], t[3] v [dv, nkv, kv_heads, bk] (f32 or
// f16, any strides), t[4] mask [nkv, >= nq, m2, m3] (i[4]: 0 none, 1 f32, 2 f16; dims 2-3
// broadcast by modulo). f[0] scale (already divided by the softcap when one is set), f[1]
// softcap (0: none), f[2] m0, f[3] m1, i[0] n_head_log2, i[1] ALiBi on; i[2] number of KV
// splits; i[5] = 1 when K and V rows are aligned to four elements (loaded four at a time); t[5]
// the sinks, f32 [heads] (address 0: none), one logit per query head that joins each row's
// soft-max where the row's sum ends (softmax_end) and weighs no value. d and
// dv are multiples of 4. The query rows of one KV head are nq * gqa rows: query i of head
// g*gqa + j is row i*gqa + j. Split, a kernel writes (max, sum, unnormalised output) per row and
// split to aux[0], and fattn_combine (attention_merge.cu) merges them, unless the kernel merges
// them itself.
//
// Quantized output (fattn_dec, and fattn_combine after any kernel): with aux[1] != 0 (dst
// contiguous, dv a multiple of 32) the kernel that writes the final result also writes it as
// q8_1 blocks, in the layout quantize_q8_1_f32 (mmvq.cu) writes for dst's flat values: block j
// (values 32 j .. 32 j + 31, within one head) has its int8 at aux[1] + 32 j and (d, d * sum) at
// aux[2] + 8 j. The o projection that reads the result next then skips its quantize kernel.
#include "common.cuh"

// Four consecutive elements of a K or V row (aligned to four elements) as floats.
template <class T> __device__ __forceinline__ float4 load4(const char* p);
template <> __device__ __forceinline__ float4 load4<F32>(const char* p) { return *(const float4*)p; }
template <> __device__ __forceinline__ float4 load4<F16>(const char* p) { return unpack4_f16(*(const uint2*)p); }

__device__ __forceinline__ float alibi_slope(const KParams& p, int h) {
    if (!p.i[1]) return 1.0f;
    const int nl = p.i[0];
    return h < nl ? powf(p.f[2], (float)(h + 1)) : powf(p.f[3], (float)(2 * (h - nl) + 1));
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

// The factor that ends a row's soft-max on its unnormalised output: 1 / s, or with sinks (t[5])
// head h's sink joined as one more logit with no value. mx is the row's largest score in natural
// units (NEG_INF when every key was masked) and s its sum of exp(score - mx).
__device__ __forceinline__ float softmax_end(const KParams& p, int h, float mx, float s) {
    if (p.t[5].ptr == 0) return s == 0.0f ? 0.0f : 1.0f / s;
    const float sk = ((const float*)p.t[5].ptr)[h];
    const float top = fmaxf(mx, sk);
    const float c = mx == NEG_INF ? 0.0f : expf(mx - top);
    return c / (s * c + expf(sk - top));
}

// Whether an f16 mask value (its bits, in the low half) is -inf.
__device__ __forceinline__ bool h_neg_inf(u32 h) { return (h & 0xffffu) == 0xfc00u; }
