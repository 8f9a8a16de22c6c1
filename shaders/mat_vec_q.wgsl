// mat_vec_q: the mat-vec of the quantized types it knows (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K) in integer
// dot products. The src1 column is quantized, KC values at a time, into workgroup memory: 8-bit
// integers (four to a word, 16 to a vec4) with one f32 scale per 32 values, the largest
// magnitude mapped to 127. Each part of a weight block (TPB parts per QB-value block) is then
// multiplied with it four values per dot4I8Packed (one instruction where the device has integer
// dot products) in i32, and scaled once per part in f32. A workgroup takes ROWS rows of one
// column, TPR invocations per row (WG = ROWS x TPR): invocation j of a row takes its parts j,
// j + TPR, ..., and loads the raw words of its next part before it computes the current one
// (the first before the column is quantized). With PF2 the next two parts are in flight: two
// sets of registers take turns, each loaded again right after its part is computed, so that no
// loaded value is ever copied (a copy waits for its load: with one set, `w = next` made each
// step wait for the next part's load before the step after could begin).
// A row's partial sums are added by subgroup shuffles where its TPR invocations lie within one
// subgroup (RSUB), else through workgroup memory. The row length k is compiled in (KK), so
// that the loops' trip counts are known to the compiler; YK has the column's quantization and
// norm take it too, and ONECOL (dst one column, no batch dimensions) leaves out the divisions
// that find a workgroup's column and batch, with MM its row count and RS its row stride (not
// with QKV): each of these shortens the prologue that every load waits for. QF (a column
// quantized in one step) issues the column's loads before the first weights' instead of after
// them.
// Parts: Q4_0 and Q4_1 a whole block of 32; Q8_0 half a block; Q4_K a 64-value group (the
// 32 bytes of nibbles of two 32-value sub-blocks, which share the block's head and the
// decode of their scales); Q6_K 16 positions of a 128-value half (64 values of four 16-value
// sub-blocks).
// Fused variants: ADD adds src2 (f32, dst's shape) to each sum as it is stored (`r + W x`);
// W2 computes the same rows of a second weight matrix of src0's type and shape in src2 (row
// stride s2.nb.y, laid out as src0: B4 = A4) by the same column, and then GLU stores
// silu(src0 row . x) * (src2 row . x) (swiglu of the gate and up products of one token; with
// GELU, gelu instead of silu: geglu), or
// PAIR stores both products, the second into src3 (f32, dst's shape; K and V of one token).
// NORM multiplies by rms_norm(x) * w where src1 holds x (f32) and binding 5 holds w (f32, one
// row of k values, from byte off4.y): the column is quantized as x * w, every invocation adds
// up the squares of the x it loads, and each sum (both sums of W2 variants) is multiplied by
// 1 / sqrt(mean(x^2) + eps) before it is stored, which equals normalizing first up to rounding
// (a per-32 scale is linear). With ADD, GLU and PAIR as above: rms_norm(x) * w feeding Q, K
// and V, or gate and up, without a norm dispatch of its own.
// ID makes it mul_mat_id's mat-vec: dst is [m, n_used, n_tokens], and the workgroups of slot e
// of token t take rows of expert ids[e, t] - u.y of src0 [k, m, n_expert] (and of src2 with W2,
// laid out alike; with GLU the experts' gate and up) by row e % n_b of token t of src1 [k, n_b,
// n_tokens]; the i32 ids are in src3 (from byte off4.x). An expert src0 does not hold stores 0.
// QKV (with W2 and PAIR) runs three products of one column in one dispatch (a Llama block's Q,
// K and V): the first u.w workgroups take ROWS rows each of src0 (Q) into dst as the plain
// variant does, the ones after them ROWS rows each of src2 (K, into src3) and of a third
// matrix in binding 6 (V, from byte off4.z, laid out as src2) into binding 7 (from byte
// off4.w, laid out as src3), as PAIR does; Q may have more rows than K and V.
// ROPE (with QKV) also runs what follows those products in a Llama block's decode step: the
// rope of Q and K (adjacent pairs (2i, 2i + 1) of each head of h.w values, the first h.z
// values of a head rotated, the rest copied) and the stores of K and V into their caches.
// dst is the rotated Q (f32, contiguous); src3 and binding 7 are the K and V caches (type T3:
// f16 or f32; rows of s3.ne.x values with stride s3.nb.y, both laid out alike, word-aligned),
// stored at cache row idx (binding 10: i32, or the low word of an i64); nothing is stored
// there when idx is past the cache's s3.ne.y rows. The position is the i32 in binding 9. Row
// pairs (m, m + 1) of a workgroup (m even: ROWS is even) meet in workgroup memory, and the
// first invocation of row m rotates and stores both (an f16 pair as one word).
// MC makes a workgroup take ROWS rows of NC (2, 4 or 8) neighbouring columns of dst (NC is 1
// otherwise): column group g holds columns NC g .. NC g + NC - 1, and in the last group the
// columns past dst's repeat its last column and are not stored. Each chunk of the NC columns
// is quantized into workgroup memory (the loads of up to four columns go out together), with
// the sums of each 16 values' bytes beside their scales (ys: what the minimums and offsets of
// Q4_1, Q4_K and Q6_K take, read instead of added up again for every row), and each part of
// the weights an invocation loads is unpacked once (`unpack_part`) and multiplied with each
// column's part (`wq_dot`): a weight is read and unpacked once per NC columns instead of once
// per column. ADD and NORM (each column with its own residual and its own norm) are the only
// fused variants with MC.
// PQ (with MC, NC 2 to 16) reads the columns pre-quantized, as `quant_cols` (quant_cols.wgsl)
// wrote them into src1 (a scratch buffer, from 16-byte aligned byte off.z; the scales from
// word h.x and the sums from word h.y after it) once for every workgroup, instead of each
// workgroup quantizing its columns into workgroup memory: each part's column side is loaded
// straight from storage (its 16-byte words shared by the invocations of a subgroup that take
// the same part of neighbouring rows, and cached for the other workgroups), the row is one
// chunk with no barrier, and nothing is kept in workgroup memory (KC is nominal). The norm
// of NORM is then `quant_cols`' (NORM there), so a PQ mat-vec has ADD at most.

const QB: u32 = {{QB}}u;
const TPB: u32 = {{TPB}}u;
const ROWS: u32 = {{ROWS}}u;
var<workgroup> parts: array<f32, {{WG}} * ROWS>;
#if ID
// The expert of the workgroup's (slot, token), read once for all its invocations.
var<workgroup> expert: i32;

