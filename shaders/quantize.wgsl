// Block quantization into dst (included by the families that write quantized blocks: cpy
// and set_rows). The quantizers are ggml's reference ones, as core/src/quant has them:
// Q4_0 and Q5_0 scale by the value of largest magnitude, Q4_1 and Q5_1 by min and max, Q8_0 by
// the largest magnitude with halfway cases rounded to even; the K types search their
// sub-block scales (make_qkx2_quants, make_qx_quants, make_q3_quants of k_search.rs), quantize
// those scales, and quantize the values again against the quantized scales. Blocks need not be
// word aligned: bytes go through put_byte (dst is atomic for quantized types).
// Defines: QK: values per block (32, or 256 for the K types).

const QK: u32 = {{QK}}u;

// The values of the block being quantized. K blocks are quantized by workgroups of one
// invocation (WG = 1) whose scratch lives in workgroup memory: as private arrays, the
// compilers unroll the searches into very large shaders (minutes of compiling on lavapipe).
#if KQUANT
var<workgroup> xs: array<f32, QK>;
#else
var<private> xs: array<f32, QK>;
#endif

// Writes f16 bits h at byte b.
fn put_half(b: u32, h: u32) {
    put_byte(b, h & 0xffu);
    put_byte(b + 1u, h >> 8u);
}

// 1 / d, or 0 when d is 0.
fn inverse(d: f32) -> f32 {
    return select(0.0, 1.0 / d, d != 0.0);
}

// Quantizes xs into a block of type t at byte b.
fn quantize_block(t: u32, b: u32) {
#if KQUANT
    quantize_k(t, b);
    return;
#else
    var amax = 0.0;
    var vmax = 0.0;
    var lo = xs[0];
    var hi = xs[0];
    for (var j = 0u; j < 32u; j++) {
        let v = xs[j];
        if amax < abs(v) {
            amax = abs(v);
            vmax = v;
        }
        lo = min(lo, v);
        hi = max(hi, v);
    }
    switch t {
        case 8u: {
            let d = amax / 127.0;
            let id = inverse(d);
            put_half(b, f16_bits(d));
            for (var j = 0u; j < 32u; j++) {
                put_byte(b + 2u + j, u32(i32(round(xs[j] * id))) & 0xffu);
            }
        }
        case 2u, 3u, 6u, 7u: {
            // Q4_0 and Q5_0: d from the value of largest magnitude, quants x / d + 2^(bits-1);
            // Q4_1 and Q5_1: d and m from min and max, quants (x - m) / d. The 5-bit types keep
            // the fifth bits in a word after the header.
            let with_min = t == 3u || t == 7u;
            let five = t == 6u || t == 7u;
            let top = select(15u, 31u, five);
            let levels = select(8.0, 16.0, five);
            let d = select(vmax / -levels, (hi - lo) / f32(top), with_min);
            let base = select(0.0, lo, with_min);
            let bias = select(levels, 0.0, with_min);
            let id = inverse(d);
            put_half(b, f16_bits(d));
            if with_min {
                put_half(b + 2u, f16_bits(lo));
            }
            let head = select(2u, 4u, with_min);
            let qs = head + select(0u, 4u, five);
            var qh = 0u;
            for (var j = 0u; j < 16u; j++) {
                let q0 = min(u32(max((xs[j] - base) * id + bias + 0.5, 0.0)), top);
                let q1 = min(u32(max((xs[j + 16u] - base) * id + bias + 0.5, 0.0)), top);
                put_byte(b + qs + j, (q0 & 15u) | ((q1 & 15u) << 4u));
                qh |= ((q0 >> 4u) << j) | ((q1 >> 4u) << (j + 16u));
            }
            if five {
                for (var k = 0u; k < 4u; k++) {
                    put_byte(b + head + k, qh >> (8u * k));
                }
            }
        }
        default: {}
    }
#endif
}

#if KQUANT
// Quants of the K block, its bytes as they are assembled, and the search's scratch.
var<workgroup> lq: array<i32, 256>;
var<workgroup> bk: array<u32, 210>;
var<workgroup> aux: array<i32, 32>;
var<workgroup> wq: array<f32, 32>;
var<workgroup> scales: array<f32, 16>;
var<workgroup> mins: array<f32, 16>;

