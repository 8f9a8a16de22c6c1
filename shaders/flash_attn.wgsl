// Fused attention softmax(q k^T * scale + slope * mask) v (op family "flash_attn").
//
// src0 q [D, n_q, H, B] f32; src1 k [D, n_kv, Hk, Bk] and src2 v [DV, n_kv, Hk, Bk] (T1, T2:
// f32 or f16); src3 the mask [n_kv, >= n_q, m2, m3] (T3); dst [DV, H, n_q, B] f32.
// `main`, `decode` and `decode_combine` take one workgroup per query row and head (u.x
// workgroups, n_q * H * B; the split `decode`: one per split of each, see below); `prefill`
// (prompts, on adapters with cooperative matrices) one per 64 query rows of a head (at the
// end of the file).
//
// `main` (any layout): the query is staged in workgroup memory, then the keys are visited WG at
// a time (one score per invocation), with a running maximum and sum (online softmax); each
// invocation accumulates dims li, li + WG, ... of the output. The k and v rows of keys the mask
// hides are not read.
//
// `decode` (few query rows; k and v rows contiguous, 4-byte aligned, D and DV even): the
// workgroup is NG groups of G invocations, and each group runs its own online softmax over
// its share of the keys (KU consecutive keys per step; steps of NG * KU keys). The G
// invocations of a group split each key's row into 16-byte chunks (invocation r takes chunks
// r, r + G, ..., so that a group reads 128 contiguous bytes a load: one 16-byte load a chunk
// where Y4, resp. B4, says that k's, resp. v's, rows are 16-byte aligned whole chunks, else
// four word loads clamped to the row), add their partial dot products with
// subgroupShuffleXor where SUBGROUPS (used only where the adapter's subgroups hold at least G
// invocations; the G consecutive invocations of a group are assumed to share a subgroup, as
// mul_mat assumes), else through workgroup memory, and accumulate the output's values of the
// same chunks of v. Each step issues its k, mask and v loads together. At the end the groups'
// maxima, sums and outputs are combined: with SUBGROUPS first within each subgroup by
// subgroup operations (subgroup i assumed to be invocations i * size ..., as mul_mat
// assumes), then the subgroups' through workgroup memory; without, the groups' through
// workgroup memory. The steps end after the last key the mask does not hide
// (`visible_end`), and a step whose keys the mask hides all (another sequence's pages of a
// shared KV cache) is skipped: it would add nothing, its scores being -inf. Keys past the end (of the split) are read clamped to its last key (so that
// loads need no branch) and weigh 0.
//
// Split decode (SPLIT): the keys of each query row and head are cut into h.x splits of h.y
// consecutive keys (the last may be shorter, none is empty), one workgroup each (u.x = n_q * H
// * B * h.x workgroups, the splits of one row and head side by side), so that a single token
// over a few heads still spreads over many workgroups. Each split runs `decode` over its keys
// and writes its maximum, its sum and its output not yet divided by the sum (DV values)
// to the scratch bound as dst: (DV + 2) f32 per split, split s of row and head o at
// (o * h.x + s) * (DV + 2). A second dispatch, `decode_combine` (one workgroup per row and head,
// the scratch bound as src0), rescales each split by exp(max_s - max) and stores the row where
// the unsplit `decode` stores it. By default there are enough splits of at least 256 keys to
// make 256 workgroups (`fa_splits` in `backend-wgpu/src/ops/attention.rs`).
//
// Defines: DMAX: largest D and DV; WG: invocations (main: keys per step, 64, or 256 for long
// caches; decode: 256; decode_combine: 64); DECODE: the decode entry point is built, with KU
// keys per group and step (Y4, B4: k's, v's rows as 16-byte chunks, binding them as vec4
// words); SPLIT: it writes its split's partial result to the scratch;
// COMBINE: the decode_combine entry point is built; PREFILL (with H16 and COOP): the prefill
// entry point is built, OT4 with 4 output blocks a subgroup (DMAX 128; else 2, DMAX 64), PKV16
// (with Y4 and B4) where k and v are f16 rows of 16-byte aligned whole chunks, staged 8 values
// a load.
// Params: f.x: scale; f.y: max_bias; f.z, f.w: ALiBi m0, m1; g.x: logit softcap; u.x:
// workgroups (n_q * H * B, times h.x for SPLIT); u.y: has mask; u.z: n_head_log2; u.w: H / Hk;
// h.z: B / Bk; h.x: splits (1 unsplit; decode and decode_combine); h.y: keys per split
// (decode).
// SINKS (main, decode): binding 5 holds one f32 per query head (at byte off4.y), a logit that
// joins each row's soft-max and weighs no value; a split decode adds it in a row's first split
// only, so that the combine counts it once.

