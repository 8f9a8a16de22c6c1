// What the two mat-mats (mat_mat.wgsl, mat_mat_coop.wgsl) share: the tile sizes and the loads
// of four values of a src0 row (dequantized) or a src1 column. Defines: BM, BN (64 or 128),
// BK; QUANT (quantized weights), A4 (float weights whose rows are 16-byte aligned, k a
// multiple of 4: 16-byte loads), AL (quantized weights whose blocks are word aligned), Y4 (f32
// activations as 16-byte loads).

const BM: u32 = {{BM}}u;
const BN: u32 = {{BN}}u;
const BK: u32 = {{BK}}u;

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
        case 20u: {
            // IQ4_NL: f16 d, 16 bytes of nibbles indexing IQ4_TABLE.
            let b = r + (k / 32u) * 18u;
            let e = k % 32u;
            return table16x4(IQ4_TABLE, fields4(word0(b + 2u + e % 16u), 4u * (e / 16u), 15u)) * half0(b);
        }
        case 23u: {
            // IQ4_XS: per 32 values a 6-bit scale and 16 bytes of nibbles as IQ4_NL's.
            let b = r + (k / 256u) * 136u;
            let e = k % 256u;
            let l = e % 32u;
            let q = fields4(word0(b + 8u + 16u * (e / 32u) + l % 16u), 4u * (l / 16u), 15u);
            return table16x4(IQ4_TABLE, q) * iq4_xs_scale(b, e / 32u);
        }
        case 39u: {
            // MXFP4: E8M0 exponent, 16 bytes of nibbles indexing MXFP4_TABLE.
            let b = r + (k / 32u) * 17u;
            let e = k % 32u;
            let q = fields4(word0(b + 1u + e % 16u), 4u * (e / 16u), 15u);
            return table16x4(MXFP4_TABLE, q) * e8m0_half(byte0(b));
        }
        case 34u: {
            // TQ1_0: base-3 digits, f16 d.
            let b = r + (k / 256u) * 54u;
            return tq1_quad(b, k % 256u) * half0(b + 52u);
        }
        case 35u: {
            // TQ2_0: 2-bit values, f16 d.
            let b = r + (k / 256u) * 66u;
            return tq2_quad(b, k % 256u) * half0(b + 64u);
        }
        case 16u, 17u, 18u, 19u, 21u, 22u, 29u: {
            // The lattice i-quants (grid entries with signs or a delta).
            return lattice_quad(T0, r, k);
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
