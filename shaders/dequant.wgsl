// Block dequantization of src0 (included by the families that read quantized rows).
//
// Block layouts are GGUF's (core/src/quant/*.rs documents each). Blocks are packed with no
// padding, so a block may start at any byte: fields are read byte by byte from the words of
// src0 and assembled by hand.

// The byte at b.
fn byte0(b: u32) -> u32 {
    return (s0w(b >> 2u) >> ((b & 3u) * 8u)) & 0xffu;
}

// The 32-bit little-endian word starting at any byte b: the two words that hold it, shifted,
// with no branch (the second is clamped to the last word of the binding, whose bits are then
// shifted out). AL (set where every block starts at a multiple of 4 bytes, and every word
// read is at a multiple of 4 in its block) reads the one word.
fn word0(b: u32) -> u32 {
#if AL
    return s0w(b >> 2u);
#else
    let i = b >> 2u;
    let sh = (b & 3u) * 8u;
    return (s0w(i) >> sh) | ((s0w(min(i + 1u, last0())) << 1u) << (31u - sh));
#endif
}

// The f16 at byte b (2-byte aligned) of a block, held in word w (the word of b), as f32.
fn half_in(w: u32, b: u32) -> f32 {
    return half(w >> ((b & 2u) * 8u));
}

// The i8 at byte b of a block, held in word w (the word of b), as f32.
fn i8_in_word(w: u32, b: u32) -> f32 {
    return f32(bitcast<i32>(((w >> ((b & 3u) * 8u)) & 0xffu) << 24u) >> 24u);
}

// The f16 at byte b (2-byte aligned in every layout), as f32.
fn half0(b: u32) -> f32 {
    return half_in(s0w(b >> 2u), b);
}

// The i8 at byte b, as f32.
fn i8_0(b: u32) -> f32 {
    return i8_in_word(s0w(b >> 2u), b);
}

// The 6-bit scale and min of sub-block j from the 12-byte field at byte s (Q4_K, Q5_K).
fn scale_min_k4(s: u32, j: u32) -> vec2<u32> {
    if j < 4u {
        return vec2<u32>(byte0(s + j) & 63u, byte0(s + j + 4u) & 63u);
    }
    let x = byte0(s + j + 4u);
    return vec2<u32>((x & 15u) | ((byte0(s + j - 4u) >> 6u) << 4u), (x >> 4u) | ((byte0(s + j) >> 6u) << 4u));
}

// The 16-entry int8 tables of IQ4_NL / IQ4_XS (non-linear values) and MXFP4 (E2M1 values
// doubled), as four little-endian words each.
const IQ4_TABLE: vec4<u32> = vec4<u32>(0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u);
const MXFP4_TABLE: vec4<u32> = vec4<u32>(0x03020100u, 0x0c080604u, 0xfdfeff00u, 0xf4f8fafcu);

// Entry i (< 16) of table t, as f32.
fn table16(t: vec4<u32>, i: u32) -> f32 {
    let w = select(select(t.x, t.y, i >= 4u), select(t.z, t.w, i >= 12u), i >= 8u);
    return f32(bitcast<i32>(((w >> ((i & 3u) * 8u)) & 0xffu) << 24u) >> 24u);
}

// Entries q (each < 16) of table t.
fn table16x4(t: vec4<u32>, q: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(table16(t, q.x), table16(t, q.y), table16(t, q.z), table16(t, q.w));
}

// 2^(e - 128): half an E8M0 scale (MXFP4's table holds its values doubled).
fn e8m0_half(e: u32) -> f32 {
    return bitcast<f32>(select((e - 1u) << 23u, 0x00200000u << e, e < 2u));
}

// The scale d * (ls - 32) of sub-block s of the IQ4_XS block at byte b.
fn iq4_xs_scale(b: u32, s: u32) -> f32 {
    let lo = (byte0(b + 4u + s / 2u) >> (4u * (s % 2u))) & 15u;
    let hi = (byte0(b + 2u + s / 4u) >> (2u * (s % 4u))) & 3u;
    return half0(b) * f32(i32(lo | (hi << 4u)) - 32);
}

// The four bytes of word q, each shifted right by sh and masked (mul_mat.wgsl's fields4, for
// the families without it).
fn quad_fields(q: u32, sh: u32, mask: u32) -> vec4<u32> {
    return (vec4<u32>(q) >> (vec4<u32>(0u, 8u, 16u, 24u) + sh)) & vec4<u32>(mask);
}