const DMAX: u32 = {{DMAX}}u;
// Output dims per invocation (main).
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

// Where one workgroup's query row, head and batch lie: byte offsets of its q row, of its kv
// head's k and v, and of its mask row.
struct Row {
    iq: u32,
    h: u32,
    b: u32,
    qb: u32,
    kb: u32,
    vb: u32,
    mb: u32,
}

fn locate(o: u32) -> Row {
    let nq = P.s0.ne.y;
    let heads = P.s0.ne.z;
    let iq = o % nq;
    let h = (o / nq) % heads;
    let b = o / (nq * heads);
    let hk = h / P.u.w;
    let bk = b / P.h.z;
    return Row(
        iq,
        h,
        b,
        P.off.y + iq * P.s0.nb.y + h * P.s0.nb.z + b * P.s0.nb.w,
        P.off.z + hk * P.s1.nb.z + bk * P.s1.nb.w,
        P.off.w + hk * P.s2.nb.z + bk * P.s2.nb.w,
        P.off4.x + iq * P.s3.nb.y + (h % P.s3.ne.z) * P.s3.nb.z + (b % P.s3.ne.w) * P.s3.nb.w,
    );
}

// The mask's value for key j of the mask row at byte mb (0 without a mask).
fn mask_at(mb: u32, j: u32) -> f32 {
    if P.u.y != 0u {
        return ld3(mb + j * P.s3.nb.x);
    }
    return 0.0;
}

// The score of a key from its dot product with the query: scaled, soft-capped, plus the slope
// m times its mask value mk (NEG_INF at the lowest).
fn score(qk: f32, mk: f32, m: f32) -> f32 {
    var s = qk * P.f.x;
    if P.g.x != 0.0 {
        let t = s / P.g.x;
        let e = exp(-2.0 * abs(t));
        s = P.g.x * sign(t) * (1.0 - e) / (1.0 + e);
    }
    return max(s + m * mk, NEG_INF);
}

// The factor that takes values kept against maximum mg to maximum mx.
fn rescale(mg: f32, mx: f32) -> f32 {
    return select(exp(mg - mx), 0.0, mg <= NEG_INF);
}

#if SINKS
@group(0) @binding(5) var<storage, read_write> sinks: array<u32>;

// The sink of query head h.
fn sink(h: u32) -> f32 {
    return bitcast<f32>(sinks[(P.off4.y >> 2u) + h]);
}
#endif

// Stores output dim e of a row.
fn store(row: Row, e: u32, v: f32) {
    st(P.off.x + e * P.d.nb.x + row.h * P.d.nb.y + row.iq * P.d.nb.z + row.b * P.d.nb.w, v);
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let o = group(wg, nwg);
    if o >= P.u.x {
        return;
    }
    let row = locate(o);
    let d = P.s0.ne.x;
    let dv = P.s2.ne.x;
    let nkv = P.s1.ne.y;
    let m = slope(row.h);
    for (var i = li; i < d; i += {{WG}}u) {
        qs[i] = ld0(row.qb + i * P.s0.nb.x);
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
        // A key the mask hides weighs nothing: neither its k row nor (below) its v row is read.
        var mk = NEG_INF;
        if j < nkv {
            mk = mask_at(row.mb, j);
        }
        if mk > NEG_INF {
            var qk = 0.0;
            let kr = row.kb + j * P.s1.nb.y;
            for (var i = 0u; i < d; i++) {
                qk += qs[i] * ld1(kr + i * P.s1.nb.x);
            }
            s = score(qk, mk, m);
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
                    if ps[jj] != 0.0 {
                        a += ps[jj] * ld2(row.vb + (j0 + jj) * P.s2.nb.y + e * P.s2.nb.x);
                    }
                }
                acc[t] = a;
            }
        }
        run_max = new_max;
        workgroupBarrier();
    }
    var total = run_sum;
    var out_scale = 1.0;
#if SINKS
    let sk = sink(row.h);
    let top = max(run_max, sk);
    out_scale = rescale(run_max, top);
    total = run_sum * out_scale + exp(sk - top);
#endif
    let inv = select(out_scale / total, 0.0, total == 0.0);
    for (var t = 0u; t < PER; t++) {
        let e = li + t * {{WG}}u;
        if e < dv {
            store(row, e, acc[t] * inv);
        }
    }
}

// ---- decode ----
#if DECODE