// ggml's nearest_int: halfway cases to even.
fn nearest(v: f32) -> i32 {
    return i32(round(v));
}

// The weighted error term of make_qkx2_quants.
fn qerr(d: f32, mad: bool) -> f32 {
    return select(d * d, abs(d), mad);
}

// make_qkx2_quants over xs[o..o + n] with weights wq: quants 0..=nmax into lq, returns
// (scale, -min).
fn qkx2(o: u32, n: u32, nmax: i32, rmin: f32, rdelta: f32, nstep: i32, mad: bool) -> vec2<f32> {
    var mn = xs[o];
    var mx = xs[o];
    var sum_w = 0.0;
    var sum_x = 0.0;
    for (var i = 0u; i < n; i++) {
        let v = xs[o + i];
        mn = select(mn, v, v < mn);
        mx = select(mx, v, v > mx);
        sum_w += wq[i];
        sum_x += wq[i] * v;
    }
    if mn > 0.0 {
        mn = 0.0;
    }
    if mx == mn {
        for (var i = 0u; i < n; i++) {
            lq[o + i] = 0;
        }
        return vec2<f32>(0.0, -mn);
    }
    var iscale = f32(nmax) / (mx - mn);
    var scale = 1.0 / iscale;
    var best = 0.0;
    for (var i = 0u; i < n; i++) {
        let v = xs[o + i];
        let l = clamp(nearest(iscale * (v - mn)), 0, nmax);
        lq[o + i] = l;
        best += wq[i] * qerr(scale * f32(l) + mn - v, mad);
    }
    for (var is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * f32(is) + f32(nmax)) / (mx - mn);
        var sum_l = 0.0;
        var sum_l2 = 0.0;
        var sum_xl = 0.0;
        for (var i = 0u; i < n; i++) {
            let v = xs[o + i];
            let q = clamp(nearest(iscale * (v - mn)), 0, nmax);
            aux[i] = q;
            let qf = f32(q);
            sum_l += wq[i] * qf;
            sum_l2 += wq[i] * qf * qf;
            sum_xl += wq[i] * qf * v;
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            var this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            var this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            var cur = 0.0;
            for (var i = 0u; i < n; i++) {
                cur += wq[i] * qerr(this_scale * f32(aux[i]) + this_min - xs[o + i], mad);
            }
            if cur < best {
                for (var i = 0u; i < n; i++) {
                    lq[o + i] = aux[i];
                }
                best = cur;
                scale = this_scale;
                mn = this_min;
            }
        }
    }
    return vec2<f32>(scale, -mn);
}

// The value of largest magnitude of xs[o..o + 16] (the first on ties) and that magnitude.
fn signed_max16(o: u32) -> vec2<f32> {
    var mx = 0.0;
    var amax = 0.0;
    for (var i = 0u; i < 16u; i++) {
        let v = xs[o + i];
        if abs(v) > amax {
            amax = abs(v);
            mx = v;
        }
    }
    return vec2<f32>(mx, amax);
}

// The sums of make_qx_quants for one candidate inverse scale.
fn qx_sums(o: u32, nmax: i32, iscale: f32) -> vec2<f32> {
    var sumlx = 0.0;
    var suml2 = 0.0;
    for (var i = 0u; i < 16u; i++) {
        let v = xs[o + i];
        let q = f32(clamp(nearest(iscale * v), -nmax, nmax - 1));
        let w = v * v;
        sumlx += w * v * q;
        suml2 += w * q * q;
    }
    return vec2<f32>(sumlx, suml2);
}

// Stores the quants of make_qx_quants for an inverse scale, offset by nmax.
fn qx_store(o: u32, nmax: i32, iscale: f32) {
    for (var i = 0u; i < 16u; i++) {
        lq[o + i] = nmax + clamp(nearest(iscale * xs[o + i]), -nmax, nmax - 1);
    }
}