// Values v..v+3 (v a multiple of 4) of the TQ1_0 block at byte b, less 1 (each -1, 0 or 1; the
// layout is in core/src/quant/tq.rs): a word of 4 bytes, each holding digit k of its base-3
// fraction, read back as ((byte * 3^k) mod 256) * 3 >> 8.
fn tq1_quad(b: u32, v: u32) -> vec4<f32> {
    var off = 48u;
    var k = (v - 240u) / 4u;
    if v < 160u {
        off = v % 32u;
        k = v / 32u;
    } else if v < 240u {
        off = 32u + (v - 160u) % 16u;
        k = (v - 160u) / 16u;
    }
    let p = select(select(select(select(81u, 27u, k < 4u), 9u, k < 3u), 3u, k < 2u), 1u, k < 1u);
    let q = ((quad_fields(word0(b + off), 0u, 255u) * vec4<u32>(p)) & vec4<u32>(255u)) * vec4<u32>(3u);
    return vec4<f32>(q >> vec4<u32>(8u)) - 1.0;
}

// Values v..v+3 (v a multiple of 4) of the TQ2_0 block at byte b, less 1: bits 2l of the
// bytes 32c + m.. (value 128c + 32l + m).
fn tq2_quad(b: u32, v: u32) -> vec4<f32> {
    return vec4<f32>(quad_fields(word0(b + 32u * (v / 128u) + v % 32u), 2u * ((v / 32u) % 4u), 3u)) - 1.0;
}

// The lattice i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S): 256-value
// blocks of 32 groups of 8 values, each group one or two grid entries with signs (or a delta)
// and a scale. The grids are one read-only buffer (backend-wgpu/src/grids.rs), bound where
// GRID is set (src0 is one of these types); each grid starts at the word offset named here.
#if GRID
@group(0) @binding(11) var<storage, read> grids: array<u32>;
#endif
const GRID_IQ1S: u32 = 0u;
const GRID_IQ2XXS: u32 = 4096u;
const GRID_IQ2XS: u32 = 4608u;
const GRID_IQ2S: u32 = 5632u;
const GRID_IQ3XXS: u32 = 7680u;
const GRID_IQ3S: u32 = 7936u;

// Word i of the grids (0 where GRID is off: no lattice type is read).
fn grid_word(i: u32) -> u32 {
#if GRID
    return grids[i];
#else
    return 0u;
#endif
}

// Bytes per block of lattice type t.
fn lattice_size(t: u32) -> u32 {
    switch t {
        case 16u: { return 66u; }
        case 17u: { return 74u; }
        case 18u: { return 98u; }
        case 19u: { return 50u; }
        case 21u: { return 110u; }
        case 22u: { return 82u; }
        default: { return 56u; }
    }
}

// The u16 at byte b (2-byte aligned: it never crosses a word).
fn u16_0(b: u32) -> u32 {
    return (s0w(b >> 2u) >> ((b & 2u) * 8u)) & 0xffffu;
}

// Eight sign bits from seven: bit 7 is set where bits 0..7 hold an odd count.
fn ksigns(b7: u32) -> u32 {
    let b = b7 & 127u;
    return b | ((countOneBits(b) & 1u) << 7u);
}

// The four unsigned bytes of grid word w times db, each negated where its bit of s is set
// (the sign bit flipped, as the CPU does).
fn signed_quad(w: u32, s: u32, db: f32) -> vec4<f32> {
    let v = bitcast<vec4<u32>>(vec4<f32>(quad_fields(w, 0u, 255u)) * db);
    let m = ((vec4<u32>(s) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u)) << vec4<u32>(31u);
    return bitcast<vec4<f32>>(v ^ m);
}

// The signed bytes of grid word w, plus delta, times dl (IQ1_S / IQ1_M).
fn delta_quad(w: u32, delta: f32, dl: f32) -> vec4<f32> {
    let v = vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(w) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
    return dl * (v + delta);
}

