// rms_norm and norm over each row (op family "norm").
//
// One workgroup per row. Defines: OP 0 rms_norm, 1 norm; MUL: the result times src1, one row
// broadcast over the rows (rms_norm(x) * w fused into one dispatch); ADD (with MUL): plus src2,
// of dst's shape (rms_norm(x) * w + r: a post-norm joining the residual). Params: f.x: eps;
// u.x: rows.

const OP: u32 = {{OP}}u;

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = group(wg, nwg);
    if row >= P.u.x {
        return;
    }
    let c = coords(row * P.d.ne.x, P.d.ne);
    let sb = P.off.y + at(c, P.s0.nb);
    let db = P.off.x + at(c, P.d.nb);
    let n = P.s0.ne.x;
    var mean = 0.0;
    if OP == 1u {
        var s = 0.0;
        for (var i = li; i < n; i += {{WG}}u) {
            s += ld0(sb + i * P.s0.nb.x);
        }
        mean = wg_sum(s, li) / f32(n);
    }
    var s2 = 0.0;
    for (var i = li; i < n; i += {{WG}}u) {
        let x = ld0(sb + i * P.s0.nb.x) - mean;
        s2 += x * x;
    }
    let scale = 1.0 / sqrt(wg_sum(s2, li) / f32(n) + P.f.x);
    for (var i = li; i < n; i += {{WG}}u) {
        var y = (ld0(sb + i * P.s0.nb.x) - mean) * scale;
#if MUL
        y *= ld1(P.off.z + i * P.s1.nb.x);
#endif
#if ADD
        y += ld2(P.off.w + at(c, P.s2.nb) + i * P.s2.nb.x);
#endif
        st(db + i * P.d.nb.x, y);
    }
}