// Id (e, t) of the ids in src3.
fn id_at(e: u32, t: u32) -> i32 {
    return bitcast<i32>(src3[(P.off4.x + e * P.s3.nb.x + t * P.s3.nb.y) >> 2u]);
}
#endif

const KC: u32 = {{KC}}u;
const QPS: u32 = {{QPS}}u;
// Columns per workgroup (MC), and column c's chunk: yq and yd from c KC / 16 and c KC / 32.
const NC: u32 = {{NC}}u;
var<workgroup> yq: array<vec4<u32>, NC * KC / 16u>;
var<workgroup> yd: array<f32, NC * KC / 32u>;
#if MC
// The sums of each 32 values' bytes (as yd), the first 16 values' in the low half of the
// word and the next 16's in the high half (i16 each: at most 16 x 127).
var<workgroup> ys: array<u32, NC * KC / 32u>;
#endif
const TPR: u32 = {{TPR}}u;
#if QKV
#if B4
@group(0) @binding(6) var<storage, read_write> src6: array<vec4<u32>>;
fn s6w(i: u32) -> u32 { return src6[i >> 2u][i & 3u]; }
fn last6() -> u32 { return arrayLength(&src6) * 4u - 1u; }
#else
@group(0) @binding(6) var<storage, read_write> src6: array<u32>;
fn s6w(i: u32) -> u32 { return src6[i]; }
fn last6() -> u32 { return arrayLength(&src6) - 1u; }
#endif
@group(0) @binding(7) var<storage, read_write> dst7: array<u32>;
#if ROPE
@group(0) @binding(9) var<storage, read_write> rope_pos: array<u32>;
@group(0) @binding(10) var<storage, read_write> rope_row: array<u32>;
// The sums of each row of the workgroup (x: Q's or K's, y: V's), for the rope of row pairs.
var<workgroup> pair_sums: array<vec2<f32>, ROWS>;
#endif
// Whether this workgroup takes rows of K and V (src2 and binding 6), else of Q (src0).
var<private> kv: bool;
#endif
#if NORM
@group(0) @binding(5) var<storage, read_write> norm_w: array<u32>;
// This invocation's sums of the squares of the x it has loaded, one per column.
var<private> sumsq: array<f32, NC>;

// Four values of column c at byte yb from k = e times w (zeros past the row's end); where
// `own` (they are this invocation's to count), their squares before that are added to
// sumsq[c].
fn y_norm(yb: u32, e: u32, own: bool, c: u32) -> vec4<f32> {
    let v = yquad(yb, e);
    if own {
        sumsq[c] += dot(v, v);
    }
    var w = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        if e + i < row_k() {
            w[i] = bitcast<f32>(norm_w[(P.off4.y >> 2u) + e + i]);
        }
    }
    return v * w;
}
#endif

// Quad q (values 4q .. 4q + 3) of the chunk from k0 of the src1 column c at byte yb (zeros
// past the row's end); with NORM times w, its squares added to sumsq[c] where it lies in the
// chunk (an invocation past the chunk loads values of the next one: not its to count).
fn y_at_quad(yb: u32, k0: u32, q: u32, c: u32) -> vec4<f32> {
#if NORM
    return y_norm(yb, k0 + 4u * q, q < KC / 4u, c);
#else
    return yquad(yb, k0 + 4u * q);
#endif
}

// The slot of the chunk's 16 values from 16i where each part multiplies n runs of 16 and
// run g of every part lies in plane g (KC / 16n slots each), in the parts' order.
fn plane_slot(i: u32, n: u32) -> u32 {
    return (i % n) * (KC / (16u * n)) + i / n;
}

// The slot in yq of the chunk's 16 values from 16i: the values one part of each of the
// neighbouring invocations multiplies lie in neighbouring slots, so that a subgroup's loads of
// them meet no bank conflicts. Q4_0 and Q4_1 keep the first and the second 16 values of each
// block in two planes, Q4_K the four 16-value runs of each 64-value group in four; Q6_K
// orders a block's 16 slots by the part's vec4 g; Q8_0 keeps the column's order.
fn y_slot(i: u32) -> u32 {
    switch T0 {
        case 2u, 3u: {
            return plane_slot(i, 2u);
        }
        case 12u: {
            return plane_slot(i, 4u);
        }
        case 14u: {
            let r = i & 15u;
            return (i & ~15u) + 4u * ((r >> 1u) & 3u) + 2u * (r >> 3u) + (r & 1u);
        }
        default: {
            return i;
        }
    }
}

// Stores quad q (4 values) of column c's chunk, quantized as the word w, into yq, and the
// scale of its 32-value block, the largest magnitude a over 127, into yd from the block's
// first quad. Quads past the chunk (values of the next one) are not stored.
fn store_quad(q: u32, w: u32, a: f32, c: u32) {
    if q < KC / 4u {
        yq[c * (KC / 16u) + y_slot(q >> 2u)][q & 3u] = w;
        if (q & 7u) == 0u {
            yd[c * (KC / 32u) + (q >> 3u)] = a / 127.0;
        }
    }
}

// Whether the weights' products take the sums of the column's bytes (Q4_1, Q4_K, Q6_K).
const YS: bool = (T0 == 3u) | (T0 == 12u) | (T0 == 14u);

#if MC
// Stores the sums s (of the 16 values from quad q's first) and h (of the 16 after) into ys,
// from the first quad of q's 32-value block of column c's chunk (not past the chunk).
fn store_sums(q: u32, s: i32, h: i32, c: u32) {
    if q < KC / 4u && (q & 7u) == 0u {
        ys[c * (KC / 32u) + (q >> 3u)] = (bitcast<u32>(s) & 0xffffu) | (bitcast<u32>(h) << 16u);
    }
}

// Half (i & 1) of ys word w: the sum of the bytes of the chunk's 16 values from 16i.
fn y_sum16(w: u32, i: u32) -> i32 {
    return bitcast<i32>(w << (16u - 16u * (i & 1u))) >> 16u;
}
#endif

#if YC
// The quads of the column one invocation loads in a step of the quantization with YC: v0, v1,
// v2, v3 are quads q, q + WG, q + 2 WG, q + 3 WG of the chunk (zeros past the first QPS).
struct YQuads {
    v0: vec4<f32>,
    v1: vec4<f32>,
    v2: vec4<f32>,
    v3: vec4<f32>,
}

