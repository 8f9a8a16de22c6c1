#if H16
enable f16;
#endif
#if COOP
enable wgpu_cooperative_matrix;
#endif
// Shared by every op family (prepended to each): the bindings, the per-op parameter block,
// and typed loads and stores over byte addresses.
//
// Template defines (see backend-wgpu/src/shader.rs): T0..T3 the source types and DT the
// destination type, as GGUF type ids (0 f32, 1 f16, 26 i32, 30 bf16, quantized ids for
// quantized sources); F16 is set when the adapter converts f16 in f32 shaders
// (unpack2x16float); H16 (mat_mat only) when the adapter has SHADER_F16 and the shader
// computes in f16 (`enable f16;`, above), and COOP with it when the products run on cooperative
// matrices (`enable wgpu_cooperative_matrix;`); DST16 is set when the destination holds 16-bit values and ATOMIC when
// it holds 16-bit values or quantized blocks: such a destination is written with atomics, so
// that two invocations may write parts of one word.
//
// Every buffer is bound as words (array<u32>) and read_write, so that one buffer may be bound
// twice (a source and the destination in one buffer); tensors are addressed in bytes, with
// ggml's strides nb, from the byte offset of element 0 in its binding.

const T0: u32 = {{T0}}u;
const T1: u32 = {{T1}}u;
const T2: u32 = {{T2}}u;
const T3: u32 = {{T3}}u;
const DT: u32 = {{DT}}u;

// A tensor's shape and byte strides.
struct Desc {
    ne: vec4<u32>,
    nb: vec4<u32>,
}

// One op's parameters: 256 bytes, at a dynamic offset in the graph's parameter buffer.
struct Params {
    d: Desc,
    s0: Desc,
    s1: Desc,
    s2: Desc,
    s3: Desc,
    // Byte offsets of element 0 of dst, src0, src1, src2.
    off: vec4<u32>,
    // x: src3's byte offset; y, z, w: op integers.
    off4: vec4<u32>,
    // Op floats.
    f: vec4<f32>,
    g: vec4<f32>,
    // Op integers.
    u: vec4<u32>,
    // More op integers.
    h: vec4<u32>,
}

@group(0) @binding(8) var<uniform> P: Params;
#if ATOMIC
@group(0) @binding(0) var<storage, read_write> dst: array<atomic<u32>>;

// Stores word w at word index i of dst.
fn put_word(i: u32, w: u32) {
    atomicStore(&dst[i], w);
}

// Sets the bits of word i of dst under mask to those of w, leaving the others: two
// invocations may write disjoint bits of one word.
fn put_bits(i: u32, mask: u32, w: u32) {
    atomicAnd(&dst[i], ~mask);
    atomicOr(&dst[i], w & mask);
}

// Stores the low byte of v at byte b of dst.
fn put_byte(b: u32, v: u32) {
    let sh = (b & 3u) * 8u;
    put_bits(b >> 2u, 0xffu << sh, v << sh);
}
#else
@group(0) @binding(0) var<storage, read_write> dst: array<u32>;

