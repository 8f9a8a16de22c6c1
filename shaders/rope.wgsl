// Rotary position embedding (op family "rope").
//
// One invocation per rotated pair, and one per element past n_dims (copied). src0 is
// [head_dim, heads, tokens, 1], src1 the i32 positions [tokens].
// Params: f.x: log2(freq_base); f.y: freq_scale; u.x: invocations (pairs + copies per row
// times rows); u.y: n_dims; u.z: mode (0 normal: pairs (2i, 2i+1); 2 neox: (i, i + n_dims/2)).

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = linear(wg, nwg, li);
    if i >= P.u.x {
        return;
    }
    let nd = P.u.y;
    let half = nd / 2u;
    // Per row: half pairs, then head_dim - n_dims copies.
    let per_row = half + P.d.ne.x - nd;
    let k = i % per_row;
    let row = i / per_row;
    let c = coords(row * P.d.ne.x, P.d.ne);
    let sb = P.off.y + at(c, P.s0.nb);
    let db = P.off.x + at(c, P.d.nb);
    if k >= half {
        let e = nd + (k - half);
        st(db + e * P.d.nb.x, ld0(sb + e * P.s0.nb.x));
        return;
    }
    var i0 = 2u * k;
    var i1 = 2u * k + 1u;
    if P.u.z == 2u {
        i0 = k;
        i1 = k + half;
    }
    let pos = f32(bitcast<i32>(src1[(P.off.z + c.z * P.s1.nb.x) >> 2u]));
    let theta = pos * P.f.y * exp2(-P.f.x * f32(2u * k) / f32(nd));
    let cs = cos(theta);
    let sn = sin(theta);
    let x0 = ld0(sb + i0 * P.s0.nb.x);
    let x1 = ld0(sb + i1 * P.s0.nb.x);
    st(db + i0 * P.d.nb.x, x0 * cs - x1 * sn);
    st(db + i1 * P.d.nb.x, x0 * sn + x1 * cs);
}
