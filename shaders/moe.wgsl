// The mixture-of-experts ops (op family "moe"; mul_mat_id is the mat-vecs' ID variants:
// `mat_vec_q.wgsl` and `mat_vec.wgsl`).
//
// OP 1, add_id: one invocation per element of dst: src0 plus the row of src1 [n, n_rows] that
// src2 names for the element's (e, t) (an id out of range adds 0).
// OP 2, sort: one workgroup per row of src0 (f32, at most SORT_MAX values, padded to u.z, a
// power of two): the first ne0 of dst's i32 indices in order, largest first when u.y is 1,
// smallest first otherwise; NaNs last, equal values in index order (stable, as the CPU).
// Params: u.x: invocations (OP 1) or rows (OP 2).

const OP: u32 = {{OP}}u;
const SORT_MAX: u32 = 1024u;

var<workgroup> sv: array<f32, 1024>;
var<workgroup> si: array<u32, 1024>;

// Id (e, t) of src2.
fn id_at(e: u32, t: u32) -> i32 {
    return bitcast<i32>(s2w((P.off.w + e * P.s2.nb.x + t * P.s2.nb.y) >> 2u));
}

// Whether sort entry a comes before entry b (padding, index n or more, last).
fn before(a: u32, b: u32, n: u32, desc: bool) -> bool {
    let ia = si[a];
    let ib = si[b];
    let pa = ia >= n;
    let pb = ib >= n;
    if pa != pb {
        return pb;
    }
    let va = sv[a];
    let vb = sv[b];
    let na = va != va;
    let nb = vb != vb;
    if na != nb {
        return nb;
    }
    if !na && va != vb {
        if desc {
            return va > vb;
        }
        return va < vb;
    }
    return ia < ib;
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    if OP == 2u {
        let row = group(wg, nwg);
        if row >= P.u.x {
            return;
        }
        let c = coords(row * P.s0.ne.x, P.s0.ne);
        let base = P.off.y + at(c, P.s0.nb);
        let n = P.s0.ne.x;
        let n2 = P.u.z;
        let desc = P.u.y == 1u;
        for (var j = li; j < n2; j += {{WG}}u) {
            var v = 0.0;
            if j < n {
                v = ld0(base + j * P.s0.nb.x);
            }
            sv[j] = v;
            si[j] = j;
        }
        workgroupBarrier();
        // Bitonic sort: runs of length k merged in passes of stride j.
        for (var k = 2u; k <= n2; k <<= 1u) {
            for (var j = k >> 1u; j > 0u; j >>= 1u) {
                for (var a = li; a < n2; a += {{WG}}u) {
                    let b = a ^ j;
                    if b > a {
                        let up = (a & k) == 0u;
                        let swap = select(before(a, b, n, desc), before(b, a, n, desc), up);
                        if swap {
                            let tv = sv[a];
                            sv[a] = sv[b];
                            sv[b] = tv;
                            let ti = si[a];
                            si[a] = si[b];
                            si[b] = ti;
                        }
                    }
                }
                workgroupBarrier();
            }
        }
        let out = P.off.x + c.y * P.d.nb.y + c.z * P.d.nb.z + c.w * P.d.nb.w;
        for (var j = li; j < P.d.ne.x; j += {{WG}}u) {
            put_word((out + j * P.d.nb.x) >> 2u, si[j]);
        }
        return;
    }
    let i = linear(wg, nwg, li);
    if i >= P.u.x {
        return;
    }
    let c = coords(i, P.d.ne);
    let r = id_at(c.y, c.z);
    var bias = 0.0;
    if r >= 0 && u32(r) < P.s1.ne.y {
        bias = ld1(P.off.z + c.x * P.s1.nb.x + u32(r) * P.s1.nb.y);
    }
    st(P.off.x + at(c, P.d.nb), ld0(P.off.y + at(c, P.s0.nb)) + bias);
}
