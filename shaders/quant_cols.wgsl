// quant_cols: the columns of a mat-vec's src1 (f32 or f16, KK values each, KK a multiple of
// 32), quantized once for every workgroup of the integer-dot mat-vec that reads them
// pre-quantized (PQ in mat_vec_q.wgsl): each 32 values become 8-bit integers (four to a word),
// the largest magnitude mapped to 127, with one f32 scale (that magnitude over 127) and the
// sums of the bytes of each 16 (what the minimums and offsets of Q4_1, Q4_K and Q6_K take).
// Column f of the N = ne.y ne.z ne.w columns of src1 (ne.y fastest) goes to dst (words from
// off.x / 4) as:
//   quads:  words f KK / 4 .. (f + 1) KK / 4 (16 values per 4 words, in the column's order);
//   scales: f32 words h.x + f KK / 32 + b, one per 32-value block b;
//   sums:   words h.y + f KK / 32 + b: the first 16 values' byte sum in the low half (i16),
//           the next 16's in the high half.
// NORM quantizes rms_norm(x) * w instead, x in src1 and w (f32, one row of KK values) in
// src0 from byte off.y, eps in f.x: the column is quantized as x * w and each scale
// multiplied by 1 / sqrt(mean(x^2) + eps) (a per-32 scale is linear, so this equals
// quantizing the normalized product up to rounding); the sum of squares is taken over the
// whole column by every workgroup of the column (a few thousand values: cheaper than a second
// dispatch).
// Workgroups: u.y per column (WG blocks of 32 values each, one block per invocation), u.x in
// all, laid out over x then y.

// The quads of the column from k = 4 e at byte yb, times w with NORM.
fn col_quad(yb: u32, e: u32) -> vec4<f32> {
    let v = yquad(yb, 4u * e);
#if NORM
    let wb = (P.off.y >> 2u) + 4u * e;
    return v * vec4<f32>(bitcast<f32>(src0[wb]), bitcast<f32>(src0[wb + 1u]), bitcast<f32>(src0[wb + 2u]), bitcast<f32>(src0[wb + 3u]));
#else
    return v;
#endif
}

@compute @workgroup_size({{WG}})
fn quant_cols(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    // Workgroups past the last (the dispatch laid out over two dimensions) repeat its work and
    // store nothing: every invocation reaches the norm's barriers.
    let g = group(wg, nwg);
    let live = g < P.u.x;
    let o = min(g, P.u.x - 1u);
    let f = o / P.u.y;
    let c = coords(f, vec4<u32>(P.s1.ne.yzw, 1u));
    let yb = col1(c.x, c.y, c.z);
    let kk = {{KK}}u;
#if NORM
    var ss = 0.0;
    for (var e = li; e < kk / 4u; e += {{WG}}u) {
        let v = yquad(yb, 4u * e);
        ss += dot(v, v);
    }
    let rs = 1.0 / sqrt(wg_sum(ss, li) / f32(kk) + P.f.x);
#else
    let rs = 1.0;
#endif
    let b = (o % P.u.y) * {{WG}}u + li;
    if !live || b >= kk / 32u {
        return;
    }
    var v: array<vec4<f32>, 8>;
    var a = 0.0;
    for (var j = 0u; j < 8u; j++) {
        v[j] = col_quad(yb, 8u * b + j);
        a = max(a, amax4(v[j]));
    }
    let inv = select(0.0, 127.0 / a, a > 0.0);
    let lo = vec4<u32>(q8x4(v[0], inv), q8x4(v[1], inv), q8x4(v[2], inv), q8x4(v[3], inv));
    let hi = vec4<u32>(q8x4(v[4], inv), q8x4(v[5], inv), q8x4(v[6], inv), q8x4(v[7], inv));
    let base = P.off.x >> 2u;
    let q = base + f * (kk / 4u) + 8u * b;
    for (var j = 0u; j < 4u; j++) {
        dst[q + j] = lo[j];
        dst[q + 4u + j] = hi[j];
    }
    let one = vec4<u32>(0x01010101u);
    let s = dot4I8Packed(lo.x, one.x) + dot4I8Packed(lo.y, one.y) + dot4I8Packed(lo.z, one.z) + dot4I8Packed(lo.w, one.w);
    let h = dot4I8Packed(hi.x, one.x) + dot4I8Packed(hi.y, one.y) + dot4I8Packed(hi.z, one.z) + dot4I8Packed(hi.w, one.w);
    let blk = f * (kk / 32u) + b;
    dst[base + P.h.x + blk] = bitcast<u32>(a / 127.0 * rs);
    dst[base + P.h.y + blk] = (bitcast<u32>(s) & 0xffffu) | (bitcast<u32>(h) << 16u);
}
