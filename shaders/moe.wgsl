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
// OP 4, router: a MoE router's selection, one workgroup per token: src0 the scores
// [n_expert, n] (f32, at most SORT_MAX a token), dst the weights (f32, described as
// [n_used, n]), src1 the ids (i32 [n_used, n], n_used at most 32). With u.x 1 the scores are
// first soft_max(scores * f.x) over the experts (as soft_max.wgsl computes it). The n_used
// largest are selected in top_k's order (largest first, NaNs last, equal values in index
// order, as OP 2), their ids stored and their scores normalized by u.y: 0 as they are,
// 1 soft_max(s * f.y) over the selected, 2 s / clamp(sum(s), f.z, f.w).
// OP 5, weighted sum: one invocation per element of dst [d, n] (f32): the sum over the slots e
// of src1[0, e, t] * src0[i, e, t] (f32 [d, n_used, n] and [1, n_used, n]), added in slot
// order, plus src2[i, t] (f32) when u.y is 1.
// Params: u.x: invocations (OP 1, OP 5) or rows (OP 2).

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

// No entry (OP 4's selection).
const NONE: u32 = 0xffffffffu;

// Whether entry (va, ia) comes before (vb, ib) in top_k's order (OP 4): an entry before none,
// numbers before NaNs, larger first, then the lower index.
fn top_before(va: f32, ia: u32, vb: f32, ib: u32) -> bool {
    if ia == NONE || ib == NONE {
        return ib == NONE && ia != NONE;
    }
    let na = va != va;
    let nb = vb != vb;
    if na != nb {
        return nb;
    }
    if !na && va != vb {
        return va > vb;
    }
    return ia < ib;
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
    if OP == 4u {
        let t = group(wg, nwg);
        if t >= P.s0.ne.y {
            return;
        }
        let n = P.s0.ne.x;
        let k = P.s1.ne.x;
        let row = P.off.y + t * P.s0.nb.y;
        for (var j = li; j < n; j += {{WG}}u) {
            sv[j] = ld0(row + j * P.s0.nb.x);
        }
        if P.u.x == 1u {
            var mx = -3.4028235e38;
            for (var j = li; j < n; j += {{WG}}u) {
                mx = max(mx, sv[j] * P.f.x);
            }
            mx = wg_max(mx, li);
            var s = 0.0;
            for (var j = li; j < n; j += {{WG}}u) {
                let e = exp(sv[j] * P.f.x - mx);
                sv[j] = e;
                s += e;
            }
            let inv = 1.0 / wg_sum(s, li);
            for (var j = li; j < n; j += {{WG}}u) {
                sv[j] *= inv;
            }
        }
        workgroupBarrier();
        // Entry li + WG m is this invocation's; bit m of `taken` marks it selected. Invocation
        // r keeps the r-th selected.
        var taken = 0u;
        var my_i = 0u;
        var my_v = 0.0;
        for (var r = 0u; r < k; r++) {
            var bv = 0.0;
            var bi = NONE;
            var m = 0u;
            for (var j = li; j < n; j += {{WG}}u) {
                if ((taken >> m) & 1u) == 0u && top_before(sv[j], j, bv, bi) {
                    bv = sv[j];
                    bi = j;
                }
                m++;
            }
            red[li] = bv;
            si[li] = bi;
            workgroupBarrier();
            for (var h = {{WG}}u / 2u; h > 0u; h >>= 1u) {
                if li < h && top_before(red[li + h], si[li + h], red[li], si[li]) {
                    red[li] = red[li + h];
                    si[li] = si[li + h];
                }
                workgroupBarrier();
            }
            let wi = si[0];
            let wv = red[0];
            workgroupBarrier();
            if wi % {{WG}}u == li {
                taken |= 1u << (wi / {{WG}}u);
            }
            if li == r {
                my_i = wi;
                my_v = wv;
            }
        }
        let mine = li < k;
        var w = my_v;
        if P.u.y == 1u {
            let x = my_v * P.f.y;
            let mx = wg_max(select(-3.4028235e38, x, mine), li);
            let e = select(0.0, exp(x - mx), mine);
            w = e * (1.0 / wg_sum(e, li));
        } else if P.u.y == 2u {
            let s = wg_sum(select(0.0, my_v, mine), li);
            w = my_v / min(max(s, P.f.z), P.f.w);
        }
        if mine {
            st(P.off.x + li * P.d.nb.x + t * P.d.nb.y, w);
            src1[(P.off.z + li * P.s1.nb.x + t * P.s1.nb.y) >> 2u] = my_i;
        }
        return;
    }
    if OP == 5u {
        let i = linear(wg, nwg, li);
        if i >= P.u.x {
            return;
        }
        let c = coords(i, P.d.ne);
        let db = P.off.y + c.x * P.s0.nb.x + c.y * P.s0.nb.z;
        let wb = P.off.z + c.y * P.s1.nb.z;
        var acc = ld1(wb) * ld0(db);
        for (var e = 1u; e < P.s0.ne.y; e++) {
            acc = acc + ld1(wb + e * P.s1.nb.y) * ld0(db + e * P.s0.nb.y);
        }
        if P.u.y == 1u {
            acc = bitcast<f32>(s2w((P.off.w + c.x * P.s2.nb.x + c.y * P.s2.nb.y) >> 2u)) + acc;
        }
        st(P.off.x + c.x * P.d.nb.x + c.y * P.d.nb.y, acc);
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
