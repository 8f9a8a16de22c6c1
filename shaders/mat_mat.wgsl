// mat_mat: the tiled mat-mat. A workgroup of 256 invocations computes a BM x BN tile of dst, stepping through k in BK-deep
// tiles of src0 and src1 staged in workgroup memory k-major (ta[k][m], tb[k][n]) as vec4s.
// Loading: invocation li loads quads (4 consecutive k) of row li % BM of the src0 tile and of
// column li % BN of the src1 tile, quads li / BM, li / BM + 256 / BM, ... of its k range;
// each quad is dequantized in registers from whole words of its block (`wquad`), with no
// per-value branch, and the next step's quads are loaded into registers while the current
// tiles are multiplied. Computing: invocation (tx, ty) = (li % 16, li / 16) accumulates the
// rows 4 tx + 64 i .. + 3 (i < BM / 64) and columns 4 ty + 64 j .. + 3 (j < BN / 64) of the
// tile, as vec4s along m: the 16 tx of a row of invocations read 16 neighbouring vec4s
// (no bank conflict), and one vec4 of tb serves four columns.
// Defines (besides mat_mat_common.wgsl's): BK a multiple of 4 with BM * BK and BN * BK
// multiples of 1024; H16 (adapters with SHADER_F16, f16 or quantized weights): the tiles hold f16 (weights and
// activations rounded to f16 as they are staged) and the products are f16 fmas, accumulated in
// f16 over HK k-steps (HK divides BK) and then added into the f32 accumulators.
// ID: mul_mat_id (dst [m, n_used, n_tokens], src0 the experts [k, m, n_expert], src1 the rows
// [k, n_b, n_tokens]) over its (slot, token) pairs grouped by expert: src2 holds the pairs by
// expert (words from 0) and the tile table (from word h.x), as the bucket op of moe.wgsl writes
// them. Workgroup (x, y) computes rows BM x .. of table entry y's expert by its pairs' rows (at
// most BN), each result stored at its (row, slot, token); an entry of an expert src0 does not
// hold (ne.z or more) stores zeros, one of no pairs returns at once.

#if H16
alias TE = f16;
#else
alias TE = f32;
#endif
// A quad of a tile.
alias TV = vec4<TE>;
const HK: u32 = {{HK}}u;

const VM: u32 = BM / 64u;
const VN: u32 = BN / 64u;
// Quads of src0 and src1 that each invocation loads per step.
const LA: u32 = BM * BK / 1024u;
const LB: u32 = BN * BK / 1024u;

var<workgroup> ta: array<TV, BM * BK / 4u>;
var<workgroup> tb: array<TV, BN * BK / 4u>;
#if ID
var<workgroup> id_pairs: u32;

// Pair y's byte offset of dst's column (0, e, t) (ID).
fn id_dst(y: u32) -> u32 {
    return P.off.x + (y % P.d.ne.y) * P.d.nb.y + (y / P.d.ne.y) * P.d.nb.z;
}
#endif

