// mat_mat (cooperative matrices): the mat-mat of mat_mat.wgsl on adapters with cooperative
// matrices of 16 x 16 x 16 f16 products and f32 sums, and subgroups of 32 (H16 and COOP are
// set: the common prelude enables f16 and the cooperative matrices); tiles of 128 x 64 or 128 x 128, BK = 32; quantized weights, or f16
// weights with A4 and k a multiple of 8): its own loading and tile layout. The tiles are f16
// arrays k-contiguous (ta[m][k], tb[n][k]) with rows of SA = BK + 8 values (the padding puts
// the 8 rows of 16 bytes that a fragment load reads at once on distinct banks), two of each
// (double buffered: one barrier per step). Loading: invocation li takes an 8-value chunk of
// src0 (k offset 8 (li % 4)) of rows li / 4 and li / 4 + 64, and a quad of src1 (k offset
// 4 (li % 8)) of columns li / 8 + 32 p, so that neighbouring invocations read neighbouring
// bytes of a row. A step's loads are issued before the products of the step before and their
// values are turned into f16 and stored after them (`chunk_fetch` loads a chunk's words only:
// a chunk dequantized as it is loaded would stall each step on the loads' latency). Each of the 8 subgroups computes a 16 FM x 32 part of the tile
// (FM = 2 for 128 x 64 tiles, 4 for 128 x 128: FM4) as 2 FM 16 x 16 matrices held in named
// variables (c00 .. c31: no arrays of matrices, which a driver may keep in local memory): A
// fragments read row-major from ta (coopLoadT), B fragments column-major from tb (coopLoad),
// sums in f32. The results go through workgroup memory (tc, one 16 x 16 block a subgroup at a
// time) to dst, so that partial tiles are written with bounds checks.
// MMPAIR (with COOP): two products of the same src1 by unbatched weight matrices of one type
// and row length in one dispatch (a prompt's K and V, or gate and up): the workgroups past
// dst's row tiles take the second matrix's, whose results go to src3 (f32, off4.x; rows
// s3.ne.x). src0 binds memory that holds both matrices, the first u.w bytes from its offset,
// the second (laid out as s2) h.x bytes, so that no load chooses between bindings. One
// dispatch fills the GPU where each product alone would leave a partial wave of workgroups.

#if MMPAIR
// Whether this workgroup's tile is of the second matrix (mat_mat with MMPAIR).
var<private> second: bool;
#endif

// Row stride of the cooperative tiles (f16 values).
const SA: u32 = BK + 8u;
// 16-row fragments along m per subgroup: 2 (32 x 32 parts of 128 x 64 tiles) or 4 (FM4: 64 x
// 32 parts of 128 x 128 tiles).
#if FM4
const FM: u32 = 4u;
#else
const FM: u32 = 2u;
#endif
// Chunks (8 values of a src0 row) and quads (4 values of a src1 column) each invocation loads
// a step.
const CA: u32 = BM * BK / 2048u;
const CB: u32 = BN * BK / 1024u;
var<workgroup> ta: array<f16, 2u * BM * SA>;
var<workgroup> tb: array<f16, 2u * BN * SA>;
var<workgroup> tc: array<f32, 8u * 256u>;

// The words a chunk of src0 (8 values of the row at byte r from k, a multiple of 8) is made
// of, as loaded: `chunk_fetch` only loads them, and `chunk_values` turns them into values
// once the step's products have been issued, so that the loads' latency hides behind them.
// f16 weights (A4) and Q4_0, Q4_1, Q8_0, Q4_K and Q6_K are fetched as words (w, x); the other
// types are dequantized as they are fetched (v).
struct Chunk {
    w: vec4<u32>,
    x: vec2<u32>,
    v: array<vec4<f32>, 2>,
}

