// Row gathers and scatters: get_rows and set_rows.
//
// get_rows_<type>: t[0] dst [n, m, d2, d3] (f32; i32 for an i32 source), t[1] src
// [n, rows, d2, d3] (rows contiguous), t[2] i32 indices [m, d2, d3]. An index outside the
// source gives a row of zeros.
// set_rows_<type>_<idx>: t[0] dst [n, rows, d2, d3] of <type> (rows contiguous), t[1] f32 src
// [n, m, d2, d3], t[2] indices (i32 or i64) [m, e2, e3] broadcast over dims 2-3 of src.
#include "quant.cuh"
#include "quant_k.cuh"
#include "quant_iq.cuh"

__device__ __forceinline__ i64 gather_row(const KParams& p, i64 i1, i64 i2, i64 i3) {
    const TArg& idx = p.t[2];
    const i64 r = *(const int*)at(idx, i1, i2, i3, 0);
    return (r < 0 || r >= p.t[1].ne[1]) ? -1 : r;
}

template <class S> __device__ void get_rows_float(const KParams& p) {
    const TArg& d = p.t[0];
    const TArg& s = p.t[1];
    FOR_EACH_ELEMENT(d.ne) {
        const i64 r = gather_row(p, i1, i2, i3);
        F32::store(at(d, i0, i1, i2, i3), r < 0 ? 0.0f : S::load(at(s, i0, r, i2, i3)));
    }
}

KERNEL get_rows_f32(const KParams p) { pdl_wait(); get_rows_float<F32>(p); }
KERNEL get_rows_f16(const KParams p) { pdl_wait(); get_rows_float<F16>(p); }
KERNEL get_rows_bf16(const KParams p) { pdl_wait(); get_rows_float<BF16>(p); }

KERNEL get_rows_i32(const KParams p) {
    pdl_wait();
    const TArg& d = p.t[0];
    const TArg& s = p.t[1];
    FOR_EACH_ELEMENT(d.ne) {
        const i64 r = gather_row(p, i1, i2, i3);
        *(int*)at(d, i0, i1, i2, i3) = r < 0 ? 0 : *(const int*)at(s, i0, r, i2, i3);
    }
}

// One thread per 32 values: x walks the 32-value groups of a row.
template <int Q> __device__ void get_rows_quant(const KParams& p) {
    const TArg& d = p.t[0];
    const TArg& s = p.t[1];
    const int subs = QInfo<Q>::block / 32;
    const i64 groups[4] = {d.ne[0] / 32, d.ne[1], d.ne[2], d.ne[3]};
    FOR_EACH_ELEMENT(groups) {
        const i64 r = gather_row(p, i1, i2, i3);
        float x[32];
        if (r < 0) {
            for (int e = 0; e < 32; e++) x[e] = 0.0f;
        } else {
            deq32<Q>((const u8*)at(s, 0, r, i2, i3) + (i0 / subs) * QInfo<Q>::bytes, (int)(i0 % subs), x);
        }
        char* out = at(d, 32 * i0, i1, i2, i3);
        for (int e = 0; e < 32; e++) F32::store(out + e * d.nb[0], x[e]);
    }
}

#define GET_ROWS_Q(nq, Q) \
    KERNEL get_rows_##nq(const KParams p) { pdl_wait(); get_rows_quant<Q>(p); }
