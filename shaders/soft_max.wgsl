// softmax(x * scale + slope * mask) over each row (op family "soft_max").
//
// One workgroup per row of src0; src1 is the mask (when u.y = 1), its rows picked by the
// row's index in dims 1-3 (dims 2-3 broadcast). Params: f.x: scale; f.y: max_bias;
// f.z, f.w: ALiBi m0, m1; u.x: rows; u.y: has mask; u.z: n_head_log2.

// The f32 at byte b of dst (a value this invocation wrote).
fn ld_dst(b: u32) -> f32 {
    return bitcast<f32>(dst[b >> 2u]);
}

// The ALiBi slope of head h (1 without ALiBi).
fn slope(h: u32) -> f32 {
    if P.f.y <= 0.0 {
        return 1.0;
    }
    if h < P.u.z {
        return pow(P.f.z, f32(h + 1u));
    }
    return pow(P.f.w, f32(2u * (h - P.u.z) + 1u));
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = group(wg, nwg);
    if row >= P.u.x {
        return;
    }
    let c = coords(row * P.d.ne.x, P.d.ne);
    let sb = P.off.y + at(c, P.s0.nb);
    let db = P.off.x + at(c, P.d.nb);
    let mb = P.off.z + c.y * P.s1.nb.y + (c.z % P.s1.ne.z) * P.s1.nb.z + (c.w % P.s1.ne.w) * P.s1.nb.w;
    let has_mask = P.u.y != 0u;
    let m = slope(c.z);
    let n = P.s0.ne.x;
    var mx = -3.4028235e38;
    for (var i = li; i < n; i += {{WG}}u) {
        var x = ld0(sb + i * P.s0.nb.x) * P.f.x;
        if has_mask {
            x += m * ld1(mb + i * P.s1.nb.x);
        }
        mx = max(mx, x);
    }
    mx = wg_max(mx, li);
    var s = 0.0;
    for (var i = li; i < n; i += {{WG}}u) {
        var x = ld0(sb + i * P.s0.nb.x) * P.f.x;
        if has_mask {
            x += m * ld1(mb + i * P.s1.nb.x);
        }
        let e = exp(x - mx);
        s += e;
        st(db + i * P.d.nb.x, e);
    }
    let inv = 1.0 / wg_sum(s, li);
    for (var i = li; i < n; i += {{WG}}u) {
        st(db + i * P.d.nb.x, ld_dst(db + i * P.d.nb.x) * inv);
    }
}
