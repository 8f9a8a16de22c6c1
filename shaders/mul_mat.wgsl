// Matrix products dst[m, n] = sum_k src0[k, m] * src1[k, n], batched over dims 2-3 with src0
// broadcast (op family "mul_mat"). src0 has any type T0 (quantized rows dequantized here),
// src1 is f32 or f16 (T1), dst f32.
//
// mat_vec: one workgroup of WG invocations per ROWS rows of one column of dst; used for small
//   n (generation). Every type reads whole words of its blocks, neighbouring invocations
//   neighbouring words, and dequantizes in registers with no per-value branch (layout at
//   `quads` below). Defines: QB and TPB (values and invocations per block), A4 (float weights
//   read as 16-byte words) and Y4 (f32 activations read as 16-byte words). With SUBGROUPS the
//   partial sums are added with subgroupAdd before the workgroup step, else in workgroup memory.
// mat_mat: BM x BN tiles of dst per workgroup of 256 invocations (16 x 16, each BM/16 x BN/16
//   outputs), stepping through k in BK-deep tiles of src0 and src1 staged in workgroup memory.
//
// Params: u.x: workgroups (mat_vec); u.y, u.z: broadcast ratios of dims 2 and 3; f.x: eps and
// off4.y: the byte offset of w in binding 5 (mat_vec_q with NORM); u.w: Q's workgroups, off4.z
// and off4.w: the byte offsets in bindings 6 and 7 (mat_vec_q with QKV); h.x and h.y: the byte
// offsets in bindings 9 and 10, h.z: n_dims, h.w: the head size, g.x: log2(freq_base), g.y:
// freq_scale (mat_vec_q with QKV and ROPE).

const BM: u32 = {{BM}}u;
const BN: u32 = {{BN}}u;
const BK: u32 = {{BK}}u;

#if MMPAIR
// Whether this workgroup's tile is of the second matrix (mat_mat with MMPAIR).
var<private> second: bool;
#endif

// Byte offset of row m of src0 for dst batch coordinates (i2, i3).
fn row0(m: u32, i2: u32, i3: u32) -> u32 {
#if MMPAIR
    // Both matrices (unbatched) in src0, u.w and h.x bytes from its start.
    return P.off.y + select(P.u.w, P.h.x, second) + m * select(P.s0.nb.y, P.s2.nb.y, second);
#else
    return P.off.y + m * P.s0.nb.y + (i2 / P.u.y) * P.s0.nb.z + (i3 / P.u.z) * P.s0.nb.w;
#endif
}

// Byte offset of column n of src1.
fn col1(n: u32, i2: u32, i3: u32) -> u32 {
    return P.off.z + n * P.s1.nb.y + i2 * P.s1.nb.z + i3 * P.s1.nb.w;
}

// y[k] of the src1 column at byte yb.
fn y1(yb: u32, k: u32) -> f32 {
    return ld1(yb + k * P.s1.nb.x);
}

// ---- mat_vec ----
//
// The k axis of a row is cut into blocks of QB elements (a quantized type's block; 8 values
// of a float type), and each block into TPB equal parts, one per invocation: invocation li
// takes part li % TPB of blocks li / TPB, li / TPB + WG / TPB, ... of each of its workgroup's
// ROWS rows. A part is always 8 values, two quads (4 consecutive k) of the block, whose
// positions are `quads` below: the quads of src1 are loaded once (16-byte loads with Y4)
// and used for the ROWS rows. Each part is dequantized in registers from whole words of its
// block (`part_dot`), so that neighbouring invocations read neighbouring words of a row.

const QB: u32 = {{QB}}u;
const TPB: u32 = {{TPB}}u;

// The positions in its block of the two quads of part t.
fn quads(t: u32) -> vec2<u32> {
    switch T0 {
        case 2u, 3u, 6u, 7u: {
            // Q4_0, Q4_1, Q5_0, Q5_1: byte j of the 16 nibble bytes holds values j and j + 16;
            // part t reads bytes 4t..4t+3.
            return vec2<u32>(4u * t, 16u + 4u * t);
        }
        case 12u, 13u: {
            // Q4_K, Q5_K: 32 nibble bytes per 64 values (low nibbles the first 32); part t reads
            // 4 bytes of 64-value group t / 8.
            let base = 64u * (t / 8u) + 4u * (t % 8u);
            return vec2<u32>(base, base + 32u);
        }
        case 10u, 11u, 14u: {
            // Q2_K, Q3_K, Q6_K: per 128-value half, 32 bytes (Q6_K: per 32-value quarter pair)
            // that hold values l, l + 32, l + 64, l + 96 at bit offsets; part t takes 4 bytes
            // and two of those four offsets: s and s + 2.
            let base = 128u * (t / 16u) + 32u * ((t / 8u) % 2u) + 4u * (t % 8u);
            return vec2<u32>(base, base + 64u);
        }
        default: {
            // Q8_0 (part t: values 8t..8t+7) and the float types (one part per block).
            return vec2<u32>(8u * t, 8u * t + 4u);
        }
    }
}

// The row length k: compiled in where the variant says so (YK: KK), else the parameter.
fn row_k() -> u32 {
#if YK
    return {{KK}}u;
#else
    return P.s0.ne.x;
#endif
}

// Four values of the src1 column at byte yb from k = e (zeros past the row's end).
fn yquad(yb: u32, e: u32) -> vec4<f32> {
#if Y4
    // Y4: the column is 16-byte aligned, f32, and k is a multiple of 4.
    if e < row_k() {
        return bitcast<vec4<f32>>(src1[(yb >> 4u) + (e >> 2u)]);
    }
    return vec4<f32>(0.0);
#else
    var v = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        if e + i < row_k() {
            v[i] = y1(yb, e + i);
        }
    }
    return v;
#endif
}