// Invocations per key.
const G: u32 = 8u;
// Key groups per workgroup.
const NG: u32 = {{WG}}u / G;
// Keys per group and step.
const KU: u32 = {{KU}}u;
// vec4s of values per 16-byte chunk of a k row and of a v row (T1, T2: 0 f32, 1 f16).
const KW: u32 = 1u + T1;
const VW: u32 = 1u + T2;
// Chunks of a k row and of a v row per invocation (rows of at most DMAX values).
const CK: u32 = (DMAX + 4u * KW * G - 1u) / (4u * KW * G);
const CV: u32 = (DMAX + 4u * VW * G - 1u) / (4u * VW * G);
// Units (groups, or subgroups with SUBGROUPS) per round of the final combine.
const CG: u32 = 2048u / DMAX;
// Parts of the workgroup that add the groups' outputs side by side (at least one).
const PARTS: u32 = max({{WG}}u / DMAX, 1u);

var<workgroup> comb: array<f32, CG * DMAX>;
// One value per unit of the final combine: with SUBGROUPS a subgroup's maximum (its sum
// rescaled to the largest goes to gsum); without, a group's maximum, then its rescaled sum.
var<workgroup> gval: array<f32, NG>;
#if SUBGROUPS
var<workgroup> gsum: array<f32, NG>;
#else
// Chunks of the groups' maxima and sums reduced in the first stage of the final combine.
const RC: u32 = 8u;
// The chunks' reductions of gval.
var<workgroup> gred: array<f32, RC>;

// gval reduced to one value in every invocation: the largest where take_max, else the sum. Two
// stages: RC invocations reduce a chunk of NG / RC groups each, then every invocation the RC
// chunks. Call it with gval stored and a barrier passed.
fn reduce_groups(li: u32, take_max: bool) -> f32 {
    let zero = select(0.0, NEG_INF, take_max);
    if li < RC {
        var v = zero;
        for (var i = li * (NG / RC); i < (li + 1u) * (NG / RC); i++) {
            v = select(v + gval[i], max(v, gval[i]), take_max);
        }
        gred[li] = v;
    }
    workgroupBarrier();
    var v = zero;
    for (var i = 0u; i < RC; i++) {
        v = select(v + gred[i], max(v, gred[i]), take_max);
    }
    return v;
}
#endif

// Chunk c (words 4c .. 4c + 3) of the k row at byte r, of nw words: one 16-byte load with Y4
// (16-byte aligned rows of whole chunks), else four word loads (`clamped_chunk`).
fn kchunk(r: u32, c: u32, nw: u32) -> vec4<u32> {
#if Y4
    return src1[(r >> 4u) + c];
#else
    return clamped_chunk(false, r, c, nw);
#endif
}

// The same for the v row at byte r (B4 as Y4).
fn vchunk(r: u32, c: u32, nw: u32) -> vec4<u32> {
#if B4
    return src2[(r >> 4u) + c];
#else
    return clamped_chunk(true, r, c, nw);
#endif
}

// Chunk c of the k row (the v row where `v`) at byte r, of nw words, as four word loads, each
// clamped to the row's last word.
fn clamped_chunk(v: bool, r: u32, c: u32, nw: u32) -> vec4<u32> {
    let w = r >> 2u;
    let l = nw - 1u;
    let i = 4u * c;
    return vec4<u32>(kv_word(v, w + min(i, l)), kv_word(v, w + min(i + 1u, l)), kv_word(v, w + min(i + 2u, l)), kv_word(v, w + min(i + 3u, l)));
}

// Word i of k's binding, or of v's where `v`.
fn kv_word(v: bool, i: u32) -> u32 {
    if v {
        return s2w(i);
    }
    return s1w(i);
}

// vec4 h of the values of chunk w: its words' f16 pairs (h = 0: words x, y; 1: z, w) where
// `f16v`, else its four f32.
fn chunk_values(w: vec4<u32>, f16v: bool, h: u32) -> vec4<f32> {
    if f16v {
        let a = select(w.xy, w.zw, h == 1u);
        return vec4<f32>(halves(a.x), halves(a.y));
    }
    return bitcast<vec4<f32>>(w);
}

// One past the last key of [start, end) that the mask does not hide (start where it hides
// them all; end without a mask), the same in every invocation: the keys after it weigh
// nothing (a decode step's mask hides the cache's padding past the current position), so the
// steps stop there. One mask load per WG keys, and three barriers.
// It also marks in `shown` the steps (of NG * KU keys from start) with a key the mask does not
// hide, bit i for step i (the steps past SHOWN_WORDS * 32 count as shown; all of them without
// a mask): `step_shown` reads them.
var<workgroup> seen_end: atomic<u32>;
var<workgroup> shown_end: u32;
const SHOWN_WORDS: u32 = 16u;
var<workgroup> seen: array<atomic<u32>, SHOWN_WORDS>;
var<workgroup> shown: array<u32, SHOWN_WORDS>;

