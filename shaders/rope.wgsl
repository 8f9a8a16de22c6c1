// Rotary position embedding (op family "rope").
//
// One invocation per rotated pair, and one per element past n_dims (copied). src0 is
// [head_dim, heads, tokens, 1], src1 the i32 positions [tokens].
// Params: f.x: log2(freq_base); f.y: freq_scale; u.x: invocations (pairs + copies per row
// times rows); u.y: n_dims; u.z: mode (0 normal: pairs (2i, 2i+1); 2 neox: (i, i + n_dims/2)).
//
// KV (fused: rope of K, then set_rows of the rotated K and of V into their caches at the same
// rows): dst is the K cache (type DT, rows of head_dim x heads values), src0 K, src1 the
// positions, src2 the row indices (i32 or i64: their low words) [tokens], src3 V
// [n_v, tokens] (f32), binding 5 the V cache (laid out as the K cache; byte offset off4.y).
// Per token: the invocations of K's rows, then one per value of V.

// Pair (or copy past n_dims) k of the row at byte sb of src0, rotated for position pos, into
// the row at byte db of dst.
fn rope_row(sb: u32, db: u32, k: u32, pos: f32) {
    let nd = P.u.y;
    let half = nd / 2u;
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
    let theta = pos * P.f.y * exp2(-P.f.x * f32(2u * k) / f32(nd));
    let cs = cos(theta);
    let sn = sin(theta);
    let x0 = ld0(sb + i0 * P.s0.nb.x);
    let x1 = ld0(sb + i1 * P.s0.nb.x);
    st(db + i0 * P.d.nb.x, x0 * cs - x1 * sn);
    st(db + i1 * P.d.nb.x, x0 * sn + x1 * cs);
}

// The position of token t (i32 in src1).
fn position(t: u32) -> f32 {
    return f32(bitcast<i32>(src1[(P.off.z + t * P.s1.nb.x) >> 2u]));
}

#if KV
#if ATOMIC
@group(0) @binding(5) var<storage, read_write> vcache: array<atomic<u32>>;
#else
@group(0) @binding(5) var<storage, read_write> vcache: array<u32>;
#endif

// Stores v at byte b of the V cache as type DT (st for binding 5).
fn st_v(b: u32, v: f32) {
#if DST16
    let h = select(bf16_bits(v), f16_bits(v), DT == 1u);
    let sh = (b & 2u) * 8u;
    atomicAnd(&vcache[b >> 2u], ~(0xffffu << sh));
    atomicOr(&vcache[b >> 2u], h << sh);
#else
    vcache[b >> 2u] = bitcast<u32>(v);
#endif
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = linear(wg, nwg, li);
    if i >= P.u.x {
        return;
    }
    let nd = P.u.y;
    let hd = P.s0.ne.x;
    let per_row = nd / 2u + hd - nd;
    let nk = per_row * P.s0.ne.y;
    let t = i / (nk + P.s3.ne.x);
    let k = i % (nk + P.s3.ne.x);
    // The cache row of token t (clamped to the cache's rows).
    let r = min(src2[(P.off.w + t * P.s2.nb.x) >> 2u], P.d.ne.y - 1u);
    if k >= nk {
        // V: value e of token t.
        let e = k - nk;
        st_v(P.off4.y + r * P.d.nb.y + e * P.d.nb.x, ld3(P.off4.x + e * P.s3.nb.x + t * P.s3.nb.y));
        return;
    }
    // K: head h, into columns h * hd .. of the cache row.
    let h = k / per_row;
    let sb = P.off.y + h * P.s0.nb.y + t * P.s0.nb.z;
    let db = P.off.x + r * P.d.nb.y + h * hd * P.d.nb.x;
    rope_row(sb, db, k % per_row, position(t));
}
#else
@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = linear(wg, nwg, li);
    if i >= P.u.x {
        return;
    }
    // Per row: n_dims / 2 pairs, then head_dim - n_dims copies.
    let per_row = P.u.y / 2u + P.d.ne.x - P.u.y;
    let row = i / per_row;
    let c = coords(row * P.d.ne.x, P.d.ne);
    rope_row(P.off.y + at(c, P.s0.nb), P.off.x + at(c, P.d.nb), i % per_row, position(c.z));
}
#endif
