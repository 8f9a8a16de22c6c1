// Rotary position embedding (op family "rope").
//
// One invocation per rotated pair, and one per element past n_dims (copied). src0 is
// [head_dim, heads, tokens, 1], src1 the i32 positions [tokens].
// Params: f.x: log2(freq_base); f.y: freq_scale; u.x: invocations (pairs + copies per row
// times rows); u.y: n_dims; u.z: mode (0 normal: pairs (2i, 2i+1); 2 neox: (i, i + n_dims/2)).
//
// rope_ext's additions: FACTORS, f32 frequency factors [n_dims / 2] (src2; with KV, WGSL
// binding 9 at byte offset h.x) divide each pair's unscaled angle theta; BLEND, the angle is
// freq_scale * theta * (1 - ramp) + theta * ramp with ramp = (1 - clamp((k - f.w) * g.x, 0,
// 1)) * f.z (f.z ext_factor, f.w YaRN's first corrected pair, g.x the inverse of the
// correction range's width) and the result is multiplied by g.y (the magnitude).
//
// KV (fused: rope of Q and K, then set_rows of the rotated K and of V into their caches at
// the same rows): dst is the K cache (type DT, rows of head_dim x heads values), src0 K, src1
// the positions, src2 the row indices (i32 or i64: their low words) [tokens], src3 V
// [n_v, tokens] (f32), binding 5 the V cache (laid out as the K cache; byte offset off4.y),
// binding 6 Q and binding 7 the rotated Q (f32, K's head_dim, u.w heads; byte offsets off4.z
// and off4.w; row and token strides h.x, h.y for Q and h.z, h.w for its result, or with
// FACTORS, whose offset h.x holds, both contiguous). Per token: the invocations of Q's rows,
// then of K's, then one per value of V.

// The positions in its row of pair k (k below n_dims / 2).
fn pair(k: u32) -> vec2<u32> {
    if P.u.z == 2u {
        return vec2<u32>(k, k + P.u.y / 2u);
    }
    return vec2<u32>(2u * k, 2u * k + 1u);
}

#if FACTORS
#if KV
@group(0) @binding(9) var<storage, read_write> freq_factors: array<f32>;
#endif

// The frequency factor of pair k.
fn factor(k: u32) -> f32 {
#if KV
    return freq_factors[(P.h.x >> 2u) + k];
#else
    return ld2(P.off.w + 4u * k);
#endif
}
#endif

// The pair (x0, x1) of pair index k rotated for position pos (rope_rotate of common.wgsl with
// this op's parameters; with FACTORS or BLEND, rope_ext's rotation).
fn rotate(x: vec2<f32>, k: u32, pos: f32) -> vec2<f32> {
#if BLEND
    var theta = pos * exp2(-P.f.x * f32(2u * k) / f32(P.u.y));
#if FACTORS
    theta /= factor(k);
#endif
    let ramp = (1.0 - clamp((f32(k) - P.f.w) * P.g.x, 0.0, 1.0)) * P.f.z;
    let angle = P.f.y * theta * (1.0 - ramp) + theta * ramp;
    let cs = cos(angle);
    let sn = sin(angle);
    return P.g.y * vec2<f32>(x.x * cs - x.y * sn, x.x * sn + x.y * cs);
#else
#if FACTORS
    return rope_rotate(x, k, pos / factor(k), P.f.x, P.f.y, P.u.y);
#else
    return rope_rotate(x, k, pos, P.f.x, P.f.y, P.u.y);
#endif
#endif
}

// Pair (or copy past n_dims) k of the row at byte sb of src0, rotated for position pos, into
// the row at byte db of dst.
fn rope_row(sb: u32, db: u32, k: u32, pos: f32) {
    let half = P.u.y / 2u;
    if k >= half {
        let e = P.u.y + (k - half);
        st(db + e * P.d.nb.x, ld0(sb + e * P.s0.nb.x));
        return;
    }
    let i = pair(k);
    let y = rotate(vec2<f32>(ld0(sb + i.x * P.s0.nb.x), ld0(sb + i.y * P.s0.nb.x)), k, pos);
    st(db + i.x * P.d.nb.x, y.x);
    st(db + i.y * P.d.nb.x, y.y);
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
@group(0) @binding(6) var<storage, read_write> q_in: array<f32>;
@group(0) @binding(7) var<storage, read_write> q_out: array<f32>;

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
    let nq = per_row * P.u.w;
    let nk = per_row * P.s0.ne.y;
    let per_tok = nq + nk + P.s3.ne.x;
    let t = i / per_tok;
    var k = i % per_tok;
    let pos = position(t);
    if k < nq {
        // Q: head h of token t (f32 values, element stride 4).
        let h = k / per_row;
        k = k % per_row;
#if FACTORS
        let row = h * hd + t * hd * P.u.w;
        let sb = (P.off4.z >> 2u) + row;
        let db = (P.off4.w >> 2u) + row;
#else
        let sb = (P.off4.z + h * P.h.x + t * P.h.y) >> 2u;
        let db = (P.off4.w + h * P.h.z + t * P.h.w) >> 2u;
#endif
        if k >= nd / 2u {
            let e = nd + (k - nd / 2u);
            q_out[db + e] = q_in[sb + e];
            return;
        }
        let p = pair(k);
        let y = rotate(vec2<f32>(q_in[sb + p.x], q_in[sb + p.y]), k, pos);
        q_out[db + p.x] = y.x;
        q_out[db + p.y] = y.y;
        return;
    }
    k -= nq;
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
    rope_row(sb, db, k % per_row, pos);
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
