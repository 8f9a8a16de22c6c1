// The mixture-of-experts ops (op family "moe"; mul_mat_id is the mat-vecs' ID variants:
// `mat_vec_q.wgsl` and `mat_vec.wgsl`).
//
// OP 1, add_id: one invocation per element of dst: src0 plus the row of src1 [n, n_rows] that
// src2 names for the element's (e, t) (an id out of range adds 0).
// OP 2, sort: one workgroup per row of src0 (f32, at most SORT_MAX values, padded to u.z, a
// power of two): the first ne0 of dst's i32 indices in order, largest first when u.y is 1,
// smallest first otherwise; NaNs last, equal values in index order (stable, as the CPU).
// OP 3, bucket: mul_mat_id's (slot, token) pairs y = e + n_used t grouped by expert for the
// grouped mat-mat (ID in mat_mat.wgsl), in one workgroup: src2 the i32 ids [n_used, n_tokens],
// u.x the id of the first expert src0 holds, u.y how many it holds (X, below BUCKETS), u.z the
// columns of a tile (W), u.w the tile table's entries (T, at least ceil(pairs / W) +
// min(X + 1, pairs)), h.x the table's first word in dst. Bucket x < X takes the pairs routed
// to src0's expert x, bucket X those routed to experts src0 does not hold. dst (u32 words)
// gets the pairs bucket after bucket from word 0 (within a bucket in no set order, which the
// mat-mat's results do not depend on), and the table: T entries of three words (the expert, X
// for bucket X; the entry's first pair in the list; its pairs, 1 to W), one per W pairs of each
// bucket in bucket order, and (0, 0, 0) past the last.
// Params: u.x: invocations (OP 1) or rows (OP 2).

const OP: u32 = {{OP}}u;
const SORT_MAX: u32 = 1024u;
// Buckets of the bucket op at most (experts held and one for the rest).
const BUCKETS: u32 = 512u;

var<workgroup> sv: array<f32, 1024>;
var<workgroup> si: array<u32, 1024>;
// The bucket op's pairs per bucket, then each bucket's next free place in the list.
var<workgroup> bc: array<atomic<u32>, 1024>;
var<workgroup> tiles: u32;

// Id (e, t) of src2.
fn id_at(e: u32, t: u32) -> i32 {
    return bitcast<i32>(s2w((P.off.w + e * P.s2.nb.x + t * P.s2.nb.y) >> 2u));
}

// The bucket of pair y of the bucket op (OP 3).
fn bucket(y: u32) -> u32 {
    let n_used = P.s2.ne.x;
    let x = id_at(y % n_used, y / n_used) - i32(P.u.x);
    return select(P.u.y, u32(x), x >= 0 && u32(x) < P.u.y);
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
    if OP == 3u {
        let nb = P.u.y + 1u;
        let w = P.u.z;
        let pairs = P.s2.ne.x * P.s2.ne.y;
        let base = P.off.x >> 2u;
        let table = base + P.h.x;
        for (var b = li; b < nb; b += {{WG}}u) {
            atomicStore(&bc[b], 0u);
        }
        workgroupBarrier();
        for (var y = li; y < pairs; y += {{WG}}u) {
            atomicAdd(&bc[bucket(y)], 1u);
        }
        workgroupBarrier();
        // Each bucket's first place in the list (si[b]) and first tile (si[BUCKETS + b]).
        if li == 0u {
            var o = 0u;
            var tl = 0u;
            for (var b = 0u; b < nb; b++) {
                let c = atomicLoad(&bc[b]);
                si[b] = o;
                si[BUCKETS + b] = tl;
                atomicStore(&bc[BUCKETS + b], o);
                o += c;
                tl += (c + w - 1u) / w;
            }
            tiles = tl;
        }
        workgroupBarrier();
        for (var b = li; b < nb; b += {{WG}}u) {
            let c = atomicLoad(&bc[b]);
            for (var j = 0u; j * w < c; j++) {
                let e = table + 3u * (si[BUCKETS + b] + j);
                put_word(e, b);
                put_word(e + 1u, si[b] + j * w);
                put_word(e + 2u, min(w, c - j * w));
            }
        }
        for (var j = tiles + li; j < P.u.w; j += {{WG}}u) {
            put_word(table + 3u * j, 0u);
            put_word(table + 3u * j + 1u, 0u);
            put_word(table + 3u * j + 2u, 0u);
        }
        for (var y = li; y < pairs; y += {{WG}}u) {
            put_word(base + atomicAdd(&bc[BUCKETS + bucket(y)], 1u), y);
        }
        return;
    }
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