// Stores word w at word index i of dst.
fn put_word(i: u32, w: u32) {
    dst[i] = w;
}
#endif
// A4 and Y4 (set by mat-vec variants whose weights, resp. f32 activations, start at 16-byte
// aligned offsets with 16-byte aligned strides) bind src0, resp. src1, as vec4<u32> words, for
// 16-byte loads; s0w and s1w read one word of either layout.
#if A4
@group(0) @binding(1) var<storage, read_write> src0: array<vec4<u32>>;
fn s0w(i: u32) -> u32 { return src0[i >> 2u][i & 3u]; }
// The index of src0's last word.
fn last0() -> u32 { return arrayLength(&src0) * 4u - 1u; }
#else
@group(0) @binding(1) var<storage, read_write> src0: array<u32>;
#if W3
// W3 (the fused expert gate/up of `mat_vec`): the weights' words come from src3 (a second
// matrix laid out as src0) while `from3` is set, so that one dequantization reads either.
var<private> from3: bool;
fn s0w(i: u32) -> u32 {
    if from3 {
        return src3[i];
    }
    return src0[i];
}
fn last0() -> u32 {
    if from3 {
        return arrayLength(&src3) - 1u;
    }
    return arrayLength(&src0) - 1u;
}
#else
fn s0w(i: u32) -> u32 { return src0[i]; }
fn last0() -> u32 { return arrayLength(&src0) - 1u; }
#endif
#endif
#if Y4
@group(0) @binding(2) var<storage, read_write> src1: array<vec4<u32>>;
fn s1w(i: u32) -> u32 { return src1[i >> 2u][i & 3u]; }
#else
@group(0) @binding(2) var<storage, read_write> src1: array<u32>;
fn s1w(i: u32) -> u32 { return src1[i]; }
#endif
// B4 (the fused gate/up mat-vec, whose src2 holds a second weight matrix laid out as src0)
// binds src2 as vec4<u32> words as A4 does src0.
#if B4
@group(0) @binding(3) var<storage, read_write> src2: array<vec4<u32>>;
fn s2w(i: u32) -> u32 { return src2[i >> 2u][i & 3u]; }
fn last2() -> u32 { return arrayLength(&src2) * 4u - 1u; }
#else
@group(0) @binding(3) var<storage, read_write> src2: array<u32>;
fn s2w(i: u32) -> u32 { return src2[i]; }
fn last2() -> u32 { return arrayLength(&src2) - 1u; }
#endif
@group(0) @binding(4) var<storage, read_write> src3: array<u32>;

// The f16 in the low 16 bits of h, as f32: with F16 (the adapter converts f16 in f32
// shaders) through unpack2x16float, else in integer arithmetic.
fn half(h: u32) -> f32 {
#if F16
    return unpack2x16float(h).x;
#else
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if e == 0u {
        return select(1.0, -1.0, sign != 0u) * f32(m) * 5.9604645e-8;
    }
    if e == 31u {
        return bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
#endif
}

// The two f16 of word w (the low one first), as f32.
fn halves(w: u32) -> vec2<f32> {
#if F16
    return unpack2x16float(w);
#else
    return vec2<f32>(half(w), half(w >> 16u));
#endif
}

// The value of type t at byte b, given the word w that holds it.
fn typed(w: u32, b: u32, t: u32) -> f32 {
    switch t {
        case 1u: {
            return half(w >> ((b & 2u) * 8u));
        }
        case 30u: {
            return bitcast<f32>(select(w << 16u, w & 0xffff0000u, (b & 2u) != 0u));
        }
        case 26u: {
            return f32(bitcast<i32>(w));
        }
        default: {
            return bitcast<f32>(w);
        }
    }
}

fn ld0(b: u32) -> f32 { return typed(s0w(b >> 2u), b, T0); }
fn ld1(b: u32) -> f32 { return typed(s1w(b >> 2u), b, T1); }
fn ld2(b: u32) -> f32 { return typed(s2w(b >> 2u), b, T2); }
fn ld3(b: u32) -> f32 { return typed(src3[b >> 2u], b, T3); }

// f32 to f16 bits, rounding to nearest even (as the CPU backend does), in integer arithmetic
// so that every driver gives the same bits.
fn f16_bits(v: f32) -> u32 {
    let x = bitcast<u32>(v);
    let sign = (x >> 16u) & 0x8000u;
    let e = i32((x >> 23u) & 0xffu);
    let m = x & 0x7fffffu;
    if e == 255 {
        return sign | 0x7c00u | select(0u, 0x200u, m != 0u);
    }
    let he = e - 112;
    if he >= 31 {
        return sign | 0x7c00u;
    }
    if he <= 0 {
        if he < -10 {
            return sign;
        }
        let mm = m | 0x800000u;
        let shift = u32(14 - he);
        var h = mm >> shift;
        let rest = mm & ((1u << shift) - 1u);
        let half = 1u << (shift - 1u);
        if rest > half || (rest == half && (h & 1u) != 0u) {
            h += 1u;
        }
        return sign | h;
    }
    var h = (u32(he) << 10u) | (m >> 13u);
    let rest = m & 0x1fffu;
    if rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0u) {
        h += 1u;
    }
    return sign | h;
}

