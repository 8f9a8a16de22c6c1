// Gated linear units: act(gate) * up (op family "glu").
//
// One invocation per element of dst. With one source (u.y = 0) each src0 row holds the gate
// half then the up half (u.z = 1: up first); with two, gate is src0 and up is src1.
// Defines: OP 0 swiglu, 1 geglu, 2 gpt-oss's clamped swiglu (two sources): with
// x = min(gate, limit) and y = clamp(up, -limit, limit), x * sigmoid(alpha x) * (y + 1).
// Params: u.x: element count; f.x, f.y: the clamped swiglu's alpha and limit.

const OP: u32 = {{OP}}u;

fn act(x: f32) -> f32 {
    if OP == 1u {
        let t = 0.7978845608028654 * x * (1.0 + 0.044715 * x * x);
        let e = exp(-2.0 * abs(t));
        return 0.5 * x * (1.0 + sign(t) * (1.0 - e) / (1.0 + e));
    }
    return x / (1.0 + exp(-x));
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = linear(wg, nwg, li);
    if i >= P.u.x {
        return;
    }
    let c = coords(i, P.d.ne);
    var gate: f32;
    var up: f32;
    if P.u.y == 0u {
        let half = c.x * P.s0.nb.x;
        let n = P.d.ne.x * P.s0.nb.x;
        let row = P.off.y + at(vec4<u32>(0u, c.yzw), P.s0.nb);
        let first = ld0(row + half);
        let second = ld0(row + n + half);
        gate = select(first, second, P.u.z != 0u);
        up = select(second, first, P.u.z != 0u);
    } else {
        gate = ld0(P.off.y + at(c, P.s0.nb));
        up = ld1(P.off.z + at(c, P.s1.nb));
    }
    if OP == 2u {
        let x = min(gate, P.f.y);
        let y = clamp(up, -P.f.y, P.f.y);
        st(P.off.x + at(c, P.d.nb), x / (1.0 + exp(-P.f.x * x)) * (y + 1.0));
        return;
    }
    st(P.off.x + at(c, P.d.nb), act(gate) * up);
}