@compute @workgroup_size(256)
fn mat_mat(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let m0 = wg.x * BM;
    let mm = P.d.ne.x;
#if ID
    // Table entry wg.y: its expert, its first pair in the list and its pairs (nn).
    let te = (P.off.w >> 2u) + P.h.x + 3u * wg.y;
    if li == 0u {
        id_pairs = s2w(te + 2u);
    }
    let nn = workgroupUniformLoad(&id_pairs);
    if nn == 0u {
        return;
    }
    let xe = s2w(te);
    let held = xe < P.s0.ne.z;
    let list = (P.off.w >> 2u) + s2w(te + 1u);
    let n0 = 0u;
#else
    let n0 = wg.y * BN;
    let i2 = wg.z % P.d.ne.z;
    let i3 = wg.z / P.d.ne.z;
    let nn = P.d.ne.y;
#endif
    let kk = P.s0.ne.x;
    let tx = li % 16u;
    let ty = li / 16u;
    // The row of src0 and the column of src1 this invocation loads, and its first quads.
    let lm = li % BM;
    let ln = li % BN;
    let qa = li / BM;
    let qb = li / BN;
#if ID
    // An expert src0 does not hold reads no rows (its sums are 0); a column past the tile's
    // pairs repeats its last pair's row.
    let ra = P.off.y + min(m0 + lm, mm - 1u) * P.s0.nb.y + select(0u, xe, held) * P.s0.nb.z;
    let yc = s2w(list + min(ln, nn - 1u));
    let cb = P.off.z + ((yc % P.d.ne.y) % P.s1.ne.y) * P.s1.nb.y + (yc / P.d.ne.y) * P.s1.nb.z;
    let va = held && m0 + lm < mm;
#else
    let ra = row0(min(m0 + lm, mm - 1u), i2, i3);
    let cb = col1(min(n0 + ln, nn - 1u), i2, i3);
    let va = m0 + lm < mm;
#endif
    let vb = n0 + ln < nn;
    var pa: array<TV, LA>;
    var pb: array<TV, LB>;
    for (var p = 0u; p < LA; p++) {
        let k = 4u * (qa + (256u / BM) * p);
        if va && k < kk {
            pa[p] = TV(wquad(ra, k));
        }
    }
    for (var p = 0u; p < LB; p++) {
        let k = 4u * (qb + (256u / BN) * p);
        if vb && k < kk {
            pb[p] = TV(yquad1(cb, k));
        }
    }
    var acc: array<vec4<f32>, 4u * VM * VN>;
#if H16
    var h: array<TV, 4u * VM * VN>;
#endif
    for (var k0 = 0u; k0 < kk; k0 += BK) {
        for (var p = 0u; p < LA; p++) {
            let k = 4u * (qa + (256u / BM) * p);
            for (var i = 0u; i < 4u; i++) {
                ta[(k + i) * (BM / 4u) + lm / 4u][lm % 4u] = pa[p][i];
            }
        }
        for (var p = 0u; p < LB; p++) {
            let k = 4u * (qb + (256u / BN) * p);
            for (var i = 0u; i < 4u; i++) {
                tb[(k + i) * (BN / 4u) + ln / 4u][ln % 4u] = pb[p][i];
            }
        }
        workgroupBarrier();
        // The next step's quads, loaded while this step's tiles are multiplied.
        let k1 = k0 + BK;
        if k1 < kk {
            for (var p = 0u; p < LA; p++) {
                let k = k1 + 4u * (qa + (256u / BM) * p);
                pa[p] = TV(0.0);
                if va && k < kk {
                    pa[p] = TV(wquad(ra, k));
                }
            }
            for (var p = 0u; p < LB; p++) {
                let k = k1 + 4u * (qb + (256u / BN) * p);
                pb[p] = TV(0.0);
                if vb && k < kk {
                    pb[p] = TV(yquad1(cb, k));
                }
            }
        }
        for (var kh = 0u; kh < BK; kh += HK) {
            for (var k = kh; k < kh + HK; k++) {
                var a: array<TV, VM>;
                for (var i = 0u; i < VM; i++) {
                    a[i] = ta[k * (BM / 4u) + tx + 16u * i];
                }
                for (var j = 0u; j < VN; j++) {
                    let b = tb[k * (BN / 4u) + ty + 16u * j];
                    for (var i = 0u; i < VM; i++) {
                        let o = 4u * VM * j + i;
#if H16
                        h[o] = fma(a[i], TV(b.x), h[o]);
                        h[o + VM] = fma(a[i], TV(b.y), h[o + VM]);
                        h[o + 2u * VM] = fma(a[i], TV(b.z), h[o + 2u * VM]);
                        h[o + 3u * VM] = fma(a[i], TV(b.w), h[o + 3u * VM]);
#else
                        acc[o] = fma(a[i], vec4<f32>(b.x), acc[o]);
                        acc[o + VM] = fma(a[i], vec4<f32>(b.y), acc[o + VM]);
                        acc[o + 2u * VM] = fma(a[i], vec4<f32>(b.z), acc[o + 2u * VM]);
                        acc[o + 3u * VM] = fma(a[i], vec4<f32>(b.w), acc[o + 3u * VM]);
#endif
                    }
                }
            }
#if H16
            for (var o = 0u; o < 4u * VM * VN; o++) {
                acc[o] += vec4<f32>(h[o]);
                h[o] = TV(0.0);
            }
#endif
        }
        workgroupBarrier();
    }
    for (var j = 0u; j < VN; j++) {
        for (var c = 0u; c < 4u; c++) {
            let n = n0 + 4u * ty + 64u * j + c;
            if n >= nn {
                continue;
            }
#if ID
            let col = id_dst(s2w(list + n));
#else
            let col = P.off.x + at(vec4<u32>(0u, n, i2, i3), P.d.nb);
#endif
            for (var i = 0u; i < VM; i++) {
                let m = m0 + 4u * tx + 64u * i;
                let v = acc[4u * VM * j + VM * c + i];
                for (var l = 0u; l < 4u; l++) {
                    if m + l < mm {
                        st(col + (m + l) * P.d.nb.x, v[l]);
                    }
                }
            }
        }
    }
}