// Loads the quads of a step of the quantization with YC from quad q of the chunk from k0 of
// the src1 column c at byte yb.
fn y_step_load(yb: u32, k0: u32, q: u32, c: u32) -> YQuads {
    var l: YQuads;
    l.v0 = y_at_quad(yb, k0, q, c);
    if QPS > 1u {
        l.v1 = y_at_quad(yb, k0, q + {{WG}}u, c);
    }
    if QPS > 2u {
        l.v2 = y_at_quad(yb, k0, q + 2u * {{WG}}u, c);
        l.v3 = y_at_quad(yb, k0, q + 3u * {{WG}}u, c);
    }
    return l;
}

// Quantizes the quads l loaded from quad q of column c (`y_step_load`) into yq and yd (with
// MC, and where the weights take them, their sums into ys). A 32-value block is the 8 quads
// of 8 neighbouring invocations (in one subgroup: its size is 8 or more), which share their
// largest magnitudes (and sums) by shuffles. Every invocation calls it, in uniform control
// flow.
fn y_step_store(l: YQuads, q: u32, c: u32) {
    var a = vec4<f32>(amax4(l.v0), amax4(l.v1), amax4(l.v2), amax4(l.v3));
    if QPS > 2u {
        a = max(a, subgroupShuffleXor(a, 1u));
        a = max(a, subgroupShuffleXor(a, 2u));
        a = max(a, subgroupShuffleXor(a, 4u));
    } else {
        var b = a.xy;
        b = max(b, subgroupShuffleXor(b, 1u));
        b = max(b, subgroupShuffleXor(b, 2u));
        b = max(b, subgroupShuffleXor(b, 4u));
        a = vec4<f32>(b, 0.0, 0.0);
    }
    let inv = select(vec4<f32>(0.0), vec4<f32>(127.0) / a, a > vec4<f32>(0.0));
    let w = vec4<u32>(q8x4(l.v0, inv.x), q8x4(l.v1, inv.y), q8x4(l.v2, inv.z), q8x4(l.v3, inv.w));
    store_quad(q, w.x, a.x, c);
    if QPS > 1u {
        store_quad(q + {{WG}}u, w.y, a.y, c);
    }
    if QPS > 2u {
        store_quad(q + 2u * {{WG}}u, w.z, a.z, c);
        store_quad(q + 3u * {{WG}}u, w.w, a.w, c);
    }
#if MC
    if YS {
        // Each quad's sum, then its 16-value half's (4 neighbouring invocations), and the
        // other half's (the 4 after them).
        let one = 0x01010101u;
        var h = vec4<i32>(dot4I8Packed(w.x, one), dot4I8Packed(w.y, one), dot4I8Packed(w.z, one), dot4I8Packed(w.w, one));
        h += subgroupShuffleXor(h, 1u);
        h += subgroupShuffleXor(h, 2u);
        let h2 = subgroupShuffleXor(h, 4u);
        store_sums(q, h.x, h2.x, c);
        if QPS > 1u {
            store_sums(q + {{WG}}u, h.y, h2.y, c);
        }
        if QPS > 2u {
            store_sums(q + 2u * {{WG}}u, h.z, h2.z, c);
            store_sums(q + 3u * {{WG}}u, h.w, h2.w, c);
        }
    }
#endif
}
#endif

// Quantizes values k0 .. k0 + KC of the src1 column c at byte yb (zeros past the row's end)
// into yq and yd (and with MC ys).
fn quantize_y(yb: u32, k0: u32, li: u32, c: u32) {
    let n = min(KC, row_k() - k0);
#if YC
    // Each step takes QPS x WG quads (4 values each): invocation li the quads li, li + WG, ...,
    // so that each of its loads reads one contiguous run with its neighbours' (`y_step_store`
    // says how a block's scale is shared). QPS (1, 2 or 4) is about the chunk's quads over WG,
    // so that the steps load few values past it.
    let steps = (n + 4u * QPS * {{WG}}u - 1u) / (4u * QPS * {{WG}}u);
    for (var s = 0u; s < steps; s++) {
        let q = QPS * {{WG}}u * s + li;
        y_step_store(y_step_load(yb, k0, q, c), q, c);
    }
#else
    // One invocation per 32 values.
    for (var i = li; i < (n + 31u) / 32u; i += {{WG}}u) {
        var v: array<vec4<f32>, 8>;
        var a = 0.0;
        for (var j = 0u; j < 8u; j++) {
#if NORM
            v[j] = y_norm(yb, k0 + 32u * i + 4u * j, true, c);
#else
            v[j] = yquad(yb, k0 + 32u * i + 4u * j);
#endif
            a = max(a, amax4(v[j]));
        }
        let inv = select(0.0, 127.0 / a, a > 0.0);
        let lo = vec4<u32>(q8x4(v[0], inv), q8x4(v[1], inv), q8x4(v[2], inv), q8x4(v[3], inv));
        let hi = vec4<u32>(q8x4(v[4], inv), q8x4(v[5], inv), q8x4(v[6], inv), q8x4(v[7], inv));
        yq[c * (KC / 16u) + y_slot(2u * i)] = lo;
        yq[c * (KC / 16u) + y_slot(2u * i + 1u)] = hi;
        yd[c * (KC / 32u) + i] = a / 127.0;
#if MC
        if YS {
            let one = vec4<u32>(0x01010101u);
            store_sums(8u * i, dot16(lo, one), dot16(hi, one), c);
        }
#endif
    }
#endif
}

#if MC
// Quantizes values k0 .. k0 + KC of columns c0, c0 + 1 and, where NC is more than 2, c0 + 2
// and c0 + 3 of the workgroup's, at bytes ybs of src1, into yq, yd and ys; with YC a step's
// loads of all of them go out before its stores.
fn quantize_cols(ybs: vec4<u32>, k0: u32, li: u32, c0: u32) {
#if YC
    let n = min(KC, row_k() - k0);
    let steps = (n + 4u * QPS * {{WG}}u - 1u) / (4u * QPS * {{WG}}u);
    for (var s = 0u; s < steps; s++) {
        let q = QPS * {{WG}}u * s + li;
        let l0 = y_step_load(ybs.x, k0, q, c0);
        let l1 = y_step_load(ybs.y, k0, q, c0 + 1u);
        var l2: YQuads;
        var l3: YQuads;
        if NC > 2u {
            l2 = y_step_load(ybs.z, k0, q, c0 + 2u);
            l3 = y_step_load(ybs.w, k0, q, c0 + 3u);
        }
        y_step_store(l0, q, c0);
        y_step_store(l1, q, c0 + 1u);
        if NC > 2u {
            y_step_store(l2, q, c0 + 2u);
            y_step_store(l3, q, c0 + 3u);
        }
    }
#else
    quantize_y(ybs.x, k0, li, c0);
    quantize_y(ybs.y, k0, li, c0 + 1u);
    if NC > 2u {
        quantize_y(ybs.z, k0, li, c0 + 2u);
        quantize_y(ybs.w, k0, li, c0 + 3u);
    }
#endif
}
#endif