fn chunk_fetch(r: u32, k: u32) -> Chunk {
    var c: Chunk;
#if QUANT
    let e = k % 32u;
    switch T0 {
        case 2u: {
            // Q4_0: bytes e % 16 .. + 7 of the nibbles (low nibbles for e < 16), and d.
            let b = r + (k / 32u) * 18u;
            c.w = vec4<u32>(word0(b + 2u + e % 16u), word0(b + 6u + e % 16u), s0w(b >> 2u), 0u);
        }
        case 3u: {
            // Q4_1: d and m, then the nibble bytes as Q4_0's.
            let b = r + (k / 32u) * 20u;
            c.w = vec4<u32>(word0(b + 4u + e % 16u), word0(b + 8u + e % 16u), word0(b), 0u);
        }
        case 8u: {
            // Q8_0: bytes e .. e + 7 of the quants, and d.
            let b = r + (k / 32u) * 34u;
            c.w = vec4<u32>(word0(b + 2u + e), word0(b + 6u + e), s0w(b >> 2u), 0u);
        }
        case 12u: {
            // Q4_K: the nibble bytes of 64-value group e / 64 (low nibbles for its first 32),
            // d and dmin, and the 12 bytes of scales and mins.
            let b = r + (k / 256u) * 144u;
            let f = k % 256u;
            let q = b + 16u + 32u * (f / 64u) + f % 32u;
            c.w = vec4<u32>(word0(q), word0(q + 4u), word0(b), word0(b + 4u));
            c.x = vec2<u32>(word0(b + 8u), word0(b + 12u));
        }
        case 14u: {
            // Q6_K: the low-nibble bytes and the 2-bit bytes of the chunk, the words holding
            // d and the chunk's i8 scale.
            let b = r + (k / 256u) * 210u;
            let f = k % 256u;
            let n = f / 128u;
            let s = (f / 32u) % 4u;
            let lo = b + 64u * n + 32u * (s % 2u) + f % 32u;
            let hi = b + 128u + 32u * n + f % 32u;
            c.w = vec4<u32>(word0(lo), word0(lo + 4u), word0(hi), word0(hi + 4u));
            c.x = vec2<u32>(s0w((b + 208u) >> 2u), s0w((b + 192u + f / 16u) >> 2u));
        }
        default: {
            c.v = array(wquad(r, k), wquad(r, k + 4u));
        }
    }
#else
    // f16 weights, 16-byte aligned (A4): the chunk is one 16-byte word.
    c.w = src0[(r >> 4u) + (k >> 3u)];
#endif
    return c;
}

// The 8 values of chunk c (fetched from the row at byte r from k), as two quads.
fn chunk_values(c: Chunk, r: u32, k: u32) -> array<vec4<f32>, 2> {
#if QUANT
    let e = k % 32u;
    switch T0 {
        case 2u: {
            let b = r + (k / 32u) * 18u;
            let d = half_in(c.w.z, b);
            let sh = 4u * (e / 16u);
            return array(deq_q4_0(c.w.x, sh, d), deq_q4_0(c.w.y, sh, d));
        }
        case 3u: {
            let dm = halves(c.w.z);
            let sh = 4u * (e / 16u);
            return array(deq_q4_1(c.w.x, sh, dm), deq_q4_1(c.w.y, sh, dm));
        }
        case 8u: {
            let b = r + (k / 32u) * 34u;
            let d = half_in(c.w.z, b);
            return array(i8x4(c.w.x) * d, i8x4(c.w.y) * d);
        }
        case 12u: {
            let f = k % 256u;
            let dm = halves(c.w.z);
            let sm = sm_k(vec3<u32>(c.w.w, c.x.x, c.x.y), f / 32u);
            let sh = 4u * ((f / 32u) % 2u);
            let d = dm.x * sm.x;
            let m = dm.y * sm.y;
            return array(deq_k(fields4(c.w.x, sh, 15u), d, m), deq_k(fields4(c.w.y, sh, 15u), d, m));
        }
        case 14u: {
            let b = r + (k / 256u) * 210u;
            let f = k % 256u;
            let s = (f / 32u) % 4u;
            let d = half_in(c.x.x, b + 208u) * i8_in_word(c.x.y, b + 192u + f / 16u);
            let lo = 4u * (s / 2u);
            return array(
                deq_q6_k(fields4(c.w.x, lo, 15u), fields4(c.w.z, 2u * s, 3u), d),
                deq_q6_k(fields4(c.w.y, lo, 15u), fields4(c.w.w, 2u * s, 3u), d),
            );
        }
        default: {
            return c.v;
        }
    }
#else
    return array(vec4<f32>(halves(c.w.x), halves(c.w.y)), vec4<f32>(halves(c.w.z), halves(c.w.w)));
#endif
}

