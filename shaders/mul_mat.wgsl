// Matrix products dst[m, n] = sum_k src0[k, m] * src1[k, n], batched over dims 2-3 with src0
// broadcast (op family "mul_mat"). src0 has any type T0 (quantized rows dequantized here),
// src1 is f32 or f16 (T1), dst f32.
//
// mat_vec: one workgroup per ROWS rows of one column of dst, its invocations striding over
//   32-element groups of the rows: each loads a group of src1 once and uses it for the ROWS
//   rows. Used for small n (generation). f16, Q4_0, Q4_1, Q8_0, Q4_K and Q6_K read whole
//   words of a block; other types dequantize element by element. With SUBGROUPS the partial sums are added with
//   subgroupAdd before the workgroup step.
// mat_mat: BM x BN tiles of dst per workgroup of 256 invocations (16 x 16, each BM/16 x BN/16
//   outputs), stepping through k in BK-deep tiles of src0 and src1 staged in workgroup memory.
//
// Params: u.x: workgroups (mat_vec); u.y, u.z: broadcast ratios of dims 2 and 3.

const BM: u32 = {{BM}}u;
const BN: u32 = {{BN}}u;
const BK: u32 = {{BK}}u;
const TM: u32 = BM / 16u;
const TN: u32 = BN / 16u;

// Byte offset of row m of src0 for dst batch coordinates (i2, i3).
fn row0(m: u32, i2: u32, i3: u32) -> u32 {
    return P.off.y + m * P.s0.nb.y + (i2 / P.u.y) * P.s0.nb.z + (i3 / P.u.z) * P.s0.nb.w;
}

// Byte offset of column n of src1.
fn col1(n: u32, i2: u32, i3: u32) -> u32 {
    return P.off.z + n * P.s1.nb.y + i2 * P.s1.nb.z + i3 * P.s1.nb.w;
}

// Element k of the src0 row at byte r.
fn w0(r: u32, k: u32) -> f32 {
#if QUANT
    return dq(T0, r, k);
#else
    return ld0(r + k * P.s0.nb.x);
#endif
}

// y[k] of the src1 column at byte yb.
fn y1(yb: u32, k: u32) -> f32 {
    return ld1(yb + k * P.s1.nb.x);
}

// The 32 values of src1 that the current group multiplies (loaded once, used for ROWS rows).
var<private> yv: array<f32, 32>;

// Loads group g of the src1 column at byte yb into yv (zeros past the row's end).
fn load_y(yb: u32, g: u32) {
    let k0 = g * 32u;
    for (var e = 0u; e < 32u; e++) {
        var y = 0.0;
        if k0 + e < P.s0.ne.x {
            y = y1(yb, k0 + e);
        }
        yv[e] = y;
    }
}

// The dot product of 32-element group g of the src0 row at byte r with yv.
fn dot32(r: u32, g: u32) -> f32 {
    let k0 = g * 32u;
    switch T0 {
        case 2u: {
            let b = r + g * 18u;
            var s = 0.0;
            for (var w = 0u; w < 4u; w++) {
                let q = word0(b + 2u + 4u * w);
                for (var t = 0u; t < 4u; t++) {
                    let j = 4u * w + t;
                    s += (f32((q >> (8u * t)) & 15u) - 8.0) * yv[j] + (f32((q >> (8u * t + 4u)) & 15u) - 8.0) * yv[j + 16u];
                }
            }
            return s * half0(b);
        }
        case 3u: {
            let b = r + g * 20u;
            var s = 0.0;
            var sy = 0.0;
            for (var w = 0u; w < 4u; w++) {
                let q = word0(b + 4u + 4u * w);
                for (var t = 0u; t < 4u; t++) {
                    let j = 4u * w + t;
                    s += f32((q >> (8u * t)) & 15u) * yv[j] + f32((q >> (8u * t + 4u)) & 15u) * yv[j + 16u];
                    sy += yv[j] + yv[j + 16u];
                }
            }
            return s * half0(b) + sy * half0(b + 2u);
        }
        case 8u: {
            let b = r + g * 34u;
            var s = 0.0;
            for (var w = 0u; w < 8u; w++) {
                let q = word0(b + 2u + 4u * w);
                for (var t = 0u; t < 4u; t++) {
                    s += f32(bitcast<i32>(q << (24u - 8u * t)) >> 24u) * yv[4u * w + t];
                }
            }
            return s * half0(b);
        }
        case 1u: {
            // f16: whole words (two values) when the group is full and word aligned.
            let b = r + k0 * 2u;
            if (b & 3u) == 0u && k0 + 32u <= P.s0.ne.x {
                var s = 0.0;
                for (var w = 0u; w < 16u; w++) {
                    let q = src0[(b >> 2u) + w];
                    s += half(q) * yv[2u * w] + half(q >> 16u) * yv[2u * w + 1u];
                }
                return s;
            }
        }
        case 12u: {
            // Q4_K: the group is sub-block j of its 256-value block; 32 nibbles in 8 words.
            let b = r + (g / 8u) * 144u;
            let j = g % 8u;
            let sm = scale_min_k4(b + 4u, j);
            let qb = b + 16u + 32u * (j / 2u);
            let sh = 4u * (j % 2u);
            var s = 0.0;
            var sy = 0.0;
            for (var w = 0u; w < 8u; w++) {
                let q = word0(qb + 4u * w) >> sh;
                for (var t = 0u; t < 4u; t++) {
                    let y = yv[4u * w + t];
                    s += f32((q >> (8u * t)) & 15u) * y;
                    sy += y;
                }
            }
            return half0(b) * f32(sm.x) * s - half0(b + 2u) * f32(sm.y) * sy;
        }
        case 14u: {
            // Q6_K: 32 values of one quarter of a half block: low nibbles from ql, two high bits
            // from qh, two 16-value sub-blocks with their own i8 scales.
            let b = r + (g / 8u) * 210u;
            let j = g % 8u;
            let n = j / 4u;
            let m = j % 4u;
            let lb = b + 64u * n + 32u * (m % 2u);
            let hb = b + 128u + 32u * n;
            var s0 = 0.0;
            var s1 = 0.0;
            for (var w = 0u; w < 8u; w++) {
                let lo = word0(lb + 4u * w) >> (4u * (m / 2u));
                let hi = word0(hb + 4u * w) >> (2u * m);
                for (var t = 0u; t < 4u; t++) {
                    let q = f32(i32(((lo >> (8u * t)) & 15u) | (((hi >> (8u * t)) & 3u) << 4u)) - 32);
                    if w < 4u {
                        s0 += q * yv[4u * w + t];
                    } else {
                        s1 += q * yv[4u * w + t];
                    }
                }
            }
            return half0(b + 208u) * (i8_0(b + 192u + 2u * j) * s0 + i8_0(b + 193u + 2u * j) * s1);
        }
        default: {}
    }
    // Every other case: element by element.
    var s = 0.0;
    let n = min(32u, P.s0.ne.x - k0);
    for (var e = 0u; e < n; e++) {
        s += w0(r, k0 + e) * yv[e];
    }
    return s;
}