fn visible_end(mb: u32, start: u32, end: u32, li: u32) -> u32 {
    if P.u.y == 0u {
        if li < SHOWN_WORDS {
            shown[li] = 0xffffffffu;
        }
        return end;
    }
    if li == 0u {
        atomicStore(&seen_end, start);
    }
    if li < SHOWN_WORDS {
        atomicStore(&seen[li], 0u);
    }
    workgroupBarrier();
    var e = start;
    for (var j = start + li; j < end; j += {{WG}}u) {
        if mask_at(mb, j) > NEG_INF {
            e = j + 1u;
            let i = (j - start) / (NG * KU);
            if i < SHOWN_WORDS * 32u {
                atomicOr(&seen[i / 32u], 1u << (i % 32u));
            }
        }
    }
    atomicMax(&seen_end, e);
    workgroupBarrier();
    if li == 0u {
        shown_end = atomicLoad(&seen_end);
    }
    if li < SHOWN_WORDS {
        shown[li] = atomicLoad(&seen[li]);
    }
    return workgroupUniformLoad(&shown_end);
}

// Whether step i of `visible_end`'s marks has a key the mask does not hide (the same in every
// invocation).
fn step_shown(i: u32) -> bool {
    if i >= SHOWN_WORDS * 32u {
        return true;
    }
    return ((workgroupUniformLoad(&shown[i / 32u]) >> (i % 32u)) & 1u) != 0u;
}

// The sums of x over each group's G invocations (every invocation of the group gets them, the
// same in each: the additions pair the same values).
#if SUBGROUPS
fn group_sums(x: array<f32, KU>, li: u32) -> array<f32, KU> {
    var y = x;
    for (var u = 0u; u < KU; u++) {
        for (var b = 1u; b < G; b <<= 1u) {
            y[u] += subgroupShuffleXor(y[u], b);
        }
    }
    return y;
}
#else
var<workgroup> part: array<f32, KU * {{WG}}u>;

fn group_sums(x: array<f32, KU>, li: u32) -> array<f32, KU> {
    for (var u = 0u; u < KU; u++) {
        part[u * {{WG}}u + li] = x[u];
    }
    workgroupBarrier();
    var y: array<f32, KU>;
    let b = li - li % G;
    for (var u = 0u; u < KU; u++) {
        // Pairwise, as the shuffles add.
        var v: array<f32, G>;
        for (var i = 0u; i < G; i++) {
            v[i] = part[u * {{WG}}u + b + i];
        }
        for (var h = 1u; h < G; h <<= 1u) {
            for (var i = 0u; i < G; i += 2u * h) {
                v[i] += v[i + h];
            }
        }
        y[u] = v[0];
    }
    workgroupBarrier();
    return y;
}
#endif