// The bytes of word q, as a vector.
fn bytes4(q: u32) -> vec4<u32> {
    return (vec4<u32>(q) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(255u);
}

// The bits of word q from bit offset `sh` of each byte, `mask` wide, as a vector.
fn fields4(q: u32, sh: u32, mask: u32) -> vec4<u32> {
    return (vec4<u32>(q) >> (vec4<u32>(0u, 8u, 16u, 24u) + sh)) & vec4<u32>(mask);
}

// The bytes of word q as signed values.
fn i8x4(q: u32) -> vec4<f32> {
    return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(q) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
}

// Bits 0..3 of h, as a vector.
fn bits4(h: u32) -> vec4<u32> {
    return (vec4<u32>(h) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u);
}

// The sum of the elements of v.
fn hsum(v: vec4<f32>) -> f32 {
    return dot(v, vec4<f32>(1.0));
}

// Byte i (0..11) of the 12 bytes in s.
fn byte12(s: vec3<u32>, i: u32) -> u32 {
    return (s[i / 4u] >> ((i % 4u) * 8u)) & 255u;
}

// The 6-bit scale and min of sub-block j of a Q4_K / Q5_K block, from its 12 scale bytes.
fn sm_k(s: vec3<u32>, j: u32) -> vec2<f32> {
    let a = byte12(s, j % 4u);
    let b = byte12(s, j % 4u + 4u);
    let c = byte12(s, j % 4u + 8u);
    let low = vec2<u32>(a & 63u, b & 63u);
    let high = vec2<u32>((c & 15u) | ((a >> 6u) << 4u), (c >> 4u) | ((b >> 6u) << 4u));
    return vec2<f32>(select(low, high, j >= 4u));
}

// The 6-bit scales and mins of sub-blocks 2j and 2j + 1 (j < 4) of a Q4_K / Q5_K block, from
// its 12 scale bytes: (scale, min) of 2j, then of 2j + 1. The two sub-blocks' bytes are
// neighbours in each word, so both are taken at once, two bytes to a field.
fn sm_k_pair(s: vec3<u32>, j: u32) -> vec4<f32> {
    let sh = 16u * (j & 1u);
    let a = s.x >> sh;
    let b = s.y >> sh;
    let c = s.z >> sh;
    let lo = vec2<u32>(a & 0x3f3fu, b & 0x3f3fu);
    let hi = vec2<u32>((c & 0x0f0fu) | ((a >> 2u) & 0x3030u), ((c >> 4u) & 0x0f0fu) | ((b >> 2u) & 0x3030u));
    let v = select(lo, hi, j >= 2u);
    return vec4<f32>(f32(v.x & 255u), f32(v.y & 255u), f32((v.x >> 8u) & 255u), f32((v.y >> 8u) & 255u));
}

// The 6-bit signed scale of 16-value sub-block i of the Q3_K block at byte bb.
fn scale_q3k(bb: u32, i: u32) -> f32 {
    let sl = select(byte0(bb + 96u + i - 8u) >> 4u, byte0(bb + 96u + i) & 15u, i < 8u);
    let sh = (byte0(bb + 104u + i % 4u) >> (2u * (i / 4u))) & 3u;
    return f32(i32(sl | (sh << 4u)) - 32);
}

// The f32 of the bf16 in the low 16 bits of w.
fn bf16(w: u32) -> f32 {
    return bitcast<f32>(w << 16u);
}

// A float weight at k = e of the row at byte r (zero past the row's end).
fn wf(r: u32, e: u32) -> f32 {
    if e < P.s0.ne.x {
        return ld0(r + e * P.s0.nb.x);
    }
    return 0.0;
}

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
var<workgroup> parts: array<f32, {{WG}} * ROWS>;

// One workgroup per ROWS rows of one column of dst (u.x workgroups in all).
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
    let c = coords(o, vec4<u32>((mm + ROWS - 1u) / ROWS, P.d.ne.yzw));
    let m0 = c.x * ROWS;
    let yb = col1(c.y, c.z, c.w);
    // Rows past the end repeat the last row (their sums are not stored).
    var rb: array<u32, ROWS>;
    var acc: array<f32, ROWS>;
    for (var r = 0u; r < ROWS; r++) {
        rb[r] = row0(min(m0 + r, mm - 1u), c.z, c.w);
        acc[r] = 0.0;
    }
    let t = li % TPB;
    let q = quads(t);
    let nb = (P.s0.ne.x + QB - 1u) / QB;
    for (var b = li / TPB; b < nb; b += {{WG}}u / TPB) {
        let ya = yquad(yb, b * QB + q.x);
        let yv = yquad(yb, b * QB + q.y);
        for (var r = 0u; r < ROWS; r++) {
            acc[r] += part_dot(rb[r], b, t, ya, yv);
        }
    }
#if SUBGROUPS
    let nsg = ({{WG}}u + ssz - 1u) / ssz;
    for (var r = 0u; r < ROWS; r++) {
        let part = subgroupAdd(acc[r]);
        if sli == 0u {
            parts[r * nsg + li / ssz] = part;
        }
    }
    workgroupBarrier();
    if li < ROWS && m0 + li < mm {
        var s = 0.0;
        for (var i = 0u; i < nsg; i++) {
            s += parts[li * nsg + i];
        }
        st(P.off.x + at(vec4<u32>(m0 + li, c.yzw), P.d.nb), s);
    }
#else
    for (var r = 0u; r < ROWS; r++) {
        let s = wg_sum(acc[r], li);
        if li == 0u && m0 + r < mm {
            st(P.off.x + at(vec4<u32>(m0 + r, c.yzw), P.d.nb), s);
        }
    }
#endif
}

// ---- mat_vec_q ----
//
// The mat-vec of the quantized types it knows (MVQ: Q4_0, Q4_1, Q8_0, Q4_K, Q6_K) in integer
// dot products. The src1 column is quantized, KC values at a time, into workgroup memory: 8-bit
// integers (four to a word, 16 to a vec4) with one f32 scale per 32 values, the largest
// magnitude mapped to 127. Each part of a weight block (TPB parts per QB-value block) is then
// multiplied with it four values per dot4I8Packed (one instruction where the device has integer
// dot products) in i32, and scaled once per part in f32. A workgroup takes ROWS rows of one
// column, TPR invocations per row (WG = ROWS x TPR): invocation j of a row takes its parts j,
// j + TPR, ..., and loads the raw words of its next part before it computes the current one
// (the first before the column is quantized). With PF2 the next two parts are in flight: two
// sets of registers take turns, each loaded again right after its part is computed, so that no
// loaded value is ever copied (a copy waits for its load: with one set, `w = next` made each
// step wait for the next part's load before the step after could begin).
// A row's partial sums are added by subgroup shuffles where its TPR invocations lie within one
// subgroup (RSUB), else through workgroup memory. The row length k is compiled in (KK), so
// that the loops' trip counts are known to the compiler; YK has the column's quantization and
// norm take it too, and ONECOL (dst one column, no batch dimensions) leaves out the divisions
// that find a workgroup's column and batch, with MM its row count and RS its row stride (not
// with QKV): each of these shortened the prologue that every load waits for (BENCHMARKS.md,
// sessions 21-22). QF (a column quantized in one step) issues the column's loads before the
// first weights' instead of after them.
// Parts: Q4_0 and Q4_1 a whole block of 32; Q8_0 half a block; Q4_K a 64-value group (the
// 32 bytes of nibbles of two 32-value sub-blocks, which share the block's head and the
// decode of their scales); Q6_K 16 positions of a 128-value half (64 values of four 16-value
// sub-blocks).
// Fused variants: ADD adds src2 (f32, dst's shape) to each sum as it is stored (`r + W x`);
// W2 computes the same rows of a second weight matrix of src0's type and shape in src2 (row
// stride s2.nb.y, laid out as src0: B4 = A4) by the same column, and then GLU stores
// silu(src0 row . x) * (src2 row . x) (swiglu of the gate and up products of one token), or
// PAIR stores both products, the second into src3 (f32, dst's shape; K and V of one token).
// NORM multiplies by rms_norm(x) * w where src1 holds x (f32) and binding 5 holds w (f32, one
// row of k values, from byte off4.y): the column is quantized as x * w, every invocation adds
// up the squares of the x it loads, and each sum (both sums of W2 variants) is multiplied by
// 1 / sqrt(mean(x^2) + eps) before it is stored, which equals normalizing first up to rounding
// (a per-32 scale is linear). With ADD, GLU and PAIR as above: rms_norm(x) * w feeding Q, K
// and V, or gate and up, without a norm dispatch of its own.
// QKV (with W2 and PAIR) runs three products of one column in one dispatch (a Llama block's Q,
// K and V): the first u.w workgroups take ROWS rows each of src0 (Q) into dst as the plain
// variant does, the ones after them ROWS rows each of src2 (K, into src3) and of a third
// matrix in binding 6 (V, from byte off4.z, laid out as src2) into binding 7 (from byte
// off4.w, laid out as src3), as PAIR does; Q may have more rows than K and V.
// ROPE (with QKV) also runs what follows those products in a Llama block's decode step: the
// rope of Q and K (adjacent pairs (2i, 2i + 1) of each head of h.w values, the first h.z
// values of a head rotated, the rest copied) and the stores of K and V into their caches.
// dst is the rotated Q (f32, contiguous); src3 and binding 7 are the K and V caches (type T3:
// f16 or f32; rows of s3.ne.x values with stride s3.nb.y, both laid out alike, word-aligned),
// stored at cache row idx (binding 10: i32, or the low word of an i64); nothing is stored
// there when idx is past the cache's s3.ne.y rows. The position is the i32 in binding 9. Row
// pairs (m, m + 1) of a workgroup (m even: ROWS is even) meet in workgroup memory, and the
// first invocation of row m rotates and stores both (an f16 pair as one word).
#if MVQ
const KC: u32 = {{KC}}u;
const QPS: u32 = {{QPS}}u;
var<workgroup> yq: array<vec4<u32>, KC / 16u>;
var<workgroup> yd: array<f32, KC / 32u>;
const TPR: u32 = {{TPR}}u;
#if QKV
#if B4
@group(0) @binding(6) var<storage, read_write> src6: array<vec4<u32>>;
fn s6w(i: u32) -> u32 { return src6[i >> 2u][i & 3u]; }
fn last6() -> u32 { return arrayLength(&src6) * 4u - 1u; }
#else
@group(0) @binding(6) var<storage, read_write> src6: array<u32>;
fn s6w(i: u32) -> u32 { return src6[i]; }
fn last6() -> u32 { return arrayLength(&src6) - 1u; }
#endif
@group(0) @binding(7) var<storage, read_write> dst7: array<u32>;
#if ROPE
@group(0) @binding(9) var<storage, read_write> rope_pos: array<u32>;
@group(0) @binding(10) var<storage, read_write> rope_row: array<u32>;
// The sums of each row of the workgroup (x: Q's or K's, y: V's), for the rope of row pairs.
var<workgroup> pair_sums: array<vec2<f32>, ROWS>;
#endif
// Whether this workgroup takes rows of K and V (src2 and binding 6), else of Q (src0).
var<private> kv: bool;
#endif
#if NORM
@group(0) @binding(5) var<storage, read_write> norm_w: array<u32>;
// This invocation's sum of the squares of the x it has loaded.
var<private> sumsq: f32;