const ROWS: u32 = {{ROWS}}u;
var<workgroup> parts: array<f32, {{WG}} * ROWS>;

@compute @workgroup_size({{WG}})
fn mat_vec(
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
    let mm = P.d.ne.x;
    let c = coords(o, vec4<u32>((mm + ROWS - 1u) / ROWS, P.d.ne.yzw));
    let m0 = c.x * ROWS;
    let yb = col1(c.y, c.z, c.w);
    let groups = (P.s0.ne.x + 31u) / 32u;
    var acc: array<f32, ROWS>;
    for (var r = 0u; r < ROWS; r++) {
        acc[r] = 0.0;
    }
    for (var g = li; g < groups; g += {{WG}}u) {
        load_y(yb, g);
        for (var r = 0u; r < ROWS; r++) {
            acc[r] += dot32(row0(min(m0 + r, mm - 1u), c.z, c.w), g);
        }
    }
#if SUBGROUPS
    let nsg = ({{WG}}u + ssz - 1u) / ssz;
    for (var r = 0u; r < ROWS; r++) {
        let part = subgroupAdd(acc[r]);
        if sli == 0u {
            parts[r * nsg + li / ssz] = part;
        }
    }
    workgroupBarrier();
    if li < ROWS && m0 + li < mm {
        var s = 0.0;
        for (var i = 0u; i < nsg; i++) {
            s += parts[li * nsg + i];
        }
        st(P.off.x + at(vec4<u32>(m0 + li, c.yzw), P.d.nb), s);
    }
#else
    for (var r = 0u; r < ROWS; r++) {
        let s = wg_sum(acc[r], li);
        if li == 0u && m0 + r < mm {
            st(P.off.x + at(vec4<u32>(m0 + r, c.yzw), P.d.nb), s);
        }
    }
#endif
}

var<workgroup> ta: array<f32, BM * BK>;
var<workgroup> tb: array<f32, BN * BK>;

@compute @workgroup_size(256)
fn mat_mat(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let m0 = wg.x * BM;
    let n0 = wg.y * BN;
    let i2 = wg.z % P.d.ne.z;
    let i3 = wg.z / P.d.ne.z;
    let mm = P.d.ne.x;
    let nn = P.d.ne.y;
    let kk = P.s0.ne.x;
    let tx = li % 16u;
    let ty = li / 16u;
    var acc: array<f32, TM * TN>;
    for (var i = 0u; i < TM * TN; i++) {
        acc[i] = 0.0;
    }
    for (var k0 = 0u; k0 < kk; k0 += BK) {
        for (var e = li; e < BM * BK; e += 256u) {
            let m = m0 + e / BK;
            let k = k0 + e % BK;
            var v = 0.0;
            if m < mm && k < kk {
                v = w0(row0(m, i2, i3), k);
            }
            ta[(e % BK) * BM + e / BK] = v;
        }
        for (var e = li; e < BN * BK; e += 256u) {
            let n = n0 + e / BK;
            let k = k0 + e % BK;
            var v = 0.0;
            if n < nn && k < kk {
                v = y1(col1(n, i2, i3), k);
            }
            tb[(e % BK) * BN + e / BK] = v;
        }
        workgroupBarrier();
        for (var k = 0u; k < BK; k++) {
            var a: array<f32, TM>;
            for (var i = 0u; i < TM; i++) {
                a[i] = ta[k * BM + tx + 16u * i];
            }
            for (var j = 0u; j < TN; j++) {
                let b = tb[k * BN + ty + 16u * j];
                for (var i = 0u; i < TM; i++) {
                    acc[j * TM + i] += a[i] * b;
                }
            }
        }
        workgroupBarrier();
    }
    for (var j = 0u; j < TN; j++) {
        let n = n0 + ty + 16u * j;
        for (var i = 0u; i < TM; i++) {
            let m = m0 + tx + 16u * i;
            if m < mm && n < nn {
                st(P.off.x + at(vec4<u32>(m, n, i2, i3), P.d.nb), acc[j * TM + i]);
            }
        }
    }
}