@compute @workgroup_size({{WG}})
fn decode(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
#if SUBGROUPS
    @builtin(subgroup_invocation_id) sli: u32,
    @builtin(subgroup_size) ssz: u32,
#endif
) {
    let o = group(wg, nwg);
    if o >= P.u.x {
        return;
    }
    // This workgroup's keys: split o % h.x of row and head o / h.x (all of them unsplit).
    let row = locate(o / P.h.x);
    let start = (o % P.h.x) * P.h.y;
    let end = visible_end(row.mb, start, min(start + P.h.y, P.s1.ne.y), li);
    let r = li % G;
    let g = li / G;
    let dk = P.s0.ne.x;
    let dv = P.s2.ne.x;
    // Words and 16-byte chunks of a k row and a v row.
    let nwk = dk / (1u + T1);
    let nwv = dv / (1u + T2);
    let nck = (nwk + 3u) / 4u;
    let ncv = (nwv + 3u) / 4u;
    let m = slope(row.h);
    // The query's values of this invocation's k chunks r, r + G, ... (zeros past D, so that
    // the clamped chunks there add nothing), and the output's of its v chunks.
    var q: array<vec4<f32>, CK * KW>;
    var acc: array<vec4<f32>, CV * VW>;
    for (var c = 0u; c < CK * KW; c++) {
        let e0 = ((r + (c / KW) * G) * KW + c % KW) * 4u;
        var v = vec4<f32>(0.0);
        for (var i = 0u; i < 4u; i++) {
            if e0 + i < dk {
                v[i] = ld0(row.qb + (e0 + i) * P.s0.nb.x);
            }
        }
        q[c] = v;
    }
    for (var c = 0u; c < CV * VW; c++) {
        acc[c] = vec4<f32>(0.0);
    }
    var run_max = NEG_INF;
    var run_sum = 0.0;
    // Every group runs the same number of steps (the group reductions are uniform).
    for (var b0 = start; b0 < end; b0 += NG * KU) {
        if !step_shown((b0 - start) / (NG * KU)) {
            continue;
        }
        let j0 = b0 + g * KU;
        // The step's k, mask and v loads are all issued before any is used, so that one
        // memory round trip serves them all (v and the mask do not wait for the scores).
        var s: array<f32, KU>;
        var mk: array<f32, KU>;
        var vs: array<array<vec4<u32>, CV>, KU>;
        for (var u = 0u; u < KU; u++) {
            let j = min(j0 + u, end - 1u);
            let kr = row.kb + j * P.s1.nb.y;
            let vr = row.vb + j * P.s2.nb.y;
            mk[u] = mask_at(row.mb, j);
            var qk = 0.0;
            for (var c = 0u; c < CK; c++) {
                let w = kchunk(kr, min(r + c * G, nck - 1u), nwk);
                for (var h = 0u; h < KW; h++) {
                    qk += dot(q[c * KW + h], chunk_values(w, T1 == 1u, h));
                }
            }
            for (var c = 0u; c < CV; c++) {
                vs[u][c] = vchunk(vr, min(r + c * G, ncv - 1u), nwv);
            }
            s[u] = qk;
        }
        s = group_sums(s, li);
        var top = run_max;
        for (var u = 0u; u < KU; u++) {
            s[u] = select(NEG_INF, score(s[u], mk[u], m), j0 + u < end);
            top = max(top, s[u]);
        }
        let corr = select(exp(run_max - top), 1.0, top <= NEG_INF);
        run_sum *= corr;
        for (var c = 0u; c < CV * VW; c++) {
            acc[c] *= corr;
        }
        for (var u = 0u; u < KU; u++) {
            let p = select(exp(s[u] - top), 0.0, s[u] <= NEG_INF);
            run_sum += p;
            for (var c = 0u; c < CV * VW; c++) {
                acc[c] += p * chunk_values(vs[u][c / VW], T2 == 1u, c % VW);
            }
        }
        run_max = top;
    }
#if SUBGROUPS
    // Combine the groups: first within each subgroup (the groups it holds: their maximum, their
    // sums rescaled to it and their outputs by shuffles), then the subgroups ("units") through
    // workgroup memory: the largest of their maxima, and their sums and outputs rescaled to it.
    let nu = {{WG}}u / ssz;
    let unit = li / ssz;
    let lead = sli < G;
    let smx = subgroupMax(run_max);
    if sli == 0u {
        gval[unit] = smx;
    }
    workgroupBarrier();
    var mx = NEG_INF;
    for (var i = 0u; i < nu; i++) {
        mx = max(mx, gval[i]);
    }
    let w = rescale(run_max, mx);
    let ssum = subgroupAdd(select(0.0, run_sum * w, r == 0u));
    if sli == 0u {
        gsum[unit] = ssum;
    }
    for (var c = 0u; c < CV * VW; c++) {
        acc[c] *= w;
    }
    for (var x = G; x < ssz; x <<= 1u) {
        for (var c = 0u; c < CV * VW; c++) {
            acc[c] += subgroupShuffleXor(acc[c], x);
        }
    }
#else
    // Combine the groups ("units" here): the largest of their maxima and the sum of their sums
    // rescaled to it, then their outputs CG groups at a time.
    let nu = NG;
    let unit = g;
    let lead = true;
    if r == 0u {
        gval[g] = run_max;
    }
    workgroupBarrier();
    let mx = reduce_groups(li, true);
    let w = rescale(run_max, mx);
    if r == 0u {
        gval[g] = run_sum * w;
    }
    workgroupBarrier();
    let total = reduce_groups(li, false);
    for (var c = 0u; c < CV * VW; c++) {
        acc[c] *= w;
    }
#endif
    // The outputs, CG units a round (the lead group of each unit stores its output): the
    // workgroup is PARTS parts of DMAX invocations side by side; invocation li adds, at dim
    // li % DMAX, every PARTS-th unit of a round from unit li / DMAX on, and the parts' sums are
    // added at the end.
    let part = li / DMAX;
    let d = li % DMAX;
    var sum = 0.0;
    for (var c0 = 0u; c0 < nu; c0 += CG) {
        if lead && unit >= c0 && unit < c0 + CG {
            for (var c = 0u; c < CV * VW; c++) {
                let e0 = ((r + (c / VW) * G) * VW + c % VW) * 4u;
                for (var i = 0u; i < 4u; i++) {
                    if e0 + i < dv {
                        comb[(unit - c0) * DMAX + e0 + i] = acc[c][i];
                    }
                }
            }
        }
        workgroupBarrier();
        if part < PARTS && d < dv {
            for (var c = part; c < min(CG, nu - c0); c += PARTS) {
                sum += comb[c * DMAX + d];
            }
        }
        workgroupBarrier();
    }
    if PARTS > 1u {
        if part < PARTS && d < dv {
            comb[part * DMAX + d] = sum;
        }
        workgroupBarrier();
        sum = 0.0;
        if li < dv {
            for (var p = 0u; p < PARTS; p++) {
                sum += comb[p * DMAX + li];
            }
        }
    }
#if SUBGROUPS
    // The units' sums (stored before the rounds' barriers).
    var total = 0.0;
    for (var i = 0u; i < nu; i++) {
        total += gsum[i];
    }
#endif
    // The sink joins the row's soft-max once: in its first split.
    var fmx = mx;
    var ftotal = total;
    var fsum = sum;
#if SINKS
    if o % P.h.x == 0u {
        let sk = sink(row.h);
        fmx = max(mx, sk);
        let c = rescale(mx, fmx);
        ftotal = total * c + exp(sk - fmx);
        fsum = sum * c;
    }
#endif
#if SPLIT
    // The split's maximum, sum and undivided output, to the scratch.
    let at = P.off.x / 4u + o * (dv + 2u);
    if li == 0u {
        put_word(at, bitcast<u32>(fmx));
        put_word(at + 1u, bitcast<u32>(ftotal));
    }
    if li < dv {
        put_word(at + 2u + li, bitcast<u32>(fsum));
    }
#else
    if li < dv {
        store(row, li, select(fsum / ftotal, 0.0, ftotal == 0.0));
    }
#endif
}
#endif

