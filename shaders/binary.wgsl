// Element-wise add, sub, mul, div with src1 broadcast over src0 (op family "binary").
//
// One invocation per element of dst (contiguous, src0's shape). Defines: OP 0 add, 1 sub,
// 2 mul, 3 div. Params: u.x: element count.

const OP: u32 = {{OP}}u;

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = linear(wg, nwg, li);
    if i >= P.u.x {
        return;
    }
    let c = coords(i, P.d.ne);
    let a = ld0(P.off.y + at(c, P.s0.nb));
    let b = ld1(P.off.z + at(c % P.s1.ne, P.s1.nb));
    var r: f32;
    switch OP {
        case 1u: { r = a - b; }
        case 2u: { r = a * b; }
        case 3u: { r = a / b; }
        default: { r = a + b; }
    }
    st(P.off.x + at(c, P.d.nb), r);
}