// make_qx_quants over the 16 values xs[o..o + 16] (Q6_K); returns the scale.
fn qx(o: u32, nmax: i32) -> f32 {
    let sm = signed_max16(o);
    if sm.y < 1e-15 {
        for (var i = 0u; i < 16u; i++) {
            lq[o + i] = 0;
        }
        return 0.0;
    }
    var iscale = -f32(nmax) / sm.x;
    qx_store(o, nmax, iscale);
    let s0 = qx_sums(o, nmax, iscale);
    var scale = select(0.0, s0.x / s0.y, s0.y != 0.0);
    var best = scale * s0.x;
    for (var is = -9; is <= 9; is++) {
        if is == 0 {
            continue;
        }
        iscale = -(f32(nmax) + 0.1 * f32(is)) / sm.x;
        let s = qx_sums(o, nmax, iscale);
        if s.y > 0.0 && s.x * s.x > best * s.y {
            qx_store(o, nmax, iscale);
            scale = s.x / s.y;
            best = scale * s.x;
        }
    }
    return scale;
}

// make_q3_quants over the 16 values xs[o..o + 16] with nmax 4 (Q3_K); returns the scale.
fn q3(o: u32) -> f32 {
    let nmax = 4;
    let sm = signed_max16(o);
    if sm.y < 1e-15 {
        for (var i = 0u; i < 16u; i++) {
            lq[o + i] = 0;
        }
        return 0.0;
    }
    let iscale = -f32(nmax) / sm.x;
    var sumlx = 0.0;
    var suml2 = 0.0;
    for (var i = 0u; i < 16u; i++) {
        let v = xs[o + i];
        let q = clamp(nearest(iscale * v), -nmax, nmax - 1);
        lq[o + i] = q;
        let w = v * v;
        sumlx += w * v * f32(q);
        suml2 += w * f32(q * q);
    }
    for (var it = 0; it < 5; it++) {
        var changed = 0;
        for (var i = 0u; i < 16u; i++) {
            let v = xs[o + i];
            let w = v * v;
            let cur = f32(lq[o + i]);
            var slx = sumlx - w * v * cur;
            if slx > 0.0 {
                var sl2 = suml2 - w * cur * cur;
                let nq = clamp(nearest(v * sl2 / slx), -nmax, nmax - 1);
                if nq != lq[o + i] {
                    slx += w * v * f32(nq);
                    sl2 += w * f32(nq * nq);
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        lq[o + i] = nq;
                        sumlx = slx;
                        suml2 = sl2;
                        changed++;
                    }
                }
            }
        }
        if changed == 0 {
            break;
        }
    }
    for (var i = 0u; i < 16u; i++) {
        lq[o + i] += nmax;
    }
    return select(0.0, sumlx / suml2, suml2 > 0.0);
}

// The largest of scales[0..n] and of mins[0..n] (0 when none is positive).
fn max_scale_min(n: u32) -> vec2<f32> {
    var max_scale = 0.0;
    var max_min = 0.0;
    for (var j = 0u; j < n; j++) {
        max_scale = select(max_scale, scales[j], scales[j] > max_scale);
        max_min = select(max_min, mins[j], mins[j] > max_min);
    }
    return vec2<f32>(max_scale, max_min);
}

// The scale of largest magnitude among scales[0..16] (the first on ties) and that magnitude.
fn signed_max_scale() -> vec2<f32> {
    var mx = 0.0;
    var amax = 0.0;
    for (var j = 0u; j < 16u; j++) {
        if abs(scales[j]) > amax {
            amax = abs(scales[j]);
            mx = scales[j];
        }
    }
    return vec2<f32>(mx, amax);
}

// f16 bits of v written into bk at byte i; returns v rounded through f16.
fn bk_half(i: u32, v: f32) -> f32 {
    let h = f16_bits(v);
    bk[i] = h & 0xffu;
    bk[i + 1u] = h >> 8u;
    return half(h);
}

