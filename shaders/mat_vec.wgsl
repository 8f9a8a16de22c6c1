// mat_vec: one workgroup of WG invocations per ROWS rows of one column of dst; used for small
// n (generation). Every type reads whole words of its blocks, neighbouring invocations
// neighbouring words, and dequantizes in registers with no per-value branch (layout at `quads`
// in mul_mat.wgsl). Defines: QB and TPB (values and invocations per block), A4 (float weights
// read as 16-byte words) and Y4 (f32 activations read as 16-byte words). With SUBGROUPS the
// partial sums are added with subgroupAdd before the workgroup step, else in workgroup memory.
// ID makes it mul_mat_id's mat-vec (a workgroup per ROWS rows of the expert each slot of a
// token picked, the id read on the GPU); GLU (with ID, and W3 for the reads of the second
// matrix; never with A4) the experts' fused gate and up with their SwiGLU (GEGLU with GELU):
// see the entry point.
//
// The k axis of a row is cut into blocks of QB elements (a quantized type's block; 8 values
// of a float type), and each block into TPB equal parts, one per invocation: invocation li
// takes part li % TPB of blocks li / TPB, li / TPB + WG / TPB, ... of each of its workgroup's
// ROWS rows. A part is always 8 values, two quads (4 consecutive k) of the block, whose
// positions are `quads` (mul_mat.wgsl): the quads of src1 are loaded once (16-byte loads with Y4)
// and used for the ROWS rows. Each part is dequantized in registers from whole words of its
// block (`part_dot`), so that neighbouring invocations read neighbouring words of a row.

const QB: u32 = {{QB}}u;
const TPB: u32 = {{TPB}}u;