// ---- decode_combine ----
#if COMBINE

// Merges the splits of one query row and head that the SPLIT `decode` left in the scratch
// (src0): each split's sum and output rescaled from its maximum to the largest, then the
// output divided by the sum (0 where every key was masked out).
@compute @workgroup_size({{WG}})
fn decode_combine(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let o = group(wg, nwg);
    if o >= P.u.x {
        return;
    }
    let row = locate(o);
    let dv = P.s2.ne.x;
    let ns = P.h.x;
    let stride = dv + 2u;
    let at = P.off.y / 4u + o * ns * stride;
    var mx = NEG_INF;
    for (var i = 0u; i < ns; i++) {
        mx = max(mx, bitcast<f32>(s0w(at + i * stride)));
    }
    var total = 0.0;
    for (var i = 0u; i < ns; i++) {
        let e = at + i * stride;
        total += bitcast<f32>(s0w(e + 1u)) * rescale(bitcast<f32>(s0w(e)), mx);
    }
    for (var d = li; d < dv; d += {{WG}}u) {
        var sum = 0.0;
        for (var i = 0u; i < ns; i++) {
            let e = at + i * stride;
            sum += bitcast<f32>(s0w(e + 2u + d)) * rescale(bitcast<f32>(s0w(e)), mx);
        }
        store(row, d, select(sum / total, 0.0, total == 0.0));
    }
}
#endif

// ---- prefill ----
#if PREFILL

// Query rows per workgroup, keys per step, and the row strides (f16 values) of the staged
// tiles: q and k/v rows of DMAX values, p rows of FK values, each padded by 8 (so that the 8
// rows of 16 bytes a fragment load reads fall on distinct banks).
const FQ: u32 = 64u;
const FK: u32 = 32u;
const SQ: u32 = DMAX + 8u;
const SP: u32 = FK + 8u;
// Output tiles (16 x 16) per subgroup: the 4 x DMAX / 16 tiles of the block's output over 8
// subgroups.
const OT: u32 = DMAX / 32u;

var<workgroup> fq: array<f16, FQ * SQ>;
var<workgroup> fkv: array<f16, FK * SQ>;
var<workgroup> fs: array<f32, FQ * FK>;
var<workgroup> fp: array<f16, FQ * SP>;
var<workgroup> fm: array<f32, 256>;
var<workgroup> fl: array<f32, 256>;