// The vec4s of the column (16 values each) that one part multiplies.
fn y_vecs() -> u32 {
    switch T0 {
        case 8u: {
            return 1u;
        }
        case 12u, 14u: {
            return 4u;
        }
        default: {
            return 2u;
        }
    }
}

// The index in yq of the g-th vec4 of the column that part t of block bl of the chunk multiplies.
fn y_at(bl: u32, t: u32, g: u32) -> u32 {
    let base = bl * (QB / 16u);
    switch T0 {
        case 8u: {
            // Q8_0: values 16t ..
            return base + t;
        }
        case 12u: {
            // Q4_K: values 64 t + 16 g ..
            return base + 4u * t + g;
        }
        case 14u: {
            // Q6_K: values 128 (t / 2) + 16 (t % 2) .. and 32, 64, 96 further.
            return base + 8u * (t / 2u) + 2u * g + t % 2u;
        }
        default: {
            // Q4_0, Q4_1: the block's 32 values.
            return base + g;
        }
    }
}

// The column's side of a part: its vec4s of 8-bit values, their scales and their sums.
struct YPart {
    q: array<vec4<u32>, 4>,
    d: vec4<f32>,
    s: vec4<i32>,
}

// The dot product of 16 signed bytes with 16 others.
fn dot16(a: vec4<u32>, b: vec4<u32>) -> i32 {
    return dot4I8Packed(a.x, b.x) + dot4I8Packed(a.y, b.y) + dot4I8Packed(a.z, b.z) + dot4I8Packed(a.w, b.w);
}

#if PQ
// The flat index (in quant_cols' order) of the workgroup's first column, and of the last
// column of its batch (columns past it read that one).
var<private> pq_first: u32;
var<private> pq_last: u32;

// Column c's side of part t of block bl of the row, read from the pre-quantized columns in
// src1 (laid out as `quant_cols` writes them; scales from word h.x, sums from word h.y).
fn y_part(bl: u32, t: u32, c: u32) -> YPart {
    let f = min(pq_first + c, pq_last);
    let qv = (P.off.z >> 4u) + f * ({{KK}}u / 16u);
    let sw = (P.off.z >> 2u) + f * ({{KK}}u / 32u);
    var y: YPart;
    for (var g = 0u; g < y_vecs(); g++) {
        let i = y_at(bl, t, g);
        y.q[g] = src1[qv + i];
        y.d[g] = bitcast<f32>(s1w(sw + P.h.x + i / 2u));
        if YS {
            y.s[g] = y_sum16(s1w(sw + P.h.y + i / 2u), i);
        }
    }
    return y;
}
#else
// Column c's side of part t of block bl of the chunk.
fn y_part(bl: u32, t: u32, c: u32) -> YPart {
    var y: YPart;
    for (var g = 0u; g < y_vecs(); g++) {
        let i = y_at(bl, t, g);
        y.q[g] = yq[c * (KC / 16u) + y_slot(i)];
        y.d[g] = yd[c * (KC / 32u) + i / 2u];
#if MC
        if YS {
            y.s[g] = y_sum16(ys[c * (KC / 32u) + i / 2u], i);
        }
#else
        y.s[g] = dot16(y.q[g], vec4<u32>(0x01010101u));
#endif
    }
    return y;
}
#endif

// The raw words of one part of a weight block, as loaded: nothing here is used before the
// part is computed, so that the loads of the next part overlap the current one's arithmetic.
// a, b, c: runs of four words (2-byte aligned runs: from the word that holds their first
// byte, the word after each in x); s: further words (scales, d).
struct WPart {
    a: vec4<u32>,
    b: vec4<u32>,
    c: vec4<u32>,
    x: vec4<u32>,
    s: vec4<u32>,
}

// Word i of the weights: src0, or src2 where `u` (the second matrix of W2 variants). With
// QKV: src0 (Q), else src2 (K) in K and V workgroups, and binding 6 (V) where `u`.
fn wword(u: bool, i: u32) -> u32 {
#if QKV
    if u {
        return s6w(i);
    }
    if kv {
        return s2w(i);
    }
#else
#if W2
    if u {
        return s2w(i);
    }
#endif
#endif
    return s0w(i);
}

// Four words of the weights (`u` as in wword) from word i.
fn words4(u: bool, i: u32) -> vec4<u32> {
    return vec4<u32>(wword(u, i), wword(u, i + 1u), wword(u, i + 2u), wword(u, i + 3u));
}

// Word i of the weights, clamped to the binding's last word (for the word after a run whose
// last bytes end the binding).
fn word_c(u: bool, i: u32) -> u32 {
#if QKV
    if u {
        return s6w(min(i, last6()));
    }
    if kv {
        return s2w(min(i, last2()));
    }
#else
#if W2
    if u {
        return s2w(min(i, last2()));
    }
#endif
#endif
    return s0w(min(i, last0()));
}

// The 16 bytes from byte b of the weights, a multiple of 16 (with A4, one 16-byte load).
fn run16(u: bool, b: u32) -> vec4<u32> {
#if A4
#if QKV
    if u {
        return src6[b >> 4u];
    }
    if kv {
        return src2[b >> 4u];
    }
#else
#if W2
    if u {
        return src2[b >> 4u];
    }
#endif
#endif
    return src0[b >> 4u];
#else
    return words4(u, b >> 2u);
#endif
}

// The four words from the even byte b of a run loaded as w (from word b / 4) and x (the word
// after): w itself where b is a multiple of 4, else shifted by two bytes.
fn funnel(w: vec4<u32>, x: u32, b: u32) -> vec4<u32> {
    let hi = vec4<u32>(w.yzw, x);
    return select(w, (w >> vec4<u32>(16u)) | (hi << vec4<u32>(16u)), (b & 2u) != 0u);
}