// Four values of the column at byte yb from k = e times w (zeros past the row's end); where
// `own` (they are this invocation's to count), their squares before that are added to sumsq.
fn y_norm(yb: u32, e: u32, own: bool) -> vec4<f32> {
    let v = yquad(yb, e);
    if own {
        sumsq += dot(v, v);
    }
    var w = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        if e + i < row_k() {
            w[i] = bitcast<f32>(norm_w[(P.off4.y >> 2u) + e + i]);
        }
    }
    return v * w;
}
#endif

// The largest magnitude in v.
fn amax4(v: vec4<f32>) -> f32 {
    let a = abs(v);
    return max(max(a.x, a.y), max(a.z, a.w));
}

// v times s, rounded to nearest (ties to even), as four signed bytes; |v s| <= 127 (s is 127
// over the block's largest magnitude). Adding 1.5 x 2^23 leaves the rounded product in the low
// bits of the sum's mantissa, so the low byte of its bits is the product's two's complement
// byte: one add instead of a round and a float-to-integer conversion per value, which run at
// a quarter of the add's rate, a large share of the column's quantization (H200, 2026-12-01,
// `bench_model_sizes`, 8 weights rotated, m=4096 k=14336: Q4_0 14.02 -> 13.60 µs, Q4_K 13.94
// -> 13.65, Q8_0 21.35 -> 21.11, Q6_K 25.41 -> 25.15; 8B decode 356.5 / 357.4 -> 358.3 /
// 359.4 t/s).
fn q8x4(v: vec4<f32>, s: f32) -> u32 {
    return pack4xI8(bitcast<vec4<i32>>(v * s + vec4<f32>(12582912.0)));
}

// Quad q (values 4q .. 4q + 3) of the chunk from k0 of the src1 column at byte yb (zeros past
// the row's end); with NORM times w, its squares added to sumsq where it lies in the chunk (an
// invocation past the chunk loads values of the next one: not its to count).
fn y_at_quad(yb: u32, k0: u32, q: u32) -> vec4<f32> {
#if NORM
    return y_norm(yb, k0 + 4u * q, q < KC / 4u);
#else
    return yquad(yb, k0 + 4u * q);
#endif
}

// The slot of the chunk's 16 values from 16i where each part multiplies n runs of 16 and
// run g of every part lies in plane g (KC / 16n slots each), in the parts' order.
fn plane_slot(i: u32, n: u32) -> u32 {
    return (i % n) * (KC / (16u * n)) + i / n;
}

// The slot in yq of the chunk's 16 values from 16i: the values one part of each of the
// neighbouring invocations multiplies lie in neighbouring slots, so that a subgroup's loads of
// them meet no bank conflicts. Q4_0 and Q4_1 keep the first and the second 16 values of each
// block in two planes, Q4_K the four 16-value runs of each 64-value group in four; Q6_K
// orders a block's 16 slots by the part's vec4 g; Q8_0 keeps the column's order.
fn y_slot(i: u32) -> u32 {
    switch T0 {
        case 2u, 3u: {
            return plane_slot(i, 2u);
        }
        case 12u: {
            return plane_slot(i, 4u);
        }
        case 14u: {
            let r = i & 15u;
            return (i & ~15u) + 4u * ((r >> 1u) & 3u) + 2u * (r >> 3u) + (r & 1u);
        }
        default: {
            return i;
        }
    }
}

// Stores quad q (4 values) of the chunk, quantized as the word w, into yq, and the scale of
// its 32-value block, the largest magnitude a over 127, into yd from the block's first quad.
// Quads past the chunk (values of the next one) are not stored.
fn store_quad(q: u32, w: u32, a: f32) {
    if q < KC / 4u {
        yq[y_slot(q >> 2u)][q & 3u] = w;
        if (q & 7u) == 0u {
            yd[q >> 3u] = a / 127.0;
        }
    }
}

#if YC
// The quads of the column one invocation loads in a step of the quantization with YC: v0, v1,
// v2, v3 are quads q, q + WG, q + 2 WG, q + 3 WG of the chunk (zeros past the first QPS).
struct YQuads {
    v0: vec4<f32>,
    v1: vec4<f32>,
    v2: vec4<f32>,
    v3: vec4<f32>,
}

// Loads the quads of a step of the quantization with YC from quad q of the chunk from k0 of
// the src1 column at byte yb.
fn y_step_load(yb: u32, k0: u32, q: u32) -> YQuads {
    var l: YQuads;
    l.v0 = y_at_quad(yb, k0, q);
    if QPS > 1u {
        l.v1 = y_at_quad(yb, k0, q + {{WG}}u);
    }
    if QPS > 2u {
        l.v2 = y_at_quad(yb, k0, q + 2u * {{WG}}u);
        l.v3 = y_at_quad(yb, k0, q + 3u * {{WG}}u);
    }
    return l;
}