// The dot product of part t of block b of the src0 row at byte r with the part's quads of
// src1, ya and yb.
fn part_dot(r: u32, b: u32, t: u32, ya: vec4<f32>, yb: vec4<f32>) -> f32 {
    switch T0 {
        case 2u: {
            // Q4_0: f16 d, 16 bytes of nibbles (value - 8).
            let bb = r + 18u * b;
            let q = word0(bb + 2u + 4u * t);
            let lo = vec4<f32>(fields4(q, 0u, 15u)) - 8.0;
            let hi = vec4<f32>(fields4(q, 4u, 15u)) - 8.0;
            return half0(bb) * (dot(lo, ya) + dot(hi, yb));
        }
        case 3u: {
            // Q4_1: f16 d, f16 m, 16 bytes of nibbles.
            let bb = r + 20u * b;
            let dm = halves(word0(bb));
            let q = word0(bb + 4u + 4u * t);
            let lo = vec4<f32>(fields4(q, 0u, 15u));
            let hi = vec4<f32>(fields4(q, 4u, 15u));
            return dm.x * (dot(lo, ya) + dot(hi, yb)) + dm.y * (hsum(ya) + hsum(yb));
        }
        case 6u: {
            // Q5_0: f16 d, 32 high bits, 16 bytes of nibbles (value - 16).
            let bb = r + 22u * b;
            let qh = word0(bb + 2u);
            let q = word0(bb + 6u + 4u * t);
            let lo = vec4<f32>(fields4(q, 0u, 15u) | (bits4(qh >> (4u * t)) << vec4<u32>(4u))) - 16.0;
            let hi = vec4<f32>(fields4(q, 4u, 15u) | (bits4(qh >> (16u + 4u * t)) << vec4<u32>(4u))) - 16.0;
            return half0(bb) * (dot(lo, ya) + dot(hi, yb));
        }
        case 7u: {
            // Q5_1: f16 d, f16 m, 32 high bits, 16 bytes of nibbles.
            let bb = r + 24u * b;
            let dm = halves(word0(bb));
            let qh = word0(bb + 4u);
            let q = word0(bb + 8u + 4u * t);
            let lo = vec4<f32>(fields4(q, 0u, 15u) | (bits4(qh >> (4u * t)) << vec4<u32>(4u)));
            let hi = vec4<f32>(fields4(q, 4u, 15u) | (bits4(qh >> (16u + 4u * t)) << vec4<u32>(4u)));
            return dm.x * (dot(lo, ya) + dot(hi, yb)) + dm.y * (hsum(ya) + hsum(yb));
        }
        case 8u: {
            // Q8_0: f16 d, 32 x i8.
            let bb = r + 34u * b;
            let q0 = word0(bb + 2u + 8u * t);
            let q1 = word0(bb + 6u + 8u * t);
            return half0(bb) * (dot(i8x4(q0), ya) + dot(i8x4(q1), yb));
        }
        case 10u: {
            // Q2_K: 16 scale/min bytes, 64 bytes of 2-bit values, f16 d, f16 dmin.
            let bb = r + 84u * b;
            let n = t / 16u;
            let s = (t / 8u) % 2u;
            let l = 4u * (t % 8u);
            let q = word0(bb + 16u + 32u * n + l);
            let sc = vec2<u32>(byte0(bb + 8u * n + 2u * s + l / 16u), byte0(bb + 8u * n + 2u * s + 4u + l / 16u));
            let dm = halves(word0(bb + 80u));
            let v0 = vec4<f32>(fields4(q, 2u * s, 3u));
            let v1 = vec4<f32>(fields4(q, 2u * s + 4u, 3u));
            return dm.x * (f32(sc.x & 15u) * dot(v0, ya) + f32(sc.y & 15u) * dot(v1, yb)) - dm.y * (f32(sc.x >> 4u) * hsum(ya) + f32(sc.y >> 4u) * hsum(yb));
        }
        case 11u: {
            // Q3_K: 32 bytes of high bits, 64 bytes of 2-bit values, 12 bytes of 6-bit scales,
            // f16 d; value (low | high << 2) - 4.
            let bb = r + 110u * b;
            let n = t / 16u;
            let s = (t / 8u) % 2u;
            let l = 4u * (t % 8u);
            let q = word0(bb + 32u + 32u * n + l);
            let h = word0(bb + l);
            let v0 = vec4<f32>(fields4(q, 2u * s, 3u) | (fields4(h, 4u * n + s, 1u) << vec4<u32>(2u))) - 4.0;
            let v1 = vec4<f32>(fields4(q, 2u * s + 4u, 3u) | (fields4(h, 4u * n + s + 2u, 1u) << vec4<u32>(2u))) - 4.0;
            let i = 8u * n + 2u * s + l / 16u;
            return half0(bb + 108u) * (scale_q3k(bb, i) * dot(v0, ya) + scale_q3k(bb, i + 4u) * dot(v1, yb));
        }
        case 12u: {
            // Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles.
            let bb = r + 144u * b;
            let j = t / 8u;
            let dm = halves(word0(bb));
            let sc = vec3<u32>(word0(bb + 4u), word0(bb + 8u), word0(bb + 12u));
            let sm = sm_k_pair(sc, j);
            let s0 = sm.xy;
            let s1 = sm.zw;
            let q = word0(bb + 16u + 32u * j + 4u * (t % 8u));
            let lo = vec4<f32>(fields4(q, 0u, 15u));
            let hi = vec4<f32>(fields4(q, 4u, 15u));
            return dm.x * (s0.x * dot(lo, ya) + s1.x * dot(hi, yb)) - dm.y * (s0.y * hsum(ya) + s1.y * hsum(yb));
        }
        case 13u: {
            // Q5_K: f16 d, f16 dmin, 12 bytes of scales and mins, 32 bytes of high bits, 128
            // bytes of nibbles.
            let bb = r + 176u * b;
            let j = t / 8u;
            let l = 4u * (t % 8u);
            let dm = halves(word0(bb));
            let sc = vec3<u32>(word0(bb + 4u), word0(bb + 8u), word0(bb + 12u));
            let sm = sm_k_pair(sc, j);
            let s0 = sm.xy;
            let s1 = sm.zw;
            let q = word0(bb + 48u + 32u * j + l);
            let h = word0(bb + 16u + l);
            let lo = vec4<f32>(fields4(q, 0u, 15u) | (fields4(h, 2u * j, 1u) << vec4<u32>(4u)));
            let hi = vec4<f32>(fields4(q, 4u, 15u) | (fields4(h, 2u * j + 1u, 1u) << vec4<u32>(4u)));
            return dm.x * (s0.x * dot(lo, ya) + s1.x * dot(hi, yb)) - dm.y * (s0.y * hsum(ya) + s1.y * hsum(yb));
        }
        case 14u: {
            // Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 i8 scales, f16 d;
            // value (low | high << 4) - 32.
            let bb = r + 210u * b;
            let n = t / 16u;
            let s = (t / 8u) % 2u;
            let l = 4u * (t % 8u);
            let ql = word0(bb + 64u * n + 32u * s + l);
            let qh = word0(bb + 128u + 32u * n + l);
            let v0 = vec4<f32>(fields4(ql, 0u, 15u) | (fields4(qh, 2u * s, 3u) << vec4<u32>(4u))) - 32.0;
            let v1 = vec4<f32>(fields4(ql, 4u, 15u) | (fields4(qh, 2u * s + 4u, 3u) << vec4<u32>(4u))) - 32.0;
            let i = bb + 192u + 8u * n + 2u * s + l / 16u;
            return half0(bb + 208u) * (i8_0(i) * dot(v0, ya) + i8_0(i + 4u) * dot(v1, yb));
        }
        case 20u: {
            // IQ4_NL: f16 d, 16 bytes of nibbles indexing IQ4_TABLE.
            let bb = r + 18u * b;
            let q = word0(bb + 2u + 4u * t);
            let lo = table16x4(IQ4_TABLE, fields4(q, 0u, 15u));
            let hi = table16x4(IQ4_TABLE, fields4(q, 4u, 15u));
            return half0(bb) * (dot(lo, ya) + dot(hi, yb));
        }
        case 23u: {
            // IQ4_XS: part t is 8 values of sub-block t / 4, laid out as IQ4_NL's.
            let bb = r + 136u * b;
            let q = word0(bb + 8u + 16u * (t / 4u) + 4u * (t % 4u));
            let lo = table16x4(IQ4_TABLE, fields4(q, 0u, 15u));
            let hi = table16x4(IQ4_TABLE, fields4(q, 4u, 15u));
            return iq4_xs_scale(bb, t / 4u) * (dot(lo, ya) + dot(hi, yb));
        }
        case 39u: {
            // MXFP4: E8M0 exponent, 16 bytes of nibbles indexing MXFP4_TABLE.
            let bb = r + 17u * b;
            let q = word0(bb + 1u + 4u * t);
            let lo = table16x4(MXFP4_TABLE, fields4(q, 0u, 15u));
            let hi = table16x4(MXFP4_TABLE, fields4(q, 4u, 15u));
            return e8m0_half(byte0(bb)) * (dot(lo, ya) + dot(hi, yb));
        }
        case 34u: {
            // TQ1_0: part t is values 8t..8t+7.
            let bb = r + 54u * b;
            return half0(bb + 52u) * (dot(tq1_quad(bb, 8u * t), ya) + dot(tq1_quad(bb, 8u * t + 4u), yb));
        }
        case 35u: {
            // TQ2_0: part t is values 8t..8t+7.
            let bb = r + 66u * b;
            return half0(bb + 64u) * (dot(tq2_quad(bb, 8u * t), ya) + dot(tq2_quad(bb, 8u * t + 4u), yb));
        }
        case 16u, 17u, 18u, 19u, 21u, 22u, 29u: {
            // The lattice i-quants: part t is group t (values 8t..8t+7), decoded from its grid
            // entries.
            let v = lattice_group(T0, r + lattice_size(T0) * b, t);
            return dot(v[0], ya) + dot(v[1], yb);
        }
        default: {
            // Float weights: block b is values 8b..8b+7.
#if A4
            // A4: the row is 16-byte aligned and k a multiple of 8.
            if T0 == 0u {
                let w = (r >> 4u) + 2u * b;
                return dot(bitcast<vec4<f32>>(src0[w]), ya) + dot(bitcast<vec4<f32>>(src0[w + 1u]), yb);
            }
            let v = src0[(r >> 4u) + b];
            if T0 == 1u {
                return dot(vec4<f32>(halves(v.x), halves(v.y)), ya) + dot(vec4<f32>(halves(v.z), halves(v.w)), yb);
            }
            let b0 = vec4<f32>(bf16(v.x), bf16(v.x >> 16u), bf16(v.y), bf16(v.y >> 16u));
            let b1 = vec4<f32>(bf16(v.z), bf16(v.z >> 16u), bf16(v.w), bf16(v.w >> 16u));
            return dot(b0, ya) + dot(b1, yb);
#else
            let e = 8u * b;
            let a0 = vec4<f32>(wf(r, e), wf(r, e + 1u), wf(r, e + 2u), wf(r, e + 3u));
            let a1 = vec4<f32>(wf(r, e + 4u), wf(r, e + 5u), wf(r, e + 6u), wf(r, e + 7u));
            return dot(a0, ya) + dot(a1, yb);
#endif
        }
    }
}

