// Unary functions, scale, clamp, and copies with type conversion (op family "unary").
//
// One invocation per element of src0, visited in src0's logical order and written to dst in
// dst's logical order (dst may have another shape of the same element count: cpy).
// Defines: OP: 0 convert-copy, 1 scale, 2 clamp, 3 raw 32-bit copy, 4 dequantizing copy
// (src0 quantized, rows contiguous), 10 + i for the i-th op of UnaryOp::ALL.
// Params: f.x, f.y: scale and bias, or min and max; u.x: element count.

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

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = linear(wg, nwg, li);
    if i >= P.u.x {
        return;
    }
    let c = coords(i, P.s0.ne);
    let db = P.off.x + at(coords(i, P.d.ne), P.d.nb);
    if OP == 3u {
        st_word(db, src0[(P.off.y + at(c, P.s0.nb)) >> 2u]);
    } else if OP == 4u {
        st(db, dq(T0, P.off.y + c.y * P.s0.nb.y + c.z * P.s0.nb.z + c.w * P.s0.nb.w, c.x));
    } else {
        st(db, apply(ld0(P.off.y + at(c, P.s0.nb))));
    }
}