// Quantizes the quads l loaded from quad q (`y_step_load`) into yq and yd. A 32-value block is
// the 8 quads of 8 neighbouring invocations (in one subgroup: its size is 8 or more), which
// share their largest magnitudes by shuffles. Every invocation calls it, in uniform control
// flow.
fn y_step_store(l: YQuads, q: u32) {
    var a = vec4<f32>(amax4(l.v0), amax4(l.v1), amax4(l.v2), amax4(l.v3));
    if QPS > 2u {
        a = max(a, subgroupShuffleXor(a, 1u));
        a = max(a, subgroupShuffleXor(a, 2u));
        a = max(a, subgroupShuffleXor(a, 4u));
    } else {
        var b = a.xy;
        b = max(b, subgroupShuffleXor(b, 1u));
        b = max(b, subgroupShuffleXor(b, 2u));
        b = max(b, subgroupShuffleXor(b, 4u));
        a = vec4<f32>(b, 0.0, 0.0);
    }
    let inv = select(vec4<f32>(0.0), vec4<f32>(127.0) / a, a > vec4<f32>(0.0));
    store_quad(q, q8x4(l.v0, inv.x), a.x);
    if QPS > 1u {
        store_quad(q + {{WG}}u, q8x4(l.v1, inv.y), a.y);
    }
    if QPS > 2u {
        store_quad(q + 2u * {{WG}}u, q8x4(l.v2, inv.z), a.z);
        store_quad(q + 3u * {{WG}}u, q8x4(l.v3, inv.w), a.w);
    }
}
#endif

// Quantizes values k0 .. k0 + KC of the src1 column at byte yb (zeros past the row's end) into
// yq and yd.
fn quantize_y(yb: u32, k0: u32, li: u32) {
    let n = min(KC, row_k() - k0);
#if YC
    // Each step takes QPS x WG quads (4 values each): invocation li the quads li, li + WG, ...,
    // so that each of its loads reads one contiguous run with its neighbours' (`y_step_store`
    // says how a block's scale is shared). QPS (1, 2 or 4) is about the chunk's quads over WG,
    // so that the steps load few values past it.
    let steps = (n + 4u * QPS * {{WG}}u - 1u) / (4u * QPS * {{WG}}u);
    for (var s = 0u; s < steps; s++) {
        let q = QPS * {{WG}}u * s + li;
        y_step_store(y_step_load(yb, k0, q), q);
    }
#else
    // One invocation per 32 values.
    for (var i = li; i < (n + 31u) / 32u; i += {{WG}}u) {
        var v: array<vec4<f32>, 8>;
        var a = 0.0;
        for (var j = 0u; j < 8u; j++) {
#if NORM
            v[j] = y_norm(yb, k0 + 32u * i + 4u * j, true);
#else
            v[j] = yquad(yb, k0 + 32u * i + 4u * j);
#endif
            a = max(a, amax4(v[j]));
        }
        let inv = select(0.0, 127.0 / a, a > 0.0);
        yq[y_slot(2u * i)] = vec4<u32>(q8x4(v[0], inv), q8x4(v[1], inv), q8x4(v[2], inv), q8x4(v[3], inv));
        yq[y_slot(2u * i + 1u)] = vec4<u32>(q8x4(v[4], inv), q8x4(v[5], inv), q8x4(v[6], inv), q8x4(v[7], inv));
        yd[i] = a / 127.0;
    }
#endif
}

// The vec4s of the column (16 values each) that one part multiplies.
fn y_vecs() -> u32 {
    switch T0 {
        case 8u: {
            return 1u;
        }
        case 12u, 14u: {
            return 4u;
        }
        default: {
            return 2u;
        }
    }
}

// The index in yq of the g-th vec4 of the column that part t of block bl of the chunk multiplies.
fn y_at(bl: u32, t: u32, g: u32) -> u32 {
    let base = bl * (QB / 16u);
    switch T0 {
        case 8u: {
            // Q8_0: values 16t ..
            return base + t;
        }
        case 12u: {
            // Q4_K: values 64 t + 16 g ..
            return base + 4u * t + g;
        }
        case 14u: {
            // Q6_K: values 128 (t / 2) + 16 (t % 2) .. and 32, 64, 96 further.
            return base + 8u * (t / 2u) + 2u * g + t % 2u;
        }
        default: {
            // Q4_0, Q4_1: the block's 32 values.
            return base + g;
        }
    }
}

// The column's side of a part: its vec4s of 8-bit values, their scales and their sums.
struct YPart {
    q: array<vec4<u32>, 4>,
    d: vec4<f32>,
    s: vec4<i32>,
}

// The dot product of 16 signed bytes with 16 others.
fn dot16(a: vec4<u32>, b: vec4<u32>) -> i32 {
    return dot4I8Packed(a.x, b.x) + dot4I8Packed(a.y, b.y) + dot4I8Packed(a.z, b.z) + dot4I8Packed(a.w, b.w);
}

// The column's side of part t of block bl of the chunk.
fn y_part(bl: u32, t: u32) -> YPart {
    var y: YPart;
    for (var g = 0u; g < y_vecs(); g++) {
        let i = y_at(bl, t, g);
        y.q[g] = yq[y_slot(i)];
        y.d[g] = yd[i / 2u];
        y.s[g] = dot16(y.q[g], vec4<u32>(0x01010101u));
    }
    return y;
}

// The raw words of one part of a weight block, as loaded: nothing here is used before the
// part is computed, so that the loads of the next part overlap the current one's arithmetic.
// a, b, c: runs of four words (2-byte aligned runs: from the word that holds their first
// byte, the word after each in x); s: further words (scales, d).
struct WPart {
    a: vec4<u32>,
    b: vec4<u32>,
    c: vec4<u32>,
    x: vec4<u32>,
    s: vec4<u32>,
}

// Word i of the weights: src0, or src2 where `u` (the second matrix of W2 variants). With
// QKV: src0 (Q), else src2 (K) in K and V workgroups, and binding 6 (V) where `u`.
fn wword(u: bool, i: u32) -> u32 {
#if QKV
    if u {
        return s6w(i);
    }
    if kv {
        return s2w(i);
    }
#else
#if W2
    if u {
        return s2w(i);
    }
#endif
#endif
    return s0w(i);
}

// Four words of the weights (`u` as in wword) from word i.
fn words4(u: bool, i: u32) -> vec4<u32> {
    return vec4<u32>(wword(u, i), wword(u, i + 1u), wword(u, i + 2u), wword(u, i + 3u));
}

// Word i of the weights, clamped to the binding's last word (for the word after a run whose
// last bytes end the binding).
fn word_c(u: bool, i: u32) -> u32 {
#if QKV
    if u {
        return s6w(min(i, last6()));
    }
    if kv {
        return s2w(min(i, last2()));
    }
#else
#if W2
    if u {
        return s2w(min(i, last2()));
    }
#endif
#endif
    return s0w(min(i, last0()));
}

// The 16 bytes from byte b of the weights, a multiple of 16 (with A4, one 16-byte load).
fn run16(u: bool, b: u32) -> vec4<u32> {
#if A4
#if QKV
    if u {
        return src6[b >> 4u];
    }
    if kv {
        return src2[b >> 4u];
    }
#else
#if W2
    if u {
        return src2[b >> 4u];
    }
#endif
#endif
    return src0[b >> 4u];
#else
    return words4(u, b >> 2u);
#endif
}

// The four words from the even byte b of a run loaded as w (from word b / 4) and x (the word
// after): w itself where b is a multiple of 4, else shifted by two bytes.
fn funnel(w: vec4<u32>, x: u32, b: u32) -> vec4<u32> {
    let hi = vec4<u32>(w.yzw, x);
    return select(w, (w >> vec4<u32>(16u)) | (hi << vec4<u32>(16u)), (b & 2u) != 0u);
}