@compute @workgroup_size(256)
fn mat_mat(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
#if MMPAIR
    // The first matrix's row tiles, then the second's.
    let t0 = (P.d.ne.x + BM - 1u) / BM;
    second = wg.x >= t0;
    let m0 = select(wg.x, wg.x - t0, second) * BM;
    let mm = select(P.d.ne.x, P.s3.ne.x, second);
#else
    let m0 = wg.x * BM;
    let mm = P.d.ne.x;
#endif
    let n0 = wg.y * BN;
    let i2 = wg.z % P.d.ne.z;
    let i3 = wg.z / P.d.ne.z;
    let nn = P.d.ne.y;
    let kk = P.s0.ne.x;
    // This invocation's chunks: 8 values at k offset ka of rows li / 4 + 64 p of src0; its
    // quads: 4 values at kb of columns li / 8 + 32 p of src1 (rows and columns past the end
    // read the last one: their results are not stored). Each step's loads are issued before
    // the products of the step before and stored (as f16) into the tiles after them.
    let ka = 8u * (li % 4u);
    let kb = 4u * (li % 8u);
    var ra: array<u32, CA>;
    var cb: array<u32, CB>;
    var pa: array<Chunk, CA>;
    var pb: array<vec4<f32>, CB>;
    for (var p = 0u; p < CA; p++) {
        ra[p] = row0(min(m0 + li / 4u + 64u * p, mm - 1u), i2, i3);
        pa[p] = chunk_fetch(ra[p], min(ka, kk - 8u));
    }
    for (var p = 0u; p < CB; p++) {
        cb[p] = col1(min(n0 + li / 8u + 32u * p, nn - 1u), i2, i3);
        pb[p] = yquad1(cb[p], min(kb, kk - 4u));
    }
    // This subgroup's part of the tile: rows sm .. sm + 16 FM, columns sn .. sn + 32.
    let sg = li / 32u;
    let sm = (sg % (BM / (16u * FM))) * 16u * FM;
    let sn = (sg / (BM / (16u * FM))) * 32u;
    var c00: coop_mat16x16<f32, C>;
    var c01: coop_mat16x16<f32, C>;
    var c10: coop_mat16x16<f32, C>;
    var c11: coop_mat16x16<f32, C>;
#if FM4
    var c20: coop_mat16x16<f32, C>;
    var c21: coop_mat16x16<f32, C>;
    var c30: coop_mat16x16<f32, C>;
    var c31: coop_mat16x16<f32, C>;
#endif
    for (var k0 = 0u; k0 < kk; k0 += BK) {
        // This step's tiles (every other step the second pair: the barrier of the step before
        // has seen every read of this pair's previous contents done). Values past k's end
        // are zeros.
        let oa = ((k0 / BK) % 2u) * BM * SA;
        let ob = ((k0 / BK) % 2u) * BN * SA;
        for (var p = 0u; p < CA; p++) {
            let v = chunk_values(pa[p], ra[p], min(k0 + ka, kk - 8u));
            let live = k0 + ka < kk;
            let h0 = vec4<f16>(select(vec4<f32>(0.0), v[0], live));
            let h1 = vec4<f16>(select(vec4<f32>(0.0), v[1], live));
            let o = oa + (li / 4u + 64u * p) * SA + ka;
            ta[o] = h0.x;
            ta[o + 1u] = h0.y;
            ta[o + 2u] = h0.z;
            ta[o + 3u] = h0.w;
            ta[o + 4u] = h1.x;
            ta[o + 5u] = h1.y;
            ta[o + 6u] = h1.z;
            ta[o + 7u] = h1.w;
        }
        for (var p = 0u; p < CB; p++) {
            let h = vec4<f16>(select(vec4<f32>(0.0), pb[p], k0 + kb < kk));
            let o = ob + (li / 8u + 32u * p) * SA + kb;
            tb[o] = h.x;
            tb[o + 1u] = h.y;
            tb[o + 2u] = h.z;
            tb[o + 3u] = h.w;
        }
        workgroupBarrier();
        // The next step's loads, issued before this step's products.
        let k1 = k0 + BK;
        if k1 < kk {
            for (var p = 0u; p < CA; p++) {
                pa[p] = chunk_fetch(ra[p], min(k1 + ka, kk - 8u));
            }
            for (var p = 0u; p < CB; p++) {
                pb[p] = yquad1(cb[p], min(k1 + kb, kk - 4u));
            }
        }
        for (var k = 0u; k < BK; k += 16u) {
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&ta[oa + sm * SA + k], SA);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&ta[oa + (sm + 16u) * SA + k], SA);
            let b0 = coopLoad<coop_mat16x16<f16, B>>(&tb[ob + sn * SA + k], SA);
            let b1 = coopLoad<coop_mat16x16<f16, B>>(&tb[ob + (sn + 16u) * SA + k], SA);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
#if FM4
            let a2 = coopLoadT<coop_mat16x16<f16, A>>(&ta[oa + (sm + 32u) * SA + k], SA);
            let a3 = coopLoadT<coop_mat16x16<f16, A>>(&ta[oa + (sm + 48u) * SA + k], SA);
            c20 = coopMultiplyAdd(a2, b0, c20);
            c21 = coopMultiplyAdd(a2, b1, c21);
            c30 = coopMultiplyAdd(a3, b0, c30);
            c31 = coopMultiplyAdd(a3, b1, c31);
#endif
        }
    }
    // Each 16 x 16 result through tc (column-major: m contiguous), then to dst by the
    // subgroup's 32 invocations, 8 values each.
    for (var f = 0u; f < 2u * FM; f++) {
        switch f {
            case 0u: { coopStore(c00, &tc[256u * sg], 16u); }
            case 1u: { coopStore(c01, &tc[256u * sg], 16u); }
            case 2u: { coopStore(c10, &tc[256u * sg], 16u); }
#if FM4
            case 3u: { coopStore(c11, &tc[256u * sg], 16u); }
            case 4u: { coopStore(c20, &tc[256u * sg], 16u); }
            case 5u: { coopStore(c21, &tc[256u * sg], 16u); }
            case 6u: { coopStore(c30, &tc[256u * sg], 16u); }
            default: { coopStore(c31, &tc[256u * sg], 16u); }
#else
            default: { coopStore(c11, &tc[256u * sg], 16u); }
#endif
        }
        workgroupBarrier();
        for (var e = li % 32u; e < 256u; e += 32u) {
            let m = m0 + sm + 16u * (f / 2u) + e % 16u;
            let n = n0 + sn + 16u * (f % 2u) + e / 16u;
            if m < mm && n < nn {
#if MMPAIR
                if second {
                    let b = P.off4.x + at(vec4<u32>(m, n, 0u, 0u), P.s3.nb);
                    src3[b >> 2u] = bitcast<u32>(tc[256u * sg + e]);
                    continue;
                }
#endif
                st(P.off.x + at(vec4<u32>(m, n, i2, i3), P.d.nb), tc[256u * sg + e]);
            }
        }
        workgroupBarrier();
    }
}