// Q4_K and Q5_K: the 8 sub-block fits, the 6-bit scales and mins, and the final quants.
fn fit_k4(nmax: i32, rmin: f32, nstep: i32) {
    for (var j = 0u; j < 8u; j++) {
        var sum_x2 = 0.0;
        for (var i = 0u; i < 32u; i++) {
            sum_x2 += xs[32u * j + i] * xs[32u * j + i];
        }
        let av = sqrt(sum_x2 / 32.0);
        for (var i = 0u; i < 32u; i++) {
            wq[i] = av + abs(xs[32u * j + i]);
        }
        let sm = qkx2(32u * j, 32u, nmax, rmin, 0.1, nstep, false);
        scales[j] = sm.x;
        mins[j] = sm.y;
    }
    let mx = max_scale_min(8u);
    let max_scale = mx.x;
    let max_min = mx.y;
    let inv_scale = select(0.0, 63.0 / max_scale, max_scale > 0.0);
    let inv_min = select(0.0, 63.0 / max_min, max_min > 0.0);
    for (var i = 4u; i < 16u; i++) {
        bk[i] = 0u;
    }
    for (var j = 0u; j < 8u; j++) {
        let ls = u32(clamp(nearest(inv_scale * scales[j]), 0, 63));
        let lm = u32(clamp(nearest(inv_min * mins[j]), 0, 63));
        if j < 4u {
            bk[4u + j] = ls;
            bk[8u + j] = lm;
        } else {
            bk[8u + j] = (ls & 15u) | ((lm & 15u) << 4u);
            bk[j] |= (ls >> 4u) << 6u;
            bk[4u + j] |= (lm >> 4u) << 6u;
        }
    }
    let d = bk_half(0u, max_scale / 63.0);
    let dmin = bk_half(2u, max_min / 63.0);
    for (var j = 0u; j < 8u; j++) {
        var sc: u32;
        var m: u32;
        if j < 4u {
            sc = bk[4u + j] & 63u;
            m = bk[8u + j] & 63u;
        } else {
            sc = (bk[8u + j] & 15u) | ((bk[j] >> 6u) << 4u);
            m = (bk[8u + j] >> 4u) | ((bk[4u + j] >> 6u) << 4u);
        }
        let dl = d * f32(sc);
        if dl == 0.0 {
            continue;
        }
        let ml = dmin * f32(m);
        for (var i = 32u * j; i < 32u * j + 32u; i++) {
            lq[i] = clamp(nearest((xs[i] + ml) / dl), 0, nmax);
        }
    }
}