// Loads part t of block b of the weight row at byte r (of src2 where `u`, else src0).
fn load_part(u: bool, r: u32, b: u32, t: u32) -> WPart {
    var w: WPart;
    switch T0 {
        case 2u: {
            // Q4_0: f16 d, 16 bytes of nibbles.
            let bb = r + 18u * b;
            // The five words that hold the block's 18 bytes.
            w.a = words4(u, bb >> 2u);
            w.x.x = word_c(u, (bb >> 2u) + 4u);
        }
        case 3u: {
            // Q4_1: f16 d, f16 m, 16 bytes of nibbles.
            let i = (r + 20u * b) >> 2u;
            w.s.x = wword(u, i);
            w.a = words4(u, i + 1u);
        }
        case 8u: {
            // Q8_0: f16 d, 32 x i8.
            let bb = r + 34u * b;
            let i = (bb + 2u + 16u * t) >> 2u;
            w.a = words4(u, i);
            w.x.x = word_c(u, i + 4u);
            w.s.x = wword(u, bb >> 2u);
        }
        case 12u: {
            // Q4_K: the 16-byte head (d, dmin, scales) and the group's 32 bytes of nibbles.
            let bb = r + 144u * b;
            w.a = run16(u, bb);
            w.b = run16(u, bb + 16u + 32u * t);
            w.c = run16(u, bb + 32u + 32u * t);
        }
        case 14u: {
            // Q6_K: three runs (low nibbles twice, high bits), the words of the four scales,
            // and the word of d.
            let bb = r + 210u * b;
            let n = t / 2u;
            let l = 16u * (t % 2u);
            let i0 = (bb + 64u * n + l) >> 2u;
            let i1 = (bb + 64u * n + 32u + l) >> 2u;
            let i2 = (bb + 128u + 32u * n + l) >> 2u;
            w.a = words4(u, i0);
            w.b = words4(u, i1);
            w.c = words4(u, i2);
            w.x = vec4<u32>(word_c(u, i0 + 4u), word_c(u, i1 + 4u), word_c(u, i2 + 4u), 0u);
            let sc = (bb + 192u + 8u * n + t % 2u) >> 2u;
            w.s = vec4<u32>(wword(u, sc), wword(u, sc + 1u), word_c(u, sc + 2u), wword(u, (bb + 208u) >> 2u));
        }
        default: {}
    }
    return w;
}

// The i8 at byte offset o (0..11) of the 12 bytes in s, as f32.
fn i8_in(s: vec3<u32>, o: u32) -> f32 {
    return f32(bitcast<i32>(byte12(s, o) << 24u) >> 24u);
}

// The dot product of part t of block b of the src0 row at byte r, loaded as w, with the
// column's part y.
fn part_dot_q(w: WPart, r: u32, b: u32, t: u32, y: YPart) -> f32 {
    let m4 = vec4<u32>(0x0f0f0f0fu);
    let s4 = vec4<u32>(4u);
    switch T0 {
        case 2u: {
            // Q4_0: byte j of the nibbles holds values j and j + 16; value - 8.
            let bb = r + 18u * b;
            // The nibbles start 2 bytes into the first word (bb a multiple of 4) or at the
            // second (bb 2 past one).
            let q = select(funnel(w.a, w.x.x, 2u), vec4<u32>(w.a.yzw, w.x.x), (bb & 2u) != 0u);
            let d = half_in(w.a.x, bb);
            // Each nibble n as the signed byte 16 (n - 8): n ^ 8 in the byte's high half, so
            // that the column's sums are not needed; the 1 / 16 is exact.
            let mh = vec4<u32>(0xf0f0f0f0u);
            let h8 = vec4<u32>(0x80808080u);
            let s = dot16(((q << s4) & mh) ^ h8, y.q[0]) + dot16((q & mh) ^ h8, y.q[1]);
            return d * y.d.x * (f32(s) * 0.0625);
        }
        case 3u: {
            // Q4_1: d * q + m.
            let dm = halves(w.s.x);
            let s = dot16(w.a & m4, y.q[0]) + dot16((w.a >> s4) & m4, y.q[1]);
            return y.d.x * (dm.x * f32(s) + dm.y * f32(y.s.x + y.s.y));
        }
        case 8u: {
            // Q8_0: part t is values 16t .. 16t + 15.
            let bb = r + 34u * b;
            let q = funnel(w.a, w.x.x, bb + 2u + 16u * t);
            return half_in(w.s.x, bb) * y.d.x * f32(dot16(q, y.q[0]));
        }
        case 12u: {
            // Q4_K: 32 bytes of nibbles per 64 values, the low nibbles the first 32 (sub-block
            // 2t, 6-bit scale and min in sm.xy), the high ones the next 32 (2t + 1, sm.zw); part
            // t is the whole group t: its bytes 0 .. 15 in b, 16 .. 31 in c; value
            // d * scale * q - dmin * min.
            let dm = halves(w.a.x);
            let sm = sm_k_pair(w.a.yzw, t);
            let ia = f32(dot16(w.b & m4, y.q[0]) + dot16(w.c & m4, y.q[1]));
            let ib = f32(dot16((w.b >> s4) & m4, y.q[2]) + dot16((w.c >> s4) & m4, y.q[3]));
            let mins = sm.y * y.d.x * f32(y.s.x + y.s.y) + sm.w * y.d.z * f32(y.s.z + y.s.w);
            return dm.x * (sm.x * y.d.x * ia + sm.z * y.d.z * ib) - dm.y * mins;
        }
        case 14u: {
            // Q6_K: value (low | high << 4) - 32 times an i8 scale per 16 values and d. Half
            // n = t / 2 has low nibbles at 64n (values l and l + 64) and 64n + 32 (l + 32,
            // l + 96), high bits at 128 + 32n (values l, l + 32, l + 64, l + 96 from bit 0, 2,
            // 4, 6); part t takes l = 16 (t % 2) .. + 15.
            let bb = r + 210u * b;
            let n = t / 2u;
            let l = 16u * (t % 2u);
            let ql0 = funnel(w.a, w.x.x, bb + 64u * n + l);
            let ql1 = funnel(w.b, w.x.y, bb + 64u * n + 32u + l);
            let qh = funnel(w.c, w.x.z, bb + 128u + 32u * n + l);
            let m2 = vec4<u32>(0x03030303u);
            let i0 = dot16((ql0 & m4) | ((qh & m2) << s4), y.q[0]) - 32 * y.s.x;
            let i1 = dot16((ql1 & m4) | (((qh >> vec4<u32>(2u)) & m2) << s4), y.q[1]) - 32 * y.s.y;
            let i2 = dot16(((ql0 >> s4) & m4) | (((qh >> s4) & m2) << s4), y.q[2]) - 32 * y.s.z;
            let i3 = dot16(((ql1 >> s4) & m4) | (((qh >> vec4<u32>(6u)) & m2) << s4), y.q[3]) - 32 * y.s.w;
            // The scales are bytes o, o + 2, o + 4, o + 6 of the three words from the one
            // that holds the first.
            let o = (bb + 192u + 8u * n + t % 2u) & 3u;
            let sc = vec4<f32>(i8_in(w.s.xyz, o), i8_in(w.s.xyz, o + 2u), i8_in(w.s.xyz, o + 4u), i8_in(w.s.xyz, o + 6u));
            return half_in(w.s.w, bb + 208u) * dot(vec4<f32>(f32(i0), f32(i1), f32(i2), f32(i3)) * y.d, sc);
        }
        default: {
            return 0.0;
        }
    }
}