// The 8 values of group g (values 8g..8g+7) of the block of lattice type t at byte b, as
// two quads (layouts: core/src/quant/iq1.rs, iq2.rs, iq3.rs).
fn lattice_group(t: u32, b: u32, g: u32) -> array<vec4<f32>, 2> {
    let ib = g / 4u;
    let l = g % 4u;
    switch t {
        case 16u: {
            // IQ2_XXS: per 32 values 4 index bytes, then a word of 4 x 7 sign bits and a
            // 4-bit scale.
            let aux = word0(b + 6u + 8u * ib);
            let db = half0(b) * (0.5 + f32(aux >> 28u)) * 0.25;
            let i = GRID_IQ2XXS + 2u * byte0(b + 2u + 8u * ib + l);
            let s = ksigns(aux >> (7u * l));
            return array(signed_quad(grid_word(i), s, db), signed_quad(grid_word(i + 1u), s >> 4u, db));
        }
        case 17u: {
            // IQ2_XS: a u16 per group (9-bit index, 7 sign bits), 4-bit scales per 16 values.
            let q = u16_0(b + 2u + 2u * g);
            let sc = (byte0(b + 66u + ib) >> (4u * (l / 2u))) & 15u;
            let db = half0(b) * (0.5 + f32(sc)) * 0.25;
            let i = GRID_IQ2XS + 2u * (q & 511u);
            let s = ksigns(q >> 9u);
            return array(signed_quad(grid_word(i), s, db), signed_quad(grid_word(i + 1u), s >> 4u, db));
        }
        case 22u: {
            // IQ2_S: index low bytes, sign bytes, 2 high index bits per group, scales as IQ2_XS.
            let idx = byte0(b + 2u + g) | (((byte0(b + 66u + ib) >> (2u * l)) & 3u) << 8u);
            let sc = (byte0(b + 74u + ib) >> (4u * (l / 2u))) & 15u;
            let db = half0(b) * (0.5 + f32(sc)) * 0.25;
            let i = GRID_IQ2S + 2u * idx;
            let s = byte0(b + 34u + g);
            return array(signed_quad(grid_word(i), s, db), signed_quad(grid_word(i + 1u), s >> 4u, db));
        }
        case 18u: {
            // IQ3_XXS: two index bytes per group, then per 32 values a word of 4 x 7 sign bits
            // and a 4-bit scale.
            let aux = word0(b + 66u + 4u * ib);
            let db = half0(b) * (0.5 + f32(aux >> 28u)) * 0.5;
            let q = u16_0(b + 2u + 2u * g);
            let s = ksigns(aux >> (7u * l));
            return array(signed_quad(grid_word(GRID_IQ3XXS + (q & 255u)), s, db), signed_quad(grid_word(GRID_IQ3XXS + (q >> 8u)), s >> 4u, db));
        }
        case 21u: {
            // IQ3_S: two index low bytes per group, a high bit each, sign bytes, 4-bit scales
            // per 32 values.
            let sc = (byte0(b + 106u + ib / 2u) >> (4u * (ib % 2u))) & 15u;
            let db = half0(b) * f32(1u + 2u * sc);
            let qh = byte0(b + 66u + ib) >> (2u * l);
            let q = u16_0(b + 2u + 2u * g);
            let i1 = (q & 255u) | ((qh & 1u) << 8u);
            let i2 = (q >> 8u) | ((qh & 2u) << 7u);
            let s = byte0(b + 74u + g);
            return array(signed_quad(grid_word(GRID_IQ3S + i1), s, db), signed_quad(grid_word(GRID_IQ3S + i2), s >> 4u, db));
        }
        case 19u: {
            // IQ1_S: index low bytes, then per 32 values a u16 of 3 high index bits per group,
            // a 3-bit scale and the delta's sign.
            let qh = u16_0(b + 34u + 2u * ib);
            let dl = half0(b) * f32(2u * ((qh >> 12u) & 7u) + 1u);
            let delta = select(0.125, -0.125, (qh & 0x8000u) != 0u);
            let i = GRID_IQ1S + 2u * (byte0(b + 2u + g) | (((qh >> (3u * l)) & 7u) << 8u));
            return array(delta_quad(grid_word(i), delta, dl), delta_quad(grid_word(i + 1u), delta, dl));
        }
        default: {
            // IQ1_M: index low bytes, a nibble per group (3 high index bits, the delta's sign),
            // 3-bit scales per 16 values whose words' top nibbles make the f16 d.
            let w0 = word0(b + 48u);
            let w1 = word0(b + 52u);
            let bits = ((w0 >> 12u) & 0xfu) | ((w0 >> 24u) & 0xf0u) | ((w1 >> 4u) & 0xf00u) | ((w1 >> 16u) & 0xf000u);
            let sw = select(w0, w1, ib >= 4u) >> (16u * ((ib / 2u) % 2u));
            let s = (sw >> (6u * (ib % 2u) + 3u * (l / 2u))) & 7u;
            let dl = half(bits) * f32(2u * s + 1u);
            let h = byte0(b + 32u + 2u * ib + l / 2u) >> (4u * (l % 2u));
            let delta = select(0.125, -0.125, (h & 8u) != 0u);
            let i = GRID_IQ1S + 2u * (byte0(b + 4u * ib + l) | ((h & 7u) << 8u));
            return array(delta_quad(grid_word(i), delta, dl), delta_quad(grid_word(i + 1u), delta, dl));
        }
    }
}