// Stages key rows j0 .. j0 + FK of k (src1; of v, src2, where `v`), whose head starts at byte
// `base`, into fkv as f16, dims below `n` (keys past nkv read as the last key: their scores
// are masked).
#if PKV16
fn stage_kv(v: bool, base: u32, j0: u32, nkv: u32, n: u32, li: u32) {
    // f16 rows, 16-byte aligned (Y4, B4): 8 values a load, chunk c of row i / cpr.
    let cpr = n / 8u;
    for (var i = li; i < FK * cpr; i += 256u) {
        let j = min(j0 + i / cpr, nkv - 1u);
        let c = i % cpr;
        var w: vec4<u32>;
        if v {
            w = src2[((base + j * P.s2.nb.y) >> 4u) + c];
        } else {
            w = src1[((base + j * P.s1.nb.y) >> 4u) + c];
        }
        let o = (i / cpr) * SQ + 8u * c;
        let h0 = vec2<f16>(halves(w.x));
        let h1 = vec2<f16>(halves(w.y));
        let h2 = vec2<f16>(halves(w.z));
        let h3 = vec2<f16>(halves(w.w));
        fkv[o] = h0.x;
        fkv[o + 1u] = h0.y;
        fkv[o + 2u] = h1.x;
        fkv[o + 3u] = h1.y;
        fkv[o + 4u] = h2.x;
        fkv[o + 5u] = h2.y;
        fkv[o + 6u] = h3.x;
        fkv[o + 7u] = h3.y;
    }
}
#else
fn stage_kv(v: bool, base: u32, j0: u32, nkv: u32, n: u32, li: u32) {
    for (var i = li; i < FK * n; i += 256u) {
        let j = min(j0 + i / n, nkv - 1u);
        let e = i % n;
        var x: f32;
        if v {
            x = ld2(base + j * P.s2.nb.y + e * P.s2.nb.x);
        } else {
            x = ld1(base + j * P.s1.nb.y + e * P.s1.nb.x);
        }
        fkv[(i / n) * SQ + e] = f16(x);
    }
}
#endif

// The scores of this invocation's 8 keys (of row li / 4: keys 8 (li % 4) .. + 7 of the step
// from j0) from fs: scaled, soft-capped, masked (NEG_INF past nkv).
fn step_scores(mb: u32, j0: u32, nkv: u32, m: f32, li: u32) -> array<f32, 8> {
    var s: array<f32, 8>;
    let r = li / 4u;
    for (var c = 0u; c < 8u; c++) {
        let j = 8u * (li % 4u) + c;
        s[c] = NEG_INF;
        if j0 + j < nkv {
            s[c] = score(fs[r * FK + j], mask_at(mb, j0 + j), m);
        }
    }
    return s;
}

// S = q k^T for the step's keys (staged in fkv) into fs: subgroup sg computes the 16 x 16
// block (sg % 4, sg / 4) over d / 16 fragment steps.
fn step_products(d: u32, sg: u32) {
    var c: coop_mat16x16<f32, C>;
    let r0 = 16u * (sg % 4u);
    let c0 = 16u * (sg / 4u);
    for (var k = 0u; k < d; k += 16u) {
        let a = coopLoadT<coop_mat16x16<f16, A>>(&fq[r0 * SQ + k], SQ);
        let b = coopLoad<coop_mat16x16<f16, B>>(&fkv[c0 * SQ + k], SQ);
        c = coopMultiplyAdd(a, b, c);
    }
    coopStoreT(c, &fs[r0 * FK + c0], FK);
}

// Row iq (>= first.iq) of the block whose first row is `first`: the same head and batch, its q
// row and mask row moved on by iq - first.iq rows.
fn block_row(first: Row, iq: u32) -> Row {
    var r = first;
    r.iq = iq;
    r.qb = first.qb + (iq - first.iq) * P.s0.nb.y;
    r.mb = first.mb + (iq - first.iq) * P.s3.nb.y;
    return r;
}

// One step of both passes: the keys from j0 staged, their products with the block's queries,
// and this invocation's 8 scores (`step_scores`); k at byte kb, the invocation's mask row at mb.
fn step_keys(kb: u32, mb: u32, j0: u32, m: f32, sg: u32, li: u32) -> array<f32, 8> {
    let d = P.s0.ne.x;
    let nkv = P.s1.ne.y;
    stage_kv(false, kb, j0, nkv, d, li);
    workgroupBarrier();
    step_products(d, sg);
    workgroupBarrier();
    return step_scores(mb, j0, nkv, m, li);
}