// The sum of v over the TPR invocations of row li / TPR (j = li % TPR): the row's first
// invocation (j = 0) gets it. RSUB (a row's invocations are within one subgroup): by subgroup
// shuffles, and every invocation of the row gets it; else through workgroup memory (red).
// Every invocation calls it, in uniform control flow.
fn row_sum(v: f32, li: u32, j: u32) -> f32 {
#if RSUB
    var x = v;
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
        x += subgroupShuffleXor(x, s);
    }
    return x;
#else
    // Earlier readers of red are done with it.
    workgroupBarrier();
    red[li] = v;
    workgroupBarrier();
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
        if j < s {
            red[li] += red[li + s];
        }
        workgroupBarrier();
    }
    return red[li];
#endif
}

#if ROPE
// Row m's sums v (Q's or K's) and v2 (V's; none in Q workgroups) stored by ROPE (see above):
// the first invocation of each even row m < mm rotates the pair (m, m + 1) and stores it.
// Every invocation calls it, in uniform control flow.
fn rope_store(v: f32, v2: f32, m: u32, mm: u32, li: u32, j: u32) {
    let lr = li / TPR;
    if j == 0u {
        pair_sums[lr] = vec2<f32>(v, v2);
    }
    workgroupBarrier();
    if j != 0u || (lr & 1u) != 0u || m >= mm {
        return;
    }
    let next = pair_sums[lr + 1u];
    var y = vec2<f32>(v, next.x);
    let e = m % P.h.w;
    if e < P.h.z {
        let pos = f32(bitcast<i32>(rope_pos[P.h.x >> 2u]));
        y = rope_rotate(y, e / 2u, pos, P.g.x, P.g.y, P.h.z);
    }
    if !kv {
        let b = P.off.x + m * P.d.nb.x;
        put_word(b >> 2u, bitcast<u32>(y.x));
        put_word((b + P.d.nb.x) >> 2u, bitcast<u32>(y.y));
        return;
    }
    let row = rope_row[P.h.y >> 2u];
    if row >= P.s3.ne.y {
        return;
    }
    let at_row = row * P.s3.nb.y + m * P.s3.nb.x;
    let kb = (P.off4.x + at_row) >> 2u;
    let vb = (P.off4.w + at_row) >> 2u;
    if T3 == 1u {
        src3[kb] = f16_bits(y.x) | (f16_bits(y.y) << 16u);
        dst7[vb] = f16_bits(v2) | (f16_bits(next.y) << 16u);
    } else {
        src3[kb] = bitcast<u32>(y.x);
        src3[kb + 1u] = bitcast<u32>(y.y);
        dst7[vb] = bitcast<u32>(v2);
        dst7[vb + 1u] = bitcast<u32>(next.y);
    }
}
#endif

#if NORM
#if SUBGROUPS
// 1 / sqrt(mean(x^2) + eps) of the column from every invocation's sumsq: added in each
// subgroup (sli, ssz: this invocation's index in it and its size), then over the subgroups'
// sums in red. Every invocation calls it, in uniform control flow.
fn norm_scale(li: u32, sli: u32, ssz: u32) -> f32 {
    let s = subgroupAdd(sumsq);
    if sli == 0u {
        red[li / ssz] = s;
    }
    workgroupBarrier();
    var t = 0.0;
    for (var i = 0u; i < ({{WG}}u + ssz - 1u) / ssz; i++) {
        t += red[i];
    }
    return 1.0 / sqrt(t / f32(row_k()) + P.f.x);
}
#else
// 1 / sqrt(mean(x^2) + eps) of the column from every invocation's sumsq. Every invocation
// calls it, in uniform control flow.
fn norm_scale(li: u32) -> f32 {
    return 1.0 / sqrt(wg_sum(sumsq, li) / f32(row_k()) + P.f.x);
}
#endif
#endif

// The raw words of one part of each weight row an invocation takes: of src0 (w), and with W2
// of the second matrix (w2; with QKV only in K and V workgroups).
struct Parts {
    w: WPart,
    w2: WPart,
}

// Loads part pn of the rows at byte r of src0 and, with W2, at byte r2 of the second matrix.
fn load_parts(r: u32, r2: u32, pn: u32) -> Parts {
    var q: Parts;
    q.w = load_part(false, r, pn / TPB, pn % TPB);
#if W2
#if QKV
    if kv {
        q.w2 = load_part(true, r2, pn / TPB, pn % TPB);
    }
#else
    q.w2 = load_part(true, r2, pn / TPB, pn % TPB);
#endif
#endif
    return q;
}

// The products of part p (loaded as q) with the column's chunk that starts at part base: x
// src0's, y the second matrix's (W2; zero in Q workgroups of QKV).
fn parts_dot(q: Parts, r: u32, r2: u32, p: u32, base: u32) -> vec2<f32> {
    let t = p % TPB;
    let y = y_part((p - base) / TPB, t);
    var d = vec2<f32>(part_dot_q(q.w, r, p / TPB, t, y), 0.0);
#if W2
#if QKV
    if kv {
        d.y = part_dot_q(q.w2, r2, p / TPB, t, y);
    }
#else
    d.y = part_dot_q(q.w2, r2, p / TPB, t, y);
#endif
#endif
    return d;
}