GET_ROWS_Q(q4_0, Q4_0)
GET_ROWS_Q(q4_1, Q4_1)
GET_ROWS_Q(q5_0, Q5_0)
GET_ROWS_Q(q5_1, Q5_1)
GET_ROWS_Q(q8_0, Q8_0)
GET_ROWS_Q(q2_K, Q2_K)
GET_ROWS_Q(q3_K, Q3_K)
GET_ROWS_Q(q4_K, Q4_K)
GET_ROWS_Q(q5_K, Q5_K)
GET_ROWS_Q(q6_K, Q6_K)
GET_ROWS_Q(iq2_xxs, IQ2_XXS)
GET_ROWS_Q(iq2_xs, IQ2_XS)
GET_ROWS_Q(iq2_s, IQ2_S)
GET_ROWS_Q(iq3_xxs, IQ3_XXS)
GET_ROWS_Q(iq3_s, IQ3_S)
GET_ROWS_Q(iq1_s, IQ1_S)
GET_ROWS_Q(iq1_m, IQ1_M)
GET_ROWS_Q(iq4_nl, IQ4_NL)
GET_ROWS_Q(iq4_xs, IQ4_XS)
GET_ROWS_Q(tq1_0, TQ1_0)
GET_ROWS_Q(tq2_0, TQ2_0)
GET_ROWS_Q(mxfp4, MXFP4)

// The destination row for source row (i1, i2, i3), or -1 when the index is out of range.
template <class I> __device__ __forceinline__ i64 scatter_row(const KParams& p, i64 i1, i64 i2, i64 i3) {
    const TArg& idx = p.t[2];
    const i64 r = (i64) * (const I*)at(idx, i1, bcast(i2, idx.ne[1]), bcast(i3, idx.ne[2]), 0);
    return (r < 0 || r >= p.t[0].ne[1]) ? -1 : r;
}

template <class D, class I> __device__ void set_rows_float(const KParams& p) {
    const TArg& d = p.t[0];
    const TArg& s = p.t[1];
    FOR_EACH_ELEMENT(s.ne) {
        const i64 r = scatter_row<I>(p, i1, i2, i3);
        if (r >= 0) D::store(at(d, i0, r, i2, i3), F32::load(at(s, i0, i1, i2, i3)));
    }
}

template <int Q, class I> __device__ void set_rows_quant(const KParams& p) {
    const int QK = QInfo<Q>::block;
    const TArg& d = p.t[0];
    const TArg& s = p.t[1];
    const i64 groups[4] = {s.ne[0] / QK, s.ne[1], s.ne[2], s.ne[3]};
    FOR_EACH_ELEMENT(groups) {
        const i64 r = scatter_row<I>(p, i1, i2, i3);
        if (r < 0) continue;
        float x[QK];
        const char* in = at(s, QK * i0, i1, i2, i3);
        #pragma unroll(QK == 32 ? 32 : 1)  // unrolled for a K block (256), ~25 s more compiling a file
        for (int e = 0; e < QK; e++) x[e] = F32::load(in + e * s.nb[0]);
        quant_block<Q>(x, (u8*)at(d, 0, r, i2, i3) + i0 * QInfo<Q>::bytes);
    }
}

#define SET_ROWS_F(nd, D)                                                                  \
    KERNEL set_rows_##nd##_i32(const KParams p) { pdl_wait(); set_rows_float<D, int>(p); } \
    KERNEL set_rows_##nd##_i64(const KParams p) { pdl_wait(); set_rows_float<D, i64>(p); }
SET_ROWS_F(f32, F32)
SET_ROWS_F(f16, F16)
SET_ROWS_F(bf16, BF16)

#define SET_ROWS_Q(nq, Q)                                                                  \
    KERNEL set_rows_##nq##_i32(const KParams p) { pdl_wait(); set_rows_quant<Q, int>(p); } \
    KERNEL set_rows_##nq##_i64(const KParams p) { pdl_wait(); set_rows_quant<Q, i64>(p); }
SET_ROWS_Q(q4_0, Q4_0)
SET_ROWS_Q(q4_1, Q4_1)
SET_ROWS_Q(q5_0, Q5_0)
SET_ROWS_Q(q5_1, Q5_1)
SET_ROWS_Q(q8_0, Q8_0)
SET_ROWS_Q(q2_K, Q2_K)
SET_ROWS_Q(q3_K, Q3_K)
SET_ROWS_Q(q4_K, Q4_K)
SET_ROWS_Q(q5_K, Q5_K)
SET_ROWS_Q(q6_K, Q6_K)