// Values e..e+3 (e a multiple of 4) of the row of lattice type t at byte r.
fn lattice_quad(t: u32, r: u32, e: u32) -> vec4<f32> {
    let g = lattice_group(t, r + (e / 256u) * lattice_size(t), (e % 256u) / 8u);
    return g[(e / 4u) % 2u];
}

// Element j of a row of quantized type t (a GGUF type id) starting at byte r.
fn dq(t: u32, r: u32, j: u32) -> f32 {
    switch t {
        case 2u: {
            // Q4_0: f16 d, 16 bytes of nibbles.
            let b = r + (j / 32u) * 18u;
            let e = j % 32u;
            let q = (byte0(b + 2u + e % 16u) >> ((e / 16u) * 4u)) & 15u;
            return (f32(q) - 8.0) * half0(b);
        }
        case 3u: {
            // Q4_1: f16 d, f16 m, 16 bytes of nibbles.
            let b = r + (j / 32u) * 20u;
            let e = j % 32u;
            let q = (byte0(b + 4u + e % 16u) >> ((e / 16u) * 4u)) & 15u;
            return f32(q) * half0(b) + half0(b + 2u);
        }
        case 6u: {
            // Q5_0: f16 d, u32 qh, 16 bytes of nibbles.
            let b = r + (j / 32u) * 22u;
            let e = j % 32u;
            let q = ((byte0(b + 6u + e % 16u) >> ((e / 16u) * 4u)) & 15u) | (((word0(b + 2u) >> e) & 1u) << 4u);
            return (f32(q) - 16.0) * half0(b);
        }
        case 7u: {
            // Q5_1: f16 d, f16 m, u32 qh, 16 bytes of nibbles.
            let b = r + (j / 32u) * 24u;
            let e = j % 32u;
            let q = ((byte0(b + 8u + e % 16u) >> ((e / 16u) * 4u)) & 15u) | (((word0(b + 4u) >> e) & 1u) << 4u);
            return f32(q) * half0(b) + half0(b + 2u);
        }
        case 8u: {
            // Q8_0: f16 d, 32 x i8.
            let b = r + (j / 32u) * 34u;
            return i8_0(b + 2u + j % 32u) * half0(b);
        }
        case 10u: {
            // Q2_K: 16 scale/min bytes, 64 bytes qs, f16 d, f16 dmin.
            let b = r + (j / 256u) * 84u;
            let e = j % 256u;
            let q = (byte0(b + 16u + 32u * (e / 128u) + e % 32u) >> (2u * ((e / 32u) % 4u))) & 3u;
            let sc = byte0(b + e / 16u);
            return half0(b + 80u) * f32(sc & 15u) * f32(q) - half0(b + 82u) * f32(sc >> 4u);
        }
        case 11u: {
            // Q3_K: 32 bytes hmask, 64 bytes qs, 12 bytes scales, f16 d.
            let b = r + (j / 256u) * 110u;
            let e = j % 256u;
            let n = e / 128u;
            let k = (e / 32u) % 4u;
            let l = e % 32u;
            let low = (byte0(b + 32u + 32u * n + l) >> (2u * k)) & 3u;
            let high = (byte0(b + l) >> (4u * n + k)) & 1u;
            let s = e / 16u;
            let sl = select(byte0(b + 96u + s - 8u) >> 4u, byte0(b + 96u + s) & 15u, s < 8u);
            let sh = (byte0(b + 104u + s % 4u) >> (2u * (s / 4u))) & 3u;
            let scale = i32(sl | (sh << 4u)) - 32;
            return half0(b + 108u) * f32(scale) * f32(i32(low | (high << 2u)) - 4);
        }
        case 12u: {
            // Q4_K: f16 d, f16 dmin, 12 bytes scales and mins, 128 bytes qs.
            let b = r + (j / 256u) * 144u;
            let e = j % 256u;
            let q = (byte0(b + 16u + 32u * (e / 64u) + e % 32u) >> (4u * ((e / 32u) % 2u))) & 15u;
            let sm = scale_min_k4(b + 4u, e / 32u);
            return half0(b) * f32(sm.x) * f32(q) - half0(b + 2u) * f32(sm.y);
        }
        case 13u: {
            // Q5_K: f16 d, f16 dmin, 12 bytes scales and mins, 32 bytes qh, 128 bytes qs.
            let b = r + (j / 256u) * 176u;
            let e = j % 256u;
            let k = e / 64u;
            let hi = (e / 32u) % 2u;
            let low = (byte0(b + 48u + 32u * k + e % 32u) >> (4u * hi)) & 15u;
            let high = (byte0(b + 16u + e % 32u) >> (2u * k + hi)) & 1u;
            let sm = scale_min_k4(b + 4u, e / 32u);
            return half0(b) * f32(sm.x) * f32(low | (high << 4u)) - half0(b + 2u) * f32(sm.y);
        }
        case 14u: {
            // Q6_K: 128 bytes ql, 64 bytes qh, 16 x i8 scales, f16 d.
            let b = r + (j / 256u) * 210u;
            let e = j % 256u;
            let n = e / 128u;
            let m = (e / 32u) % 4u;
            let l = e % 32u;
            let low = (byte0(b + 64u * n + 32u * (m % 2u) + l) >> (4u * (m / 2u))) & 15u;
            let high = (byte0(b + 128u + 32u * n + l) >> (2u * m)) & 3u;
            return half0(b + 208u) * i8_0(b + 192u + e / 16u) * f32(i32(low | (high << 4u)) - 32);
        }
        case 20u: {
            // IQ4_NL: f16 d, 16 bytes of nibbles indexing IQ4_TABLE.
            let b = r + (j / 32u) * 18u;
            let e = j % 32u;
            let q = (byte0(b + 2u + e % 16u) >> ((e / 16u) * 4u)) & 15u;
            return half0(b) * table16(IQ4_TABLE, q);
        }
        case 23u: {
            // IQ4_XS: f16 d, u16 high scale bits, 4 bytes low scale bits, 8 x 16 bytes of
            // nibbles (each 32 values as IQ4_NL's).
            let b = r + (j / 256u) * 136u;
            let e = j % 256u;
            let l = e % 32u;
            let q = (byte0(b + 8u + 16u * (e / 32u) + l % 16u) >> ((l / 16u) * 4u)) & 15u;
            return iq4_xs_scale(b, e / 32u) * table16(IQ4_TABLE, q);
        }
        case 39u: {
            // MXFP4: E8M0 exponent, 16 bytes of nibbles indexing MXFP4_TABLE.
            let b = r + (j / 32u) * 17u;
            let e = j % 32u;
            let q = (byte0(b + 1u + e % 16u) >> ((e / 16u) * 4u)) & 15u;
            return table16(MXFP4_TABLE, q) * e8m0_half(byte0(b));
        }
        case 34u: {
            // TQ1_0: 48 + 4 bytes of base-3 digits, f16 d.
            let b = r + (j / 256u) * 54u;
            let e = j % 256u;
            return tq1_quad(b, e & ~3u)[e & 3u] * half0(b + 52u);
        }
        case 35u: {
            // TQ2_0: 64 bytes of 2-bit values, f16 d.
            let b = r + (j / 256u) * 66u;
            let e = j % 256u;
            return tq2_quad(b, e & ~3u)[e & 3u] * half0(b + 64u);
        }
        case 16u, 17u, 18u, 19u, 21u, 22u, 29u: {
            return lattice_quad(t, r, j & ~3u)[j & 3u];
        }
        default: {
            return 0.0;
        }
    }
}