// One workgroup per ROWS rows of one column of dst (u.x workgroups in all; with QKV the
// first u.w of them for Q, the rest for K and V), TPR invocations per row.
@compute @workgroup_size({{WG}})
fn mat_vec_q(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
#if NORM
#if SUBGROUPS
    @builtin(subgroup_invocation_id) sli: u32,
    @builtin(subgroup_size) ssz: u32,
#endif
#endif
) {
    // Workgroups past the last (where the dispatch is laid out over two dimensions) take the
    // last one's rows and store nothing (m = mm below) rather than returning here: a branch on
    // the first parameter read holds back every read after it (H200, 8B decode 325.3 -> 332.2
    // t/s, Q4_0 m=4096 k=14336 15.34 -> 15.26 µs: BENCHMARKS.md, sessions 20-21).
    let g = group(wg, nwg);
#if QKV
    let groups = P.u.x;
#else
#if MM
    let groups = ({{MM}}u + ROWS - 1u) / ROWS;
#else
    let groups = P.u.x;
#endif
#endif
    let live = g < groups;
    let o = min(g, groups - 1u);
    let kk = {{KK}}u;
#if QKV
    // One column: workgroup o takes row block o of Q, or o - u.w of K and V.
    kv = o >= P.u.w;
    let mm = select(P.d.ne.x, P.s3.ne.x, kv);
    let c = vec4<u32>(select(o, o - P.u.w, kv), 0u, 0u, 0u);
#else
#if MM
    let mm = {{MM}}u;
#else
    let mm = P.d.ne.x;
#endif
#if ONECOL
    let c = vec4<u32>(o, 0u, 0u, 0u);
#else
    let c = coords(o, vec4<u32>((mm + ROWS - 1u) / ROWS, P.d.ne.yzw));
#endif
#endif
    let m = select(mm, c.x * ROWS + li / TPR, live);
    let j = li % TPR;
    let yb = col1(c.y, c.z, c.w);
    // A row past the end repeats the last row (its sum is not stored).
    let mr = min(m, mm - 1u);
#if QKV
    let r = select(P.off.y + mr * P.s0.nb.y, P.off.w + mr * P.s2.nb.y, kv);
#else
#if ONECOL
    let r = P.off.y + mr * {{RS}}u;
#else
    let r = row0(mr, c.z, c.w);
#endif
#endif
    // Parts of the row; invocation j takes parts j, j + TPR, ...
    let np = (kk / QB) * TPB;
#if W2
#if QKV
    // V's row (Q workgroups load none).
    let r2 = P.off4.z + mr * P.s2.nb.y;
#else
    let r2 = P.off.w + mr * P.s2.nb.y;
#endif
#else
    let r2 = 0u;
#endif
    var p = j;
#if QF
    // The column's loads for its quantization (one chunk, one step) go out before the weights'.
    let ql = y_step_load(yb, 0u, li);
#endif
    var qa = load_parts(r, r2, min(p, np - 1u));
#if PF2
    var qb = load_parts(r, r2, min(p + TPR, np - 1u));
#endif
    var acc = vec2<f32>(0.0);
    for (var k0 = 0u; k0 < kk; k0 += KC) {
        // The previous chunk's parts are done with yq before it is overwritten (no barrier
        // before the first chunk: there it cost Q4_K 0.6 µs of 15.8 on the H200).
        if k0 > 0u {
            workgroupBarrier();
        }
#if QF
        y_step_store(ql, li);
#else
        quantize_y(yb, k0, li);
#endif
        workgroupBarrier();
        let base = (k0 / QB) * TPB;
        let end = min(np, ((k0 + KC) / QB) * TPB);
#if PF2
        // qa and qb take turns; each is loaded again as soon as it has been used, so that
        // it is never copied (a copy would wait for its loads). Where the chunk ends after
        // qa, qb holds the next part: they swap for the next chunk.
        loop {
            if p >= end {
                break;
            }
            acc += parts_dot(qa, r, r2, p, base);
            qa = load_parts(r, r2, min(p + 2u * TPR, np - 1u));
            p += TPR;
            if p >= end {
                let t = qa;
                qa = qb;
                qb = t;
                break;
            }
            acc += parts_dot(qb, r, r2, p, base);
            qb = load_parts(r, r2, min(p + 2u * TPR, np - 1u));
            p += TPR;
        }
#else
        for (; p < end; p += TPR) {
            let next = load_parts(r, r2, min(p + TPR, np - 1u));
            acc += parts_dot(qa, r, r2, p, base);
            qa = next;
        }
#endif
    }
#if NORM
#if SUBGROUPS
    let rs = norm_scale(li, sli, ssz);
#else
    let rs = norm_scale(li);
#endif
    acc *= rs;
#endif
    var v = row_sum(acc.x, li, j);
    let dc = vec4<u32>(m, c.yzw);
#if W2
    let v2 = row_sum(acc.y, li, j);
#if GLU
    v = v / (1.0 + exp(-v)) * v2;
#else
#if QKV
#if ROPE
    rope_store(v, v2, m, mm, li, j);
    return;
#else
    // K and V workgroups store both sums (K's first) and are done.
    if kv {
        if j == 0u && m < mm {
            src3[(P.off4.x + at(dc, P.s3.nb)) >> 2u] = bitcast<u32>(v);
            dst7[(P.off4.w + at(dc, P.s3.nb)) >> 2u] = bitcast<u32>(v2);
        }
        return;
    }
#endif
#else
    if j == 0u && m < mm {
        src3[(P.off4.x + at(dc, P.s3.nb)) >> 2u] = bitcast<u32>(v2);
    }
#endif
#endif
#endif
#if ADD
    if j == 0u && m < mm {
        v += ld2(P.off.w + at(dc, P.s2.nb));
    }
#endif
    if j == 0u && m < mm {
        st(P.off.x + at(dc, P.d.nb), v);
    }
}
#endif

// ---- mat_mat ----
//
// A workgroup of 256 invocations computes a BM x BN tile of dst, stepping through k in BK-deep
// tiles of src0 and src1 staged in workgroup memory k-major (ta[k][m], tb[k][n]) as vec4s.
// Loading: invocation li loads quads (4 consecutive k) of row li % BM of the src0 tile and of
// column li % BN of the src1 tile, quads li / BM, li / BM + 256 / BM, ... of its k range;
// each quad is dequantized in registers from whole words of its block (`wquad`), with no
// per-value branch, and the next step's quads are loaded into registers while the current
// tiles are multiplied. Computing: invocation (tx, ty) = (li % 16, li / 16) accumulates the
// rows 4 tx + 64 i .. + 3 (i < BM / 64) and columns 4 ty + 64 j .. + 3 (j < BN / 64) of the
// tile, as vec4s along m: the 16 tx of a row of invocations read 16 neighbouring vec4s
// (no bank conflict), and one vec4 of tb serves four columns.
// Defines: BM, BN (64 or 128), BK (a multiple of 4 with BM * BK and BN * BK multiples of
// 1024); A4 (float weights whose rows are 16-byte aligned, k a multiple of 4: 16-byte loads),
// AL (quantized weights whose blocks are word aligned), Y4 (f32 activations as for mat_vec);
// H16 (adapters with SHADER_F16, f16 or quantized weights): the tiles hold f16 (weights and
// activations rounded to f16 as they are staged) and the products are f16 fmas, accumulated in
// f16 over HK k-steps (HK divides BK) and then added into the f32 accumulators.
// COOP (with H16; adapters with cooperative matrices of 16 x 16 x 16 f16 products and f32 sums,
// and subgroups of 32; tiles of 128 x 64 or 128 x 128, BK = 32; quantized weights, or f16
// weights with A4 and k a multiple of 8): its own loading and tile layout. The tiles are f16
// arrays k-contiguous (ta[m][k], tb[n][k]) with rows of SA = BK + 8 values (the padding puts
// the 8 rows of 16 bytes that a fragment load reads at once on distinct banks), two of each
// (double buffered: one barrier per step). Loading: invocation li takes an 8-value chunk of
// src0 (k offset 8 (li % 4)) of rows li / 4 and li / 4 + 64, and a quad of src1 (k offset
// 4 (li % 8)) of columns li / 8 + 32 p, so that neighbouring invocations read neighbouring
// bytes of a row. A step's loads are issued before the products of the step before and their
// values are turned into f16 and stored after them (`chunk_fetch` loads a chunk's words only:
// a chunk dequantized as it is loaded would stall each step on the loads' latency, which made
// this path 4 times slower). Each of the 8 subgroups computes a 16 FM x 32 part of the tile
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

// Four values of a quantized type from the raw words that hold them (the formulas the plain
// tiles' `wquad` and the cooperative tiles' `chunk_values` share). Q4_0: the nibbles at bit sh
// of the bytes of q, (n - 8) d.
fn deq_q4_0(q: u32, sh: u32, d: f32) -> vec4<f32> {
    return (vec4<f32>(fields4(q, sh, 15u)) - 8.0) * d;
}

// Q4_1: n d + m (dm: d and m).
fn deq_q4_1(q: u32, sh: u32, dm: vec2<f32>) -> vec4<f32> {
    return vec4<f32>(fields4(q, sh, 15u)) * dm.x + dm.y;
}

// Q4_K and Q5_K: q d - m, where d and m are the super-block's d and dmin times the sub-block's
// scale and min.
fn deq_k(q: vec4<u32>, d: f32, m: f32) -> vec4<f32> {
    return vec4<f32>(q) * d - m;
}

// Q6_K: (lo | hi << 4) - 32, times d (the super-block's d times the sub-block's scale).
fn deq_q6_k(lo: vec4<u32>, hi: vec4<u32>, d: f32) -> vec4<f32> {
    return (vec4<f32>(lo | (hi << vec4<u32>(4u))) - 32.0) * d;
}