// Loads part t of block b of the weight row at byte r (of src2 where `u`, else src0).
fn load_part(u: bool, r: u32, b: u32, t: u32) -> WPart {
    var w: WPart;
    switch T0 {
        case 2u: {
            // Q4_0: f16 d, 16 bytes of nibbles.
            let bb = r + 18u * b;
            // The five words that hold the block's 18 bytes.
            w.a = words4(u, bb >> 2u);
            w.x.x = word_c(u, (bb >> 2u) + 4u);
        }
        case 3u: {
            // Q4_1: f16 d, f16 m, 16 bytes of nibbles.
            let i = (r + 20u * b) >> 2u;
            w.s.x = wword(u, i);
            w.a = words4(u, i + 1u);
        }
        case 8u: {
            // Q8_0: f16 d, 32 x i8.
            let bb = r + 34u * b;
            let i = (bb + 2u + 16u * t) >> 2u;
            w.a = words4(u, i);
            w.x.x = word_c(u, i + 4u);
            w.s.x = wword(u, bb >> 2u);
        }
        case 12u: {
            // Q4_K: the 16-byte head (d, dmin, scales) and the group's 32 bytes of nibbles.
            let bb = r + 144u * b;
            w.a = run16(u, bb);
            w.b = run16(u, bb + 16u + 32u * t);
            w.c = run16(u, bb + 32u + 32u * t);
        }
        case 14u: {
            // Q6_K: three runs (low nibbles twice, high bits), the words of the four scales,
            // and the word of d.
            let bb = r + 210u * b;
            let n = t / 2u;
            let l = 16u * (t % 2u);
            let i0 = (bb + 64u * n + l) >> 2u;
            let i1 = (bb + 64u * n + 32u + l) >> 2u;
            let i2 = (bb + 128u + 32u * n + l) >> 2u;
            w.a = words4(u, i0);
            w.b = words4(u, i1);
            w.c = words4(u, i2);
            w.x = vec4<u32>(word_c(u, i0 + 4u), word_c(u, i1 + 4u), word_c(u, i2 + 4u), 0u);
            let sc = (bb + 192u + 8u * n + t % 2u) >> 2u;
            w.s = vec4<u32>(wword(u, sc), wword(u, sc + 1u), word_c(u, sc + 2u), wword(u, (bb + 208u) >> 2u));
        }
        default: {}
    }
    return w;
}

// The i8 at byte offset o (0..11) of the 12 bytes in s, as f32.
fn i8_in(s: vec3<u32>, o: u32) -> f32 {
    return f32(bitcast<i32>(byte12(s, o) << 24u) >> 24u);
}

// One part of a weight block unpacked: its values as signed or unsigned bytes (q, each
// vec4 multiplied with the column's vec4 of the same index) and its scales (f, g).
struct WQ {
    q: array<vec4<u32>, 4>,
    f: vec4<f32>,
    g: vec4<f32>,
}

// Part t of block b of the src0 row at byte r, loaded as w, unpacked.
fn unpack_part(w: WPart, r: u32, b: u32, t: u32) -> WQ {
    let m4 = vec4<u32>(0x0f0f0f0fu);
    let s4 = vec4<u32>(4u);
    var u: WQ;
    switch T0 {
        case 2u: {
            // Q4_0: byte j of the nibbles holds values j and j + 16; value - 8.
            let bb = r + 18u * b;
            // The nibbles start 2 bytes into the first word (bb a multiple of 4) or at the
            // second (bb 2 past one).
            let q = select(funnel(w.a, w.x.x, 2u), vec4<u32>(w.a.yzw, w.x.x), (bb & 2u) != 0u);
            // Each nibble n as the signed byte 16 (n - 8): n ^ 8 in the byte's high half, so
            // that the column's sums are not needed; the 1 / 16 is exact, and taken into the
            // scale here, once for every column the part is multiplied with.
            let mh = vec4<u32>(0xf0f0f0f0u);
            let h8 = vec4<u32>(0x80808080u);
            u.q[0] = ((q << s4) & mh) ^ h8;
            u.q[1] = (q & mh) ^ h8;
            u.f.x = half_in(w.a.x, bb) * 0.0625;
        }
        case 3u: {
            // Q4_1: d * q + m (d, m in f).
            u.q[0] = w.a & m4;
            u.q[1] = (w.a >> s4) & m4;
            u.f = vec4<f32>(halves(w.s.x), 0.0, 0.0);
        }
        case 8u: {
            // Q8_0: part t is values 16t .. 16t + 15.
            let bb = r + 34u * b;
            u.q[0] = funnel(w.a, w.x.x, bb + 2u + 16u * t);
            u.f.x = half_in(w.s.x, bb);
        }
        case 12u: {
            // Q4_K: 32 bytes of nibbles per 64 values, the low nibbles the first 32 (sub-block
            // 2t, 6-bit scale and min in f.xy), the high ones the next 32 (2t + 1, f.zw); part
            // t is the whole group t: its bytes 0 .. 15 in b, 16 .. 31 in c; d and dmin in g.
            u.q[0] = w.b & m4;
            u.q[1] = w.c & m4;
            u.q[2] = (w.b >> s4) & m4;
            u.q[3] = (w.c >> s4) & m4;
            u.f = sm_k_pair(w.a.yzw, t);
            u.g = vec4<f32>(halves(w.a.x), 0.0, 0.0);
        }
        case 14u: {
            // Q6_K: value (low | high << 4) - 32 times an i8 scale per 16 values (f) and d
            // (g.x). Half n = t / 2 has low nibbles at 64n (values l and l + 64) and 64n + 32
            // (l + 32, l + 96), high bits at 128 + 32n (values l, l + 32, l + 64, l + 96 from
            // bit 0, 2, 4, 6); part t takes l = 16 (t % 2) .. + 15.
            let bb = r + 210u * b;
            let n = t / 2u;
            let l = 16u * (t % 2u);
            let ql0 = funnel(w.a, w.x.x, bb + 64u * n + l);
            let ql1 = funnel(w.b, w.x.y, bb + 64u * n + 32u + l);
            let qh = funnel(w.c, w.x.z, bb + 128u + 32u * n + l);
            let m2 = vec4<u32>(0x03030303u);
            u.q[0] = (ql0 & m4) | ((qh & m2) << s4);
            u.q[1] = (ql1 & m4) | (((qh >> vec4<u32>(2u)) & m2) << s4);
            u.q[2] = ((ql0 >> s4) & m4) | (((qh >> s4) & m2) << s4);
            u.q[3] = ((ql1 >> s4) & m4) | (((qh >> vec4<u32>(6u)) & m2) << s4);
            // The scales are bytes o, o + 2, o + 4, o + 6 of the three words from the one
            // that holds the first.
            let o = (bb + 192u + 8u * n + t % 2u) & 3u;
            u.f = vec4<f32>(i8_in(w.s.xyz, o), i8_in(w.s.xyz, o + 2u), i8_in(w.s.xyz, o + 4u), i8_in(w.s.xyz, o + 6u));
            u.g.x = half_in(w.s.w, bb + 208u);
        }
        default: {}
    }
    return u;
}