const ROWS: u32 = {{ROWS}}u;
#if GLU
// The sums of each row: the gate's, then the up matrix's.
const SUMS: u32 = 2u;
#else
const SUMS: u32 = 1u;
#endif
var<workgroup> parts: array<f32, {{WG}} * ROWS * SUMS>;
#if ID
// The expert of the workgroup's (slot, token), read once for all its invocations.
var<workgroup> expert: i32;

// Id (e, t) of src2.
fn id_at(e: u32, t: u32) -> i32 {
    return bitcast<i32>(s2w((P.off.w + e * P.s2.nb.x + t * P.s2.nb.y) >> 2u));
}
#endif

#if GLU
// The gated activation of the gate's sum g: SiLU, or with GELU, GELU's tanh form (written so
// that it never overflows).
fn gate_act(g: f32) -> f32 {
#if GELU
    let u = 0.7978845608028654 * g * (1.0 + 0.044715 * g * g);
    let e = exp(-2.0 * abs(u));
    return 0.5 * g * (1.0 + sign(u) * (1.0 - e) / (1.0 + e));
#else
    return g / (1.0 + exp(-g));
#endif
}
#endif

// Stores the sums s (the gate's) and v (the up matrix's, with GLU) of row m of dst at batch
// coordinates c.
fn store_row(m: u32, c: vec4<u32>, s: f32, v: f32) {
#if GLU
    st(P.off.x + at(vec4<u32>(m, c.yzw), P.d.nb), gate_act(s) * v);
#else
    st(P.off.x + at(vec4<u32>(m, c.yzw), P.d.nb), s);
#endif
}