// Four values of the src0 row at byte r from k, a multiple of 4 below the row's length
// (zeros past its end).
fn wquad(r: u32, k: u32) -> vec4<f32> {
#if QUANT
    switch T0 {
        case 2u: {
            // Q4_0: f16 d, 16 bytes of nibbles (value - 8); byte j holds values j and j + 16.
            let b = r + (k / 32u) * 18u;
            let e = k % 32u;
            return deq_q4_0(word0(b + 2u + e % 16u), 4u * (e / 16u), half0(b));
        }
        case 3u: {
            // Q4_1: f16 d, f16 m, 16 bytes of nibbles.
            let b = r + (k / 32u) * 20u;
            let e = k % 32u;
            return deq_q4_1(word0(b + 4u + e % 16u), 4u * (e / 16u), halves(word0(b)));
        }
        case 6u: {
            // Q5_0: f16 d, 32 high bits, 16 bytes of nibbles (value - 16).
            let b = r + (k / 32u) * 22u;
            let e = k % 32u;
            let h = bits4(word0(b + 2u) >> e) << vec4<u32>(4u);
            return (vec4<f32>(fields4(word0(b + 6u + e % 16u), 4u * (e / 16u), 15u) | h) - 16.0) * half0(b);
        }
        case 7u: {
            // Q5_1: f16 d, f16 m, 32 high bits, 16 bytes of nibbles.
            let b = r + (k / 32u) * 24u;
            let e = k % 32u;
            let dm = halves(word0(b));
            let h = bits4(word0(b + 4u) >> e) << vec4<u32>(4u);
            return vec4<f32>(fields4(word0(b + 8u + e % 16u), 4u * (e / 16u), 15u) | h) * dm.x + dm.y;
        }
        case 8u: {
            // Q8_0: f16 d, 32 x i8.
            let b = r + (k / 32u) * 34u;
            return i8x4(word0(b + 2u + k % 32u)) * half0(b);
        }
        case 10u: {
            // Q2_K: 16 scale/min bytes, 64 bytes of 2-bit values, f16 d, f16 dmin.
            let b = r + (k / 256u) * 84u;
            let e = k % 256u;
            let q = fields4(word0(b + 16u + 32u * (e / 128u) + e % 32u), 2u * ((e / 32u) % 4u), 3u);
            let sc = byte0(b + e / 16u);
            let dm = halves(word0(b + 80u));
            return vec4<f32>(q) * (dm.x * f32(sc & 15u)) - dm.y * f32(sc >> 4u);
        }
        case 11u: {
            // Q3_K: 32 bytes of high bits, 64 bytes of 2-bit values, 12 bytes of 6-bit scales,
            // f16 d; value (low | high << 2) - 4.
            let b = r + (k / 256u) * 110u;
            let e = k % 256u;
            let n = e / 128u;
            let s = (e / 32u) % 4u;
            let l = e % 32u;
            let lo = fields4(word0(b + 32u + 32u * n + l), 2u * s, 3u);
            let hi = fields4(word0(b + l), 4u * n + s, 1u);
            return (vec4<f32>(lo | (hi << vec4<u32>(2u))) - 4.0) * (half0(b + 108u) * scale_q3k(b, e / 16u));
        }
        case 12u: {
            // Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles
            // (32 bytes per 64 values, low nibbles the first 32).
            let b = r + (k / 256u) * 144u;
            let e = k % 256u;
            let dm = halves(word0(b));
            let sm = sm_k(vec3<u32>(word0(b + 4u), word0(b + 8u), word0(b + 12u)), e / 32u);
            let q = fields4(word0(b + 16u + 32u * (e / 64u) + e % 32u), 4u * ((e / 32u) % 2u), 15u);
            return deq_k(q, dm.x * sm.x, dm.y * sm.y);
        }
        case 13u: {
            // Q5_K: f16 d, f16 dmin, 12 bytes of scales and mins, 32 bytes of high bits, 128
            // bytes of nibbles.
            let b = r + (k / 256u) * 176u;
            let e = k % 256u;
            let j = e / 64u;
            let hi = (e / 32u) % 2u;
            let l = e % 32u;
            let dm = halves(word0(b));
            let sm = sm_k(vec3<u32>(word0(b + 4u), word0(b + 8u), word0(b + 12u)), e / 32u);
            let q = fields4(word0(b + 48u + 32u * j + l), 4u * hi, 15u) | (fields4(word0(b + 16u + l), 2u * j + hi, 1u) << vec4<u32>(4u));
            return deq_k(q, dm.x * sm.x, dm.y * sm.y);
        }
        case 14u: {
            // Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 i8 scales, f16 d;
            // value (low | high << 4) - 32.
            let b = r + (k / 256u) * 210u;
            let e = k % 256u;
            let n = e / 128u;
            let s = (e / 32u) % 4u;
            let l = e % 32u;
            let lo = fields4(word0(b + 64u * n + 32u * (s % 2u) + l), 4u * (s / 2u), 15u);
            let hi = fields4(word0(b + 128u + 32u * n + l), 2u * s, 3u);
            return deq_q6_k(lo, hi, half0(b + 208u) * i8_0(b + 192u + e / 16u));
        }
        default: {
            return vec4<f32>(0.0);
        }
    }
#else
#if A4
    // A4: the row is 16-byte aligned, contiguous, and k a multiple of 4.
    if T0 == 0u {
        return bitcast<vec4<f32>>(src0[(r >> 4u) + (k >> 2u)]);
    }
    let v = src0[(r >> 4u) + (k >> 3u)];
    let w = select(v.xy, v.zw, (k & 4u) != 0u);
    if T0 == 1u {
        return vec4<f32>(halves(w.x), halves(w.y));
    }
    return vec4<f32>(bf16(w.x), bf16(w.x >> 16u), bf16(w.y), bf16(w.y >> 16u));
#else
    return vec4<f32>(wf(r, k), wf(r, k + 1u), wf(r, k + 2u), wf(r, k + 3u));
#endif
#endif
}

// Four values of the src1 column at byte yb from k, below the row's length (zeros past its
// end).
fn yquad1(yb: u32, k: u32) -> vec4<f32> {
#if Y4
    // Y4: the column is 16-byte aligned, f32, and k a multiple of 4.
    return bitcast<vec4<f32>>(src1[(yb >> 4u) + (k >> 2u)]);
#else
    if k + 3u < P.s0.ne.x {
        return vec4<f32>(y1(yb, k), y1(yb, k + 1u), y1(yb, k + 2u), y1(yb, k + 3u));
    }
    return yquad(yb, k);
#endif
}

#if COOP
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
#else
var<workgroup> ta: array<TV, BM * BK / 4u>;
var<workgroup> tb: array<TV, BN * BK / 4u>;
#endif

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
#if COOP
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
#else
    let tx = li % 16u;
    let ty = li / 16u;
    // The row of src0 and the column of src1 this invocation loads, and its first quads.
    let lm = li % BM;
    let ln = li % BN;
    let qa = li / BM;
    let qb = li / BN;
    let ra = row0(min(m0 + lm, mm - 1u), i2, i3);
    let cb = col1(min(n0 + ln, nn - 1u), i2, i3);
    let va = m0 + lm < mm;
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
            for (var i = 0u; i < VM; i++) {
                let m = m0 + 4u * tx + 64u * i;
                let v = acc[4u * VM * j + VM * c + i];
                for (var l = 0u; l < 4u; l++) {
                    if m + l < mm {
                        st(P.off.x + at(vec4<u32>(m + l, n, i2, i3), P.d.nb), v[l]);
                    }
                }
            }
        }
    }
#endif
}