// The dot product of an unpacked part u with the column's part y.
fn wq_dot(u: WQ, y: YPart) -> f32 {
    switch T0 {
        case 2u: {
            let s = dot16(u.q[0], y.q[0]) + dot16(u.q[1], y.q[1]);
            return u.f.x * y.d.x * f32(s);
        }
        case 3u: {
            let s = dot16(u.q[0], y.q[0]) + dot16(u.q[1], y.q[1]);
            return y.d.x * (u.f.x * f32(s) + u.f.y * f32(y.s.x + y.s.y));
        }
        case 8u: {
            return u.f.x * y.d.x * f32(dot16(u.q[0], y.q[0]));
        }
        case 12u: {
            // Value d * scale * q - dmin * min.
            let ia = f32(dot16(u.q[0], y.q[0]) + dot16(u.q[1], y.q[1]));
            let ib = f32(dot16(u.q[2], y.q[2]) + dot16(u.q[3], y.q[3]));
            let mins = u.f.y * y.d.x * f32(y.s.x + y.s.y) + u.f.w * y.d.z * f32(y.s.z + y.s.w);
            return u.g.x * (u.f.x * y.d.x * ia + u.f.z * y.d.z * ib) - u.g.y * mins;
        }
        case 14u: {
            let i0 = dot16(u.q[0], y.q[0]) - 32 * y.s.x;
            let i1 = dot16(u.q[1], y.q[1]) - 32 * y.s.y;
            let i2 = dot16(u.q[2], y.q[2]) - 32 * y.s.z;
            let i3 = dot16(u.q[3], y.q[3]) - 32 * y.s.w;
            return u.g.x * dot(vec4<f32>(f32(i0), f32(i1), f32(i2), f32(i3)) * y.d, u.f);
        }
        default: {
            return 0.0;
        }
    }
}

// The dot product of part t of block b of the src0 row at byte r, loaded as w, with the
// column's part y.
fn part_dot_q(w: WPart, r: u32, b: u32, t: u32, y: YPart) -> f32 {
    return wq_dot(unpack_part(w, r, b, t), y);
}

#if MC
// The sums of the workgroup's columns: columns 0 .. 3 in x, 4 .. 7 in y, 8 .. 11 in z,
// 12 .. 15 in w (as many as NC).
struct Acc {
    x: vec4<f32>,
    y: vec4<f32>,
    z: vec4<f32>,
    w: vec4<f32>,
}

// The product of the unpacked part u (part t of block bl of the chunk) with column c's, where
// c is one of the workgroup's NC columns (else 0: the branch is on constants).
fn col_dot(u: WQ, bl: u32, t: u32, c: u32) -> f32 {
    if c < NC {
        return wq_dot(u, y_part(bl, t, c));
    }
    return 0.0;
}

// acc plus the products of part p (loaded as q) with each column's chunk that starts at part
// base: the part is unpacked once for all NC columns.
fn add_parts(acc: Acc, q: Parts, r: u32, p: u32, base: u32) -> Acc {
    let t = p % TPB;
    let bl = (p - base) / TPB;
    let u = unpack_part(q.w, r, p / TPB, t);
    var a = acc;
    a.x += vec4<f32>(col_dot(u, bl, t, 0u), col_dot(u, bl, t, 1u), col_dot(u, bl, t, 2u), col_dot(u, bl, t, 3u));
    if NC > 4u {
        a.y += vec4<f32>(col_dot(u, bl, t, 4u), col_dot(u, bl, t, 5u), col_dot(u, bl, t, 6u), col_dot(u, bl, t, 7u));
    }
    if NC > 8u {
        a.z += vec4<f32>(col_dot(u, bl, t, 8u), col_dot(u, bl, t, 9u), col_dot(u, bl, t, 10u), col_dot(u, bl, t, 11u));
    }
    if NC > 12u {
        a.w += vec4<f32>(col_dot(u, bl, t, 12u), col_dot(u, bl, t, 13u), col_dot(u, bl, t, 14u), col_dot(u, bl, t, 15u));
    }
    return a;
}

// The bytes in src1 of columns c0 .. c0 + 3 of the group from column cb (for batch
// coordinates i2, i3): columns past dst's read its last.
fn col_ybs(cb: u32, c0: u32, i2: u32, i3: u32) -> vec4<u32> {
    let last = P.d.ne.y - 1u;
    let n = vec4<u32>(cb + c0) + vec4<u32>(0u, 1u, 2u, 3u);
    let l = min(n, vec4<u32>(last));
    return vec4<u32>(col1(l.x, i2, i3), col1(l.y, i2, i3), col1(l.z, i2, i3), col1(l.w, i2, i3));
}
#endif

// The sum of v over the TPR invocations of row li / TPR (j = li % TPR): the row's first
// invocation (j = 0) gets it. RSUB (a row's invocations are within one subgroup): by subgroup
// shuffles, and every invocation of the row gets it; else through workgroup memory (red).
// Every invocation calls it, in uniform control flow.
fn row_sum(v: f32, li: u32, j: u32) -> f32 {
#if RSUB
    var x = v;
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
        x += subgroupShuffleXor(x, s);
    }
    return x;
#else
    // Earlier readers of red are done with it.
    workgroupBarrier();
    red[li] = v;
    workgroupBarrier();
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
        if j < s {
            red[li] += red[li + s];
        }
        workgroupBarrier();
    }
    return red[li];
#endif
}

