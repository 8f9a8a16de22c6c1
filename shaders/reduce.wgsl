// Sums, means and argmax (op family "reduce").
//
// One workgroup per row of src0 (sum_rows, mean, argmax), or one workgroup over every element
// (sum). Defines: OP 0 sum_rows, 1 mean, 2 argmax, 3 sum. Params: u.x: rows (workgroups).

const OP: u32 = {{OP}}u;

var<workgroup> best: array<u32, {{WG}}>;

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = group(wg, nwg);
    if row >= P.u.x {
        return;
    }
    if OP == 3u {
        let total = P.s0.ne.x * P.s0.ne.y * P.s0.ne.z * P.s0.ne.w;
        var s = 0.0;
        for (var i = li; i < total; i += {{WG}}u) {
            s += ld0(P.off.y + at(coords(i, P.s0.ne), P.s0.nb));
        }
        let r = wg_sum(s, li);
        if li == 0u {
            st(P.off.x, r);
        }
        return;
    }
    let c = coords(row * P.s0.ne.x, P.s0.ne);
    let sb = P.off.y + at(c, P.s0.nb);
    let n = P.s0.ne.x;
    if OP == 2u {
        var v = -3.4028235e38;
        var k = 0xffffffffu;
        for (var i = li; i < n; i += {{WG}}u) {
            let x = ld0(sb + i * P.s0.nb.x);
            if k == 0xffffffffu || x > v {
                v = x;
                k = i;
            }
        }
        red[li] = v;
        best[li] = k;
        workgroupBarrier();
        for (var s = {{WG}}u / 2u; s > 0u; s >>= 1u) {
            if li < s {
                let ov = red[li + s];
                let ok = best[li + s];
                let take = ok != 0xffffffffu && (best[li] == 0xffffffffu || ov > red[li] || (ov == red[li] && ok < best[li]));
                if take {
                    red[li] = ov;
                    best[li] = ok;
                }
            }
            workgroupBarrier();
        }
        if li == 0u {
            put_word((P.off.x + row * P.d.nb.x) >> 2u, best[0]);
        }
        return;
    }
    var s = 0.0;
    for (var i = li; i < n; i += {{WG}}u) {
        s += ld0(sb + i * P.s0.nb.x);
    }
    var r = wg_sum(s, li);
    if OP == 1u {
        r /= f32(n);
    }
    if li == 0u {
        st(P.off.x + at(c, P.d.nb), r);
    }
}