// One workgroup per ROWS rows of one column of dst (u.x workgroups in all).
// With ID (mul_mat_id): dst is [m, n_used, n_tokens], and the workgroup of slot e of token t
// multiplies rows of expert ids[e, t] - u.y of src0 [k, m, n_expert] (ids: the i32 src2) by
// row e % n_b of token t of src1 [k, n_b, n_tokens]; an expert src0 does not hold gives 0.
// With GLU (and ID): the same rows of the up experts in src3 (laid out as src0, from byte
// off4.x) by the same row of src1, and act(gate) * up stored (the experts' gated FFN).
@compute @workgroup_size({{WG}})
fn mat_vec(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
#if SUBGROUPS
    @builtin(subgroup_invocation_id) sli: u32,
    @builtin(subgroup_size) ssz: u32,
#endif
) {
    let o = group(wg, nwg);
    if o >= P.u.x {
        return;
    }
    let mm = P.d.ne.x;
    let c = mat_vec_coords(o, (mm + ROWS - 1u) / ROWS, P.d.ne);
    let m0 = c.x * ROWS;
    var nb = (P.s0.ne.x + QB - 1u) / QB;
    // Rows past the end repeat the last row (their sums are not stored).
    var rb: array<u32, ROWS>;
#if ID
    if li == 0u {
        expert = id_at(c.y, c.z) - i32(P.u.y);
    }
    let x = workgroupUniformLoad(&expert);
    let held = x >= 0 && u32(x) < P.s0.ne.z;
    if !held {
        nb = 0u;
    }
    let yb = P.off.z + (c.y % P.s1.ne.y) * P.s1.nb.y + c.z * P.s1.nb.z;
    for (var r = 0u; r < ROWS; r++) {
        rb[r] = P.off.y + min(m0 + r, mm - 1u) * P.s0.nb.y + select(0u, u32(x), held) * P.s0.nb.z;
    }
#else
    let yb = col1(c.y, c.z, c.w);
    for (var r = 0u; r < ROWS; r++) {
        rb[r] = row0(min(m0 + r, mm - 1u), c.z, c.w);
    }
#endif
    var acc: array<f32, ROWS * SUMS>;
    let t = li % TPB;
    let q = quads(t);
    for (var b = li / TPB; b < nb; b += {{WG}}u / TPB) {
        let ya = yquad(yb, b * QB + q.x);
        let yv = yquad(yb, b * QB + q.y);
        for (var r = 0u; r < ROWS; r++) {
            acc[r] += part_dot(rb[r], b, t, ya, yv);
        }
#if GLU
        from3 = true;
        for (var r = 0u; r < ROWS; r++) {
            acc[ROWS + r] += part_dot(rb[r] - P.off.y + P.off4.x, b, t, ya, yv);
        }
        from3 = false;
#endif
    }
#if SUBGROUPS
    let nsg = ({{WG}}u + ssz - 1u) / ssz;
    for (var r = 0u; r < ROWS * SUMS; r++) {
        let part = subgroupAdd(acc[r]);
        if sli == 0u {
            parts[r * nsg + li / ssz] = part;
        }
    }
    workgroupBarrier();
    if li < ROWS && m0 + li < mm {
        var s = 0.0;
        var v = 0.0;
        for (var i = 0u; i < nsg; i++) {
            s += parts[li * nsg + i];
#if GLU
            v += parts[(ROWS + li) * nsg + i];
#endif
        }
        store_row(m0 + li, c, s, v);
    }
#else
    for (var r = 0u; r < ROWS; r++) {
        let s = wg_sum(acc[r], li);
        var v = 0.0;
#if GLU
        v = wg_sum(acc[ROWS + r], li);
#endif
        if li == 0u && m0 + r < mm {
            store_row(m0 + r, c, s, v);
        }
    }
#endif
}