#if ROPE
// Row m's sums v (Q's or K's) and v2 (V's; none in Q workgroups) stored by ROPE (see above):
// the first invocation of each even row m < mm rotates the pair (m, m + 1) and stores it.
// Every invocation calls it, in uniform control flow.
fn rope_store(v: f32, v2: f32, m: u32, mm: u32, li: u32, j: u32) {
    let lr = li / TPR;
    if j == 0u {
        pair_sums[lr] = vec2<f32>(v, v2);
    }
    workgroupBarrier();
    if j != 0u || (lr & 1u) != 0u || m >= mm {
        return;
    }
    let next = pair_sums[lr + 1u];
    var y = vec2<f32>(v, next.x);
    let e = m % P.h.w;
    if e < P.h.z {
        let pos = f32(bitcast<i32>(rope_pos[P.h.x >> 2u]));
        y = rope_rotate(y, e / 2u, pos, P.g.x, P.g.y, P.h.z);
    }
    if !kv {
        let b = P.off.x + m * P.d.nb.x;
        put_word(b >> 2u, bitcast<u32>(y.x));
        put_word((b + P.d.nb.x) >> 2u, bitcast<u32>(y.y));
        return;
    }
    let row = rope_row[P.h.y >> 2u];
    if row >= P.s3.ne.y {
        return;
    }
    let at_row = row * P.s3.nb.y + m * P.s3.nb.x;
    let kb = (P.off4.x + at_row) >> 2u;
    let vb = (P.off4.w + at_row) >> 2u;
    if T3 == 1u {
        src3[kb] = f16_bits(y.x) | (f16_bits(y.y) << 16u);
        dst7[vb] = f16_bits(v2) | (f16_bits(next.y) << 16u);
    } else {
        src3[kb] = bitcast<u32>(y.x);
        src3[kb + 1u] = bitcast<u32>(y.y);
        dst7[vb] = bitcast<u32>(v2);
        dst7[vb + 1u] = bitcast<u32>(next.y);
    }
}
#endif

#if NORM
#if SUBGROUPS
// 1 / sqrt(mean(x^2) + eps) of a column from every invocation's sum of squares v (its sumsq):
// added in each subgroup (sli, ssz: this invocation's index in it and its size), then over the
// subgroups' sums in red. Every invocation calls it, in uniform control flow.
fn norm_scale(v: f32, li: u32, sli: u32, ssz: u32) -> f32 {
    let s = subgroupAdd(v);
    if sli == 0u {
        red[li / ssz] = s;
    }
    workgroupBarrier();
    var t = 0.0;
    for (var i = 0u; i < ({{WG}}u + ssz - 1u) / ssz; i++) {
        t += red[i];
    }
    return 1.0 / sqrt(t / f32(row_k()) + P.f.x);
}
#else
// 1 / sqrt(mean(x^2) + eps) of a column from every invocation's sum of squares v (its
// sumsq). Every invocation calls it, in uniform control flow.
fn norm_scale(v: f32, li: u32) -> f32 {
    return 1.0 / sqrt(wg_sum(v, li) / f32(row_k()) + P.f.x);
}
#endif
#endif

// The raw words of one part of each weight row an invocation takes: of src0 (w), and with W2
// of the second matrix (w2; with QKV only in K and V workgroups).
struct Parts {
    w: WPart,
    w2: WPart,
}

// Loads part pn of the rows at byte r of src0 and, with W2, at byte r2 of the second matrix.
fn load_parts(r: u32, r2: u32, pn: u32) -> Parts {
    var q: Parts;
    q.w = load_part(false, r, pn / TPB, pn % TPB);
#if W2
#if QKV
    if kv {
        q.w2 = load_part(true, r2, pn / TPB, pn % TPB);
    }
#else
    q.w2 = load_part(true, r2, pn / TPB, pn % TPB);
#endif
#endif
    return q;
}

// The products of part p (loaded as q) with the column's chunk that starts at part base: x
// src0's, y the second matrix's (W2; zero in Q workgroups of QKV).
fn parts_dot(q: Parts, r: u32, r2: u32, p: u32, base: u32) -> vec2<f32> {
    let t = p % TPB;
    let y = y_part((p - base) / TPB, t, 0u);
    var d = vec2<f32>(part_dot_q(q.w, r, p / TPB, t, y), 0.0);
#if W2
#if QKV
    if kv {
        d.y = part_dot_q(q.w2, r2, p / TPB, t, y);
    }
#else
    d.y = part_dot_q(q.w2, r2, p / TPB, t, y);
#endif
#endif
    return d;
}

