// rms_norm and norm over each row (op family "norm").
//
// One workgroup per row. Defines: OP 0 rms_norm, 1 norm; MUL: the result times src1, one row
// broadcast over the rows (rms_norm(x) * w fused into one dispatch). Params: f.x: eps; u.x:
// rows.
//
// A row of at most NV x WG values is held in registers, value li + j WG of the row in v[j] of
// invocation li: its NV loads are independent, so they are in flight together (a loop of loads
// that each wait for the last took 35 us for a 4,096-value row on the H200), and the row is read
// once. Longer rows are read in loops, twice (three times for norm).

const OP: u32 = {{OP}}u;
const NV: u32 = 16u;

// The normalized value x (its row's mean, and its scale) of element i, times src1 with MUL,
// stored at element i of the dst row at byte db.
fn put(db: u32, i: u32, x: f32, mean: f32, scale: f32) {
    var y = (x - mean) * scale;
#if MUL
    y *= ld1(P.off.z + i * P.s1.nb.x);
#endif
    st(db + i * P.d.nb.x, y);
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
    let n = P.s0.ne.x;
    let held = n <= NV * {{WG}}u;
    var v: array<f32, NV>;
    var mean = 0.0;
    var s2 = 0.0;
    if held {
        var s = 0.0;
        for (var j = 0u; j < NV; j++) {
            let i = li + j * {{WG}}u;
            if i < n {
                v[j] = ld0(sb + i * P.s0.nb.x);
            }
            s += v[j];
        }
        if OP == 1u {
            mean = wg_sum(s, li) / f32(n);
        }
        for (var j = 0u; j < NV; j++) {
            let x = select(0.0, v[j] - mean, li + j * {{WG}}u < n);
            s2 += x * x;
        }
    } else {
        if OP == 1u {
            var s = 0.0;
            for (var i = li; i < n; i += {{WG}}u) {
                s += ld0(sb + i * P.s0.nb.x);
            }
            mean = wg_sum(s, li) / f32(n);
        }
        for (var i = li; i < n; i += {{WG}}u) {
            let x = ld0(sb + i * P.s0.nb.x) - mean;
            s2 += x * x;
        }
    }
    let scale = 1.0 / sqrt(wg_sum(s2, li) / f32(n) + P.f.x);
    if held {
        for (var j = 0u; j < NV; j++) {
            let i = li + j * {{WG}}u;
            if i < n {
                put(db, i, v[j], mean, scale);
            }
        }
    } else {
        for (var i = li; i < n; i += {{WG}}u) {
            put(db, i, ld0(sb + i * P.s0.nb.x), mean, scale);
        }
    }
}