// Prompt attention on cooperative matrices (PREFILL, with H16 and COOP; D and DV multiples of
// 16, at most DMAX = 64 or 128): one workgroup of 256 invocations (8 subgroups of 32) per FQ
// query rows of one head (u.x workgroups: ceil(n_q / FQ) * H * B). q is staged once as f16;
// the keys are visited FK at a time, twice: the first pass finds each row's maximum score and
// the sum of its exponentials (online, per invocation: 4 invocations share a row, 8 keys each
// a step), the second computes P = exp(s - max) / sum as f16 and adds P v into the output,
// which stays in cooperative matrices (OT 16 x 16 blocks per subgroup: rows 16 (sg % 4),
// columns from 16 OT (sg / 4)), since they cannot be rescaled in place as an online softmax
// would need. Rows whose keys are all masked give zeros, as `main`.
@compute @workgroup_size(256)
fn prefill(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    // Workgroups past u.x (the grid's last row) redo the last block and store nothing (no
    // early return: cooperative-matrix operations need uniform control flow).
    let live = group(wg, nwg) < P.u.x;
    let o = min(group(wg, nwg), P.u.x - 1u);
    let nq = P.s0.ne.y;
    let blocks = (nq + FQ - 1u) / FQ;
    let q0 = (o % blocks) * FQ;
    // The workgroup's first row (for its head's k and v), and this invocation's row's mask.
    let first = locate(q0 + nq * (o / blocks));
    let mine = block_row(first, min(q0 + li / 4u, nq - 1u));
    let d = P.s0.ne.x;
    let dv = P.s2.ne.x;
    let nkv = P.s1.ne.y;
    let m = slope(first.h);
    let sg = li / 32u;
    for (var i = li; i < FQ * d; i += 256u) {
        let r = block_row(first, min(q0 + i / d, nq - 1u));
        fq[(i / d) * SQ + i % d] = f16(ld0(r.qb + (i % d) * P.s0.nb.x));
    }
    // Pass 1: each invocation's running maximum and sum over its keys.
    var mx = NEG_INF;
    var sum = 0.0;
    for (var j0 = 0u; j0 < nkv; j0 += FK) {
        let s = step_keys(first.kb, mine.mb, j0, m, sg, li);
        var top = mx;
        for (var c = 0u; c < 8u; c++) {
            top = max(top, s[c]);
        }
        sum *= rescale(mx, top);
        for (var c = 0u; c < 8u; c++) {
            sum += select(exp(s[c] - top), 0.0, s[c] <= NEG_INF);
        }
        mx = top;
    }
    // The row's maximum and sum from its 4 invocations'.
    fm[li] = mx;
    fl[li] = sum;
    workgroupBarrier();
    let g = li & ~3u;
    let rmax = max(max(fm[g], fm[g + 1u]), max(fm[g + 2u], fm[g + 3u]));
    var rsum = 0.0;
    for (var i = 0u; i < 4u; i++) {
        rsum += fl[g + i] * rescale(fm[g + i], rmax);
    }
    let inv = select(1.0 / rsum, 0.0, rsum == 0.0);
    // Pass 2: P v.
    var o0: coop_mat16x16<f32, C>;
    var o1: coop_mat16x16<f32, C>;
#if OT4
    var o2: coop_mat16x16<f32, C>;
    var o3: coop_mat16x16<f32, C>;
#endif
    let pr = 16u * (sg % 4u);
    let pc = 16u * OT * (sg / 4u);
    for (var j0 = 0u; j0 < nkv; j0 += FK) {
        let s = step_keys(first.kb, mine.mb, j0, m, sg, li);
        for (var c = 0u; c < 8u; c++) {
            let p = select(exp(s[c] - rmax) * inv, 0.0, s[c] <= NEG_INF);
            fp[(li / 4u) * SP + 8u * (li % 4u) + c] = f16(p);
        }
        stage_kv(true, first.vb, j0, nkv, dv, li);
        workgroupBarrier();
        for (var k = 0u; k < FK; k += 16u) {
            let a = coopLoadT<coop_mat16x16<f16, A>>(&fp[pr * SP + k], SP);
            let b0 = coopLoadT<coop_mat16x16<f16, B>>(&fkv[k * SQ + pc], SQ);
            let b1 = coopLoadT<coop_mat16x16<f16, B>>(&fkv[k * SQ + pc + 16u], SQ);
            o0 = coopMultiplyAdd(a, b0, o0);
            o1 = coopMultiplyAdd(a, b1, o1);
#if OT4
            let b2 = coopLoadT<coop_mat16x16<f16, B>>(&fkv[k * SQ + pc + 32u], SQ);
            let b3 = coopLoadT<coop_mat16x16<f16, B>>(&fkv[k * SQ + pc + 48u], SQ);
            o2 = coopMultiplyAdd(a, b2, o2);
            o3 = coopMultiplyAdd(a, b3, o3);
#endif
        }
        workgroupBarrier();
    }
    // Each output block through fs (256 values a subgroup, column-major), then to dst.
    for (var t = 0u; t < OT; t++) {
        switch t {
            case 0u: { coopStore(o0, &fs[256u * sg], 16u); }
#if OT4
            case 1u: { coopStore(o1, &fs[256u * sg], 16u); }
            case 2u: { coopStore(o2, &fs[256u * sg], 16u); }
            default: { coopStore(o3, &fs[256u * sg], 16u); }
#else
            default: { coopStore(o1, &fs[256u * sg], 16u); }
#endif
        }
        workgroupBarrier();
        for (var e = li % 32u; e < 256u; e += 32u) {
            let iq = q0 + pr + e % 16u;
            let dim = pc + 16u * t + e / 16u;
            if live && iq < nq && dim < dv {
                store(block_row(first, iq), dim, fs[256u * sg + e]);
            }
        }
        workgroupBarrier();
    }
}
#endif