// One workgroup per ROWS rows of one column of dst (with MC of NC columns; u.x workgroups in
// all; with QKV the first u.w of them for Q, the rest for K and V), TPR invocations per row.
@compute @workgroup_size({{WG}})
fn mat_vec_q(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
#if NORM
#if SUBGROUPS
    @builtin(subgroup_invocation_id) sli: u32,
    @builtin(subgroup_size) ssz: u32,
#endif
#endif
) {
    // Workgroups past the last (where the dispatch is laid out over two dimensions) take the
    // last one's rows and store nothing (m = mm below) rather than returning here: a branch on
    // the first parameter read holds back every read after it.
    let g = group(wg, nwg);
#if QKV
    let groups = P.u.x;
#else
#if MM
    let groups = ({{MM}}u + ROWS - 1u) / ROWS;
#else
    let groups = P.u.x;
#endif
#endif
    let live = g < groups;
    let o = min(g, groups - 1u);
    let kk = {{KK}}u;
#if QKV
    // One column: workgroup o takes row block o of Q, or o - u.w of K and V.
    kv = o >= P.u.w;
    let mm = select(P.d.ne.x, P.s3.ne.x, kv);
    let c = vec4<u32>(select(o, o - P.u.w, kv), 0u, 0u, 0u);
#else
#if MM
    let mm = {{MM}}u;
#else
    let mm = P.d.ne.x;
#endif
#if ONECOL
    let c = vec4<u32>(o, 0u, 0u, 0u);
#else
#if MC
    // c.y: the column group.
    let groups_n = vec4<u32>(P.d.ne.x, (P.d.ne.y + NC - 1u) / NC, P.d.ne.zw);
    let c = mat_vec_coords(o, (mm + ROWS - 1u) / ROWS, groups_n);
    let cb = c.y * NC;
#if PQ
    let batch = P.d.ne.y * (c.z + P.d.ne.z * c.w);
    pq_first = batch + cb;
    pq_last = batch + P.d.ne.y - 1u;
#endif
#else
    let c = mat_vec_coords(o, (mm + ROWS - 1u) / ROWS, P.d.ne);
#endif
#endif
#endif
    let m = select(mm, c.x * ROWS + li / TPR, live);
    let j = li % TPR;
#if ID
    if li == 0u {
        expert = id_at(c.y, c.z) - i32(P.u.y);
    }
    let xe = workgroupUniformLoad(&expert);
    let held = xe >= 0 && u32(xe) < P.s0.ne.z;
    // An expert src0 does not hold reads expert 0's rows (its sums are stored as 0).
    let eb = select(0u, u32(xe), held);
    let yb = P.off.z + (c.y % P.s1.ne.y) * P.s1.nb.y + c.z * P.s1.nb.z;
#else
    let yb = col1(c.y, c.z, c.w);
#endif
    // A row past the end repeats the last row (its sum is not stored).
    let mr = min(m, mm - 1u);
#if QKV
    let r = select(P.off.y + mr * P.s0.nb.y, P.off.w + mr * P.s2.nb.y, kv);
#else
#if ONECOL
    let r = P.off.y + mr * {{RS}}u;
#else
#if ID
    let r = P.off.y + mr * P.s0.nb.y + eb * P.s0.nb.z;
#else
    let r = row0(mr, c.z, c.w);
#endif
#endif
#endif
    // Parts of the row; invocation j takes parts j, j + TPR, ...
    let np = (kk / QB) * TPB;
#if W2
#if QKV
    // V's row (Q workgroups load none).
    let r2 = P.off4.z + mr * P.s2.nb.y;
#else
#if ID
    let r2 = P.off.w + mr * P.s2.nb.y + eb * P.s2.nb.z;
#else
    let r2 = P.off.w + mr * P.s2.nb.y;
#endif
#endif
#else
    let r2 = 0u;
#endif
    var p = j;
#if QF
    // The column's loads for its quantization (one chunk, one step) go out before the weights'.
    let ql = y_step_load(yb, 0u, li, 0u);
#endif
    var qa = load_parts(r, r2, min(p, np - 1u));
#if PF2
    var qb = load_parts(r, r2, min(p + TPR, np - 1u));
#endif
#if MC
    var acc: Acc;
#else
    var acc = vec2<f32>(0.0);
#endif
#if PQ
    // The columns are read pre-quantized from src1: the whole row is one chunk.
    let kstep = kk;
#else
    let kstep = KC;
#endif
    for (var k0 = 0u; k0 < kk; k0 += kstep) {
        // The previous chunk's parts are done with yq before it is overwritten (no barrier
        // before the first chunk, where it costs a measurable share of a short mat-vec).
        if k0 > 0u {
            workgroupBarrier();
        }
#if PQ
#else
#if QF
        y_step_store(ql, li, 0u);
#else
#if MC
        for (var c0 = 0u; c0 < NC; c0 += 4u) {
            quantize_cols(col_ybs(cb, c0, c.z, c.w), k0, li, c0);
        }
#else
        quantize_y(yb, k0, li, 0u);
#endif
#endif
        workgroupBarrier();
#endif
        let base = (k0 / QB) * TPB;
        let end = min(np, ((k0 + kstep) / QB) * TPB);
#if PF2
        // qa and qb take turns; each is loaded again as soon as it has been used, so that
        // it is never copied (a copy would wait for its loads). Where the chunk ends after
        // qa, qb holds the next part: they swap for the next chunk.
        loop {
            if p >= end {
                break;
            }
#if MC
            acc = add_parts(acc, qa, r, p, base);
#else
            acc += parts_dot(qa, r, r2, p, base);
#endif
            qa = load_parts(r, r2, min(p + 2u * TPR, np - 1u));
            p += TPR;
            if p >= end {
                let t = qa;
                qa = qb;
                qb = t;
                break;
            }
#if MC
            acc = add_parts(acc, qb, r, p, base);
#else
            acc += parts_dot(qb, r, r2, p, base);
#endif
            qb = load_parts(r, r2, min(p + 2u * TPR, np - 1u));
            p += TPR;
        }
#else
        for (; p < end; p += TPR) {
            let next = load_parts(r, r2, min(p + TPR, np - 1u));
#if MC
            acc = add_parts(acc, qa, r, p, base);
#else
            acc += parts_dot(qa, r, r2, p, base);
#endif
            qa = next;
        }
#endif
    }
#if MC
    // Each column: its norm, the sum over the row's invocations, its residual; columns past
    // dst's are not stored.
    var sums = array<f32, 16>(acc.x.x, acc.x.y, acc.x.z, acc.x.w, acc.y.x, acc.y.y, acc.y.z, acc.y.w, acc.z.x, acc.z.y, acc.z.z, acc.z.w, acc.w.x, acc.w.y, acc.w.z, acc.w.w);
    for (var cc = 0u; cc < NC; cc++) {
        var a = sums[cc];
#if NORM
        // Earlier readers of red are done with it.
        if cc > 0u {
            workgroupBarrier();
        }
#if SUBGROUPS
        a *= norm_scale(sumsq[cc], li, sli, ssz);
#else
        a *= norm_scale(sumsq[cc], li);
#endif
#endif
        var v = row_sum(a, li, j);
        let dc = vec4<u32>(m, cb + cc, c.zw);
        if j == 0u && m < mm && dc.y < P.d.ne.y {
#if ADD
            v += ld2(P.off.w + at(dc, P.s2.nb));
#endif
            st(P.off.x + at(dc, P.d.nb), v);
        }
    }
#else
#if NORM
#if SUBGROUPS
    let rs = norm_scale(sumsq[0], li, sli, ssz);
#else
    let rs = norm_scale(sumsq[0], li);
#endif
    acc *= rs;
#endif
    var v = row_sum(acc.x, li, j);
    let dc = vec4<u32>(m, c.yzw);
#if W2
    let v2 = row_sum(acc.y, li, j);
#if GLU
#if GELU
    // GEGLU: GELU's tanh form (written so that it never overflows) of the gate.
    let u = 0.7978845608028654 * v * (1.0 + 0.044715 * v * v);
    let e = exp(-2.0 * abs(u));
    v = 0.5 * v * (1.0 + sign(u) * (1.0 - e) / (1.0 + e)) * v2;
#else
    v = v / (1.0 + exp(-v)) * v2;
#endif
#else
#if QKV
#if ROPE
    rope_store(v, v2, m, mm, li, j);
    return;
#else
    // K and V workgroups store both sums (K's first) and are done.
    if kv {
        if j == 0u && m < mm {
            src3[(P.off4.x + at(dc, P.s3.nb)) >> 2u] = bitcast<u32>(v);
            dst7[(P.off4.w + at(dc, P.s3.nb)) >> 2u] = bitcast<u32>(v2);
        }
        return;
    }
#endif
#else
    if j == 0u && m < mm {
        src3[(P.off4.x + at(dc, P.s3.nb)) >> 2u] = bitcast<u32>(v2);
    }
#endif
#endif
#endif
#if ADD
    if j == 0u && m < mm {
        v += ld2(P.off.w + at(dc, P.s2.nb));
    }
#endif
#if ID
    v = select(0.0, v, held);
#endif
    if j == 0u && m < mm {
        st(P.off.x + at(dc, P.d.nb), v);
    }
#endif
}
