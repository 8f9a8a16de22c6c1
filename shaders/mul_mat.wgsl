// Matrix products dst[m, n] = sum_k src0[k, m] * src1[k, n], batched over dims 2-3 with src0
// broadcast. src0 has any type T0 (quantized rows dequantized here), src1 is f32 or f16 (T1),
// dst f32. This file holds what every matrix product's shader shares (row and column
// addressing, the loads of src1 quads, the dequantization helpers); each family of entry
// points has its own file after it: mat_vec.wgsl (the float mat-vec), mat_vec_q.wgsl (the
// integer-dot mat-vec), mat_mat.wgsl (the tiled mat-mat) and mat_mat_coop.wgsl (the
// cooperative-matrix mat-mat), the two mat-mats after mat_mat_common.wgsl.
//
// Params: u.x: workgroups (mat_vec); u.y, u.z: broadcast ratios of dims 2 and 3; f.x: eps and
// off4.y: the byte offset of w in binding 5 (mat_vec_q with NORM); u.w: Q's workgroups, off4.z
// and off4.w: the byte offsets in bindings 6 and 7 (mat_vec_q with QKV); h.x and h.y: the byte
// offsets in bindings 9 and 10, h.z: n_dims, h.w: the head size, g.x: log2(freq_base), g.y:
// freq_scale (mat_vec_q with QKV and ROPE).

// Byte offset of row m of src0 for dst batch coordinates (i2, i3).
fn row0(m: u32, i2: u32, i3: u32) -> u32 {
#if MMPAIR
    // Both matrices (unbatched) in src0, u.w and h.x bytes from its start (`second`: in
    // mat_mat_coop.wgsl).
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

// The positions in its block of the two quads of part t.
fn quads(t: u32) -> vec2<u32> {
    switch T0 {
        case 2u, 3u, 6u, 7u, 20u, 39u: {
            // Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4: byte j of the 16 nibble bytes holds values j
            // and j + 16; part t reads bytes 4t..4t+3.
            return vec2<u32>(4u * t, 16u + 4u * t);
        }
        case 23u: {
            // IQ4_XS: per 32 values 16 nibble bytes as IQ4_NL's; part t reads 4 bytes of
            // sub-block t / 4.
            let base = 32u * (t / 4u) + 4u * (t % 4u);
            return vec2<u32>(base, base + 16u);
        }
        case 34u, 35u, 16u, 17u, 18u, 19u, 21u, 22u, 29u: {
            // TQ1_0, TQ2_0: part t is values 8t..8t+7 (each quad one word of the block); the
            // lattice i-quants: part t is group t, values 8t..8t+7.
            return vec2<u32>(8u * t, 8u * t + 4u);
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

// The largest magnitude in v.
fn amax4(v: vec4<f32>) -> f32 {
    let a = abs(v);
    return max(max(a.x, a.y), max(a.z, a.w));
}

// v times s, rounded to nearest (ties to even), as four signed bytes; |v s| <= 127 (s is 127
// over the block's largest magnitude). Adding 1.5 x 2^23 leaves the rounded product in the low
// bits of the sum's mantissa, so the low byte of its bits is the product's two's complement
// byte: one add instead of a round and a float-to-integer conversion per value, which run at
// a quarter of the add's rate, a large share of the column's quantization.
fn q8x4(v: vec4<f32>, s: f32) -> u32 {
    return pack4xI8(bitcast<vec4<i32>>(v * s + vec4<f32>(12582912.0)));
}
