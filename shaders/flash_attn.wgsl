// Fused attention softmax(q k^T * scale + slope * mask) v (op family "flash_attn").
//
// One workgroup per query row and head: the query is staged in workgroup memory, then the
// keys are visited WG at a time (one score per invocation), with a running maximum and sum
// (online softmax); each invocation accumulates dims li, li + WG, ... of the output.
// src0 q [D, n_q, H, B] f32; src1 k [D, n_kv, Hk, Bk] and src2 v [DV, n_kv, Hk, Bk] (T1, T2:
// f32 or f16); src3 the mask [n_kv, >= n_q, m2, m3] (T3); dst [DV, H, n_q, B] f32.
// Defines: DMAX: largest D and DV; WG: keys per step (64, or 256 for long caches).
// Params: f.x: scale; f.y: max_bias; f.z, f.w: ALiBi m0, m1; g.x: logit softcap; u.x:
// workgroups (n_q * H * B); u.y: has mask; u.z: n_head_log2; u.w: H / Hk; off4.y: B / Bk.

const DMAX: u32 = {{DMAX}}u;
// Output dims per invocation.
const PER: u32 = (DMAX + {{WG}}u - 1u) / {{WG}}u;
const NEG_INF: f32 = -3.4028235e38;

var<workgroup> qs: array<f32, DMAX>;
var<workgroup> ps: array<f32, {{WG}}>;

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
    let o = group(wg, nwg);
    if o >= P.u.x {
        return;
    }
    let nq = P.s0.ne.y;
    let heads = P.s0.ne.z;
    let iq = o % nq;
    let h = (o / nq) % heads;
    let b = o / (nq * heads);
    let d = P.s0.ne.x;
    let dv = P.s2.ne.x;
    let nkv = P.s1.ne.y;
    let hk = h / P.u.w;
    let bk = b / P.off4.y;
    let qb = P.off.y + iq * P.s0.nb.y + h * P.s0.nb.z + b * P.s0.nb.w;
    let kb = P.off.z + hk * P.s1.nb.z + bk * P.s1.nb.w;
    let vb = P.off.w + hk * P.s2.nb.z + bk * P.s2.nb.w;
    let mb = P.off4.x + iq * P.s3.nb.y + (h % P.s3.ne.z) * P.s3.nb.z + (b % P.s3.ne.w) * P.s3.nb.w;
    let m = slope(h);
    for (var i = li; i < d; i += {{WG}}u) {
        qs[i] = ld0(qb + i * P.s0.nb.x);
    }
    workgroupBarrier();
    var acc: array<f32, PER>;
    for (var t = 0u; t < PER; t++) {
        acc[t] = 0.0;
    }
    var run_max = NEG_INF;
    var run_sum = 0.0;
    for (var j0 = 0u; j0 < nkv; j0 += {{WG}}u) {
        let j = j0 + li;
        var s = NEG_INF;
        if j < nkv {
            var dot = 0.0;
            let kr = kb + j * P.s1.nb.y;
            for (var i = 0u; i < d; i++) {
                dot += qs[i] * ld1(kr + i * P.s1.nb.x);
            }
            s = dot * P.f.x;
            if P.g.x != 0.0 {
                let t = s / P.g.x;
                let e = exp(-2.0 * abs(t));
                s = P.g.x * sign(t) * (1.0 - e) / (1.0 + e);
            }
            if P.u.y != 0u {
                s += m * ld3(mb + j * P.s3.nb.x);
            }
            s = max(s, NEG_INF);
        }
        let new_max = max(run_max, wg_max(s, li));
        let p = select(exp(s - new_max), 0.0, s <= NEG_INF);
        let corr = select(exp(run_max - new_max), 1.0, new_max <= NEG_INF);
        ps[li] = p;
        run_sum = run_sum * corr + wg_sum(p, li);
        let count = min({{WG}}u, nkv - j0);
        for (var t = 0u; t < PER; t++) {
            let e = li + t * {{WG}}u;
            if e < dv {
                var a = acc[t] * corr;
                for (var jj = 0u; jj < count; jj++) {
                    a += ps[jj] * ld2(vb + (j0 + jj) * P.s2.nb.y + e * P.s2.nb.x);
                }
                acc[t] = a;
            }
        }
        run_max = new_max;
        workgroupBarrier();
    }
    let inv = select(1.0 / run_sum, 0.0, run_sum == 0.0);
    for (var t = 0u; t < PER; t++) {
        let e = li + t * {{WG}}u;
        if e < dv {
            st(P.off.x + e * P.d.nb.x + h * P.d.nb.y + iq * P.d.nb.z + b * P.d.nb.w, acc[t] * inv);
        }
    }
}