// Quantizes the 256 values of xs into a K block of type t at byte b.
fn quantize_k(t: u32, b: u32) {
    var size = 0u;
    switch t {
        case 10u: {
            // Q2_K.
            size = 84u;
            for (var j = 0u; j < 16u; j++) {
                for (var i = 0u; i < 16u; i++) {
                    wq[i] = abs(xs[16u * j + i]);
                }
                let sm = qkx2(16u * j, 16u, 3, -0.5, 0.1, 15, true);
                scales[j] = sm.x;
                mins[j] = sm.y;
            }
            let mx = max_scale_min(16u);
            let max_scale = mx.x;
            let max_min = mx.y;
            for (var j = 0u; j < 16u; j++) {
                var v = 0u;
                if max_scale > 0.0 {
                    v = u32(clamp(nearest(15.0 / max_scale * scales[j]), 0, 15));
                }
                if max_min > 0.0 {
                    v |= u32(clamp(nearest(15.0 / max_min * mins[j]), 0, 15)) << 4u;
                }
                bk[j] = v;
            }
            let d = bk_half(80u, max_scale / 15.0);
            let dmin = bk_half(82u, max_min / 15.0);
            for (var j = 0u; j < 16u; j++) {
                let dl = d * f32(bk[j] & 15u);
                if dl == 0.0 {
                    continue;
                }
                let ml = dmin * f32(bk[j] >> 4u);
                for (var i = 16u * j; i < 16u * j + 16u; i++) {
                    lq[i] = clamp(nearest((xs[i] + ml) / dl), 0, 3);
                }
            }
            for (var n = 0u; n < 2u; n++) {
                for (var i = 0u; i < 32u; i++) {
                    let e = 128u * n + i;
                    bk[16u + 32u * n + i] = u32(lq[e] | (lq[e + 32u] << 2u) | (lq[e + 64u] << 4u) | (lq[e + 96u] << 6u));
                }
            }
        }
        case 11u: {
            // Q3_K.
            size = 110u;
            for (var j = 0u; j < 16u; j++) {
                scales[j] = q3(16u * j);
            }
            let max_scale = signed_max_scale().x;
            for (var i = 0u; i < 110u; i++) {
                bk[i] = 0u;
            }
            var d = 0.0;
            if max_scale != 0.0 {
                let iscale = -32.0 / max_scale;
                for (var j = 0u; j < 16u; j++) {
                    let v = u32(clamp(nearest(iscale * scales[j]), -32, 31) + 32);
                    if j < 8u {
                        bk[96u + j] = v & 15u;
                    } else {
                        bk[96u + j - 8u] |= (v & 15u) << 4u;
                    }
                    bk[104u + j % 4u] |= (v >> 4u) << (2u * (j / 4u));
                }
                d = bk_half(108u, 1.0 / iscale);
            }
            for (var j = 0u; j < 16u; j++) {
                let sl = select(bk[96u + j - 8u] >> 4u, bk[96u + j] & 15u, j < 8u);
                let sh = (bk[104u + j % 4u] >> (2u * (j / 4u))) & 3u;
                let dl = d * f32(i32(sl | (sh << 4u)) - 32);
                if dl == 0.0 {
                    continue;
                }
                for (var i = 16u * j; i < 16u * j + 16u; i++) {
                    lq[i] = clamp(nearest(xs[i] / dl), -4, 3) + 4;
                }
            }
            for (var e = 0u; e < 256u; e++) {
                let n = e / 128u;
                let j = (e / 32u) % 4u;
                let i = e % 32u;
                let q = u32(lq[e]);
                bk[32u + 32u * n + i] |= (q & 3u) << (2u * j);
                bk[i] |= (q >> 2u) << (4u * n + j);
            }
        }
        case 12u, 13u: {
            // Q4_K, Q5_K.
            let five = t == 13u;
            size = select(144u, 176u, five);
            fit_k4(select(15, 31, five), select(-1.0, -0.5, five), select(20, 15, five));
            if five {
                for (var i = 0u; i < 32u; i++) {
                    bk[16u + i] = 0u;
                }
            }
            let qs = select(16u, 48u, five);
            for (var k = 0u; k < 4u; k++) {
                for (var i = 0u; i < 32u; i++) {
                    let l1 = u32(lq[64u * k + i]);
                    let l2 = u32(lq[64u * k + 32u + i]);
                    bk[qs + 32u * k + i] = (l1 & 15u) | ((l2 & 15u) << 4u);
                    if five {
                        bk[16u + i] |= ((l1 >> 4u) << (2u * k)) | ((l2 >> 4u) << (2u * k + 1u));
                    }
                }
            }
        }
        case 14u: {
            // Q6_K.
            size = 210u;
            for (var i = 0u; i < 210u; i++) {
                bk[i] = 0u;
            }
            for (var j = 0u; j < 16u; j++) {
                scales[j] = qx(16u * j, 32);
            }
            let sm = signed_max_scale();
            if sm.y >= 1e-15 {
                let iscale = -128.0 / sm.x;
                let d = bk_half(208u, 1.0 / iscale);
                for (var j = 0u; j < 16u; j++) {
                    let sc = clamp(nearest(iscale * scales[j]), -128, 127);
                    bk[192u + j] = u32(sc) & 0xffu;
                    let dl = d * f32(sc);
                    if dl == 0.0 {
                        continue;
                    }
                    for (var i = 16u * j; i < 16u * j + 16u; i++) {
                        lq[i] = clamp(nearest(xs[i] / dl), -32, 31) + 32;
                    }
                }
                for (var e = 0u; e < 256u; e++) {
                    let n = e / 128u;
                    let m = (e / 32u) % 4u;
                    let i = e % 32u;
                    let q = u32(lq[e]);
                    bk[64u * n + 32u * (m % 2u) + i] |= (q & 15u) << (4u * (m / 2u));
                    bk[128u + 32u * n + i] |= (q >> 4u) << (2u * m);
                }
            }
        }
        default: {}
    }
    for (var i = 0u; i < size; i++) {
        put_byte(b + i, bk[i]);
    }
}
#endif
