// Unary functions, scale, clamp, and copies with type conversion (op family "unary").
//
// One invocation per element of src0, visited in src0's logical order and written to dst in
// dst's logical order (dst may have another shape of the same element count: cpy).
// Defines: OP: 0 convert-copy, 1 scale, 2 clamp, 3 raw 32-bit copy, 4 dequantizing copy
// (src0 quantized, rows contiguous), 5 byte copy of quantized rows into a contiguous dst
// (one invocation per word of dst), 6 quantizing copy (one invocation per block of dst,
// QK values),
// 10 + i for the i-th op of UnaryOp::ALL.
// Params: f.x, f.y: scale and bias, or min and max; u.x: invocations; u.y, u.z: bytes and
// row bytes of the byte copy.

const OP: u32 = {{OP}}u;

// tanh that never overflows.
fn tanh_s(x: f32) -> f32 {
    let e = exp(-2.0 * abs(x));
    return sign(x) * (1.0 - e) / (1.0 + e);
}

// erf (Abramowitz and Stegun 7.1.26, |error| < 1.5e-7).
fn erf_s(x: f32) -> f32 {
    let a = abs(x);
    let t = 1.0 / (1.0 + 0.3275911 * a);
    let y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * exp(-a * a);
    return sign(x) * y;
}

fn gelu(x: f32) -> f32 {
    return 0.5 * x * (1.0 + tanh_s(0.7978845608028654 * x * (1.0 + 0.044715 * x * x)));
}

fn apply(x: f32) -> f32 {
    switch OP {
        case 1u: { return x * P.f.x + P.f.y; }
        case 2u: { return min(max(x, P.f.x), P.f.y); }
        case 10u: { return x * x; }
        case 11u: { return sqrt(x); }
        case 12u: { return -x; }
        case 13u: { return abs(x); }
        case 14u: { return exp(x); }
        case 15u: { return log(x); }
        case 16u: { return sin(x); }
        case 17u: { return cos(x); }
        case 18u: { return max(x, 0.0); }
        case 19u: { return gelu(x); }
        case 20u: { return 0.5 * x * (1.0 + erf_s(x * 0.7071067811865476)); }
        case 21u: { return x / (1.0 + exp(-x)); }
        case 22u: { return 1.0 / (1.0 + exp(-x)); }
        case 23u: { return tanh_s(x); }
        default: { return x; }
    }
}

#if QDST
// Word i of a byte copy: each byte of dst's tensor from its row in src0.
fn copy_bytes(i: u32) {
    let w = (P.off.x >> 2u) + i;
    var word = 0u;
    var mask = 0u;
    for (var k = 0u; k < 4u; k++) {
        let a = w * 4u + k;
        if a >= P.off.x && a < P.off.x + P.u.y {
            let rel = a - P.off.x;
            let rc = coords((rel / P.u.z) * P.s0.ne.x, P.s0.ne);
            let sb = P.off.y + rc.y * P.s0.nb.y + rc.z * P.s0.nb.z + rc.w * P.s0.nb.w + rel % P.u.z;
            word |= byte0(sb) << (8u * k);
            mask |= 0xffu << (8u * k);
        }
    }
    if mask != 0u {
        put_bits(w, mask, word);
    }
}
#endif

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = linear(wg, nwg, li);
    if i >= P.u.x {
        return;
    }
#if QDST
    if OP == 5u {
        copy_bytes(i);
        return;
    }
    for (var j = 0u; j < QK; j++) {
        xs[j] = ld0(P.off.y + at(coords(i * QK + j, P.s0.ne), P.s0.nb));
    }
    quantize_block(DT, P.off.x + i * P.d.nb.x);
#else
    let c = coords(i, P.s0.ne);
    let db = P.off.x + at(coords(i, P.d.ne), P.d.nb);
    if OP == 3u {
        put_word(db >> 2u, src0[(P.off.y + at(c, P.s0.nb)) >> 2u]);
    } else if OP == 4u {
        st(db, dq(T0, P.off.y + c.y * P.s0.nb.y + c.z * P.s0.nb.z + c.w * P.s0.nb.w, c.x));
    } else {
        st(db, apply(ld0(P.off.y + at(c, P.s0.nb))));
    }
#endif
}