// f32 to bf16 bits, rounding to nearest even.
fn bf16_bits(v: f32) -> u32 {
    let x = bitcast<u32>(v);
    if (x & 0x7fffffffu) > 0x7f800000u {
        return (x >> 16u) | 0x40u;
    }
    return (x + 0x7fffu + ((x >> 16u) & 1u)) >> 16u;
}

// Stores v at byte b of dst as type DT.
fn st(b: u32, v: f32) {
#if DST16
    let h = select(bf16_bits(v), f16_bits(v), DT == 1u);
    let sh = (b & 2u) * 8u;
    put_bits(b >> 2u, 0xffffu << sh, h << sh);
#else
    put_word(b >> 2u, select(bitcast<u32>(v), bitcast<u32>(i32(v)), DT == 26u));
#endif
}

// Rotary position embedding of one pair: x rotated by theta = pos * scale * base^(-2k / n_dims)
// for pair index k, with l2b = log2(base). The rope family's shader and the mat-vec over Q, K
// and V with the rope fused in (ROPE in mat_vec_q.wgsl) both rotate with it.
fn rope_rotate(x: vec2<f32>, k: u32, pos: f32, l2b: f32, scale: f32, n_dims: u32) -> vec2<f32> {
    let theta = pos * scale * exp2(-l2b * f32(2u * k) / f32(n_dims));
    let cs = cos(theta);
    let sn = sin(theta);
    return vec2<f32>(x.x * cs - x.y * sn, x.x * sn + x.y * cs);
}

// The element coordinates of linear index i in shape ne (ne.x fastest).
fn coords(i: u32, ne: vec4<u32>) -> vec4<u32> {
    let i0 = i % ne.x;
    let r = i / ne.x;
    let i1 = r % ne.y;
    let r2 = r / ne.y;
    return vec4<u32>(i0, i1, r2 % ne.z, r2 / ne.z);
}

// The (row block, column, i2, i3) of mat-vec workgroup o over `blocks` row blocks of a dst of
// shape ne: the columns of one row block are neighbouring workgroups, so that they run at
// the same time and the block's weights, read from memory by the first of them, come from the
// cache for the others (batched decoding's few columns read each weight once).
fn mat_vec_coords(o: u32, blocks: u32, ne: vec4<u32>) -> vec4<u32> {
    let c = coords(o, vec4<u32>(ne.y, blocks, ne.z, ne.w));
    return vec4<u32>(c.y, c.x, c.z, c.w);
}

// Byte offset of coordinates c with strides nb.
fn at(c: vec4<u32>, nb: vec4<u32>) -> u32 {
    return c.x * nb.x + c.y * nb.y + c.z * nb.z + c.w * nb.w;
}

// The linear index of this invocation in a dispatch of workgroups of WG invocations laid out
// over x then y (x holds at most 65535 workgroups).
fn linear(wg: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wg.y * nwg.x + wg.x) * {{WG}}u + lid;
}

// Workgroup reductions over one value per invocation (li: local_invocation_index); every
// invocation of the workgroup must call them, in uniform control flow.
var<workgroup> red: array<f32, {{WG}}>;

fn wg_sum(v: f32, li: u32) -> f32 {
    red[li] = v;
    workgroupBarrier();
    for (var s = {{WG}}u / 2u; s > 0u; s >>= 1u) {
        if li < s {
            red[li] += red[li + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn wg_max(v: f32, li: u32) -> f32 {
    red[li] = v;
    workgroupBarrier();
    for (var s = {{WG}}u / 2u; s > 0u; s >>= 1u) {
        if li < s {
            red[li] = max(red[li], red[li + s]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

// The workgroup index of a dispatch laid out over x then y.
fn group(wg: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wg.y * nwg.x + wg.x;
}
