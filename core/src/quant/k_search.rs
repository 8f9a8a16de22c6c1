//! The scale searches the K types share (after ggml's `make_qx_quants`, `make_q3_quants` and
//! `make_qkx2_quants`), and the 6-bit scale/min packing of Q4_K and Q5_K.

/// Rounds to the nearest integer, halfway cases to even (ggml's `nearest_int`). Below 2^22 in
/// magnitude, adding 1.5 * 2^23 leaves the rounded integer in the low mantissa bits, one add
/// instead of the library call `round_ties_even` becomes without SSE4.1 (the K-quant searches
/// round ~40 times per value).
#[inline(always)]
pub(super) fn nearest_int(v: f32) -> i32 {
    const MAGIC: f32 = 12_582_912.0;
    if v.abs() < 4_194_303.0 {
        ((v + MAGIC).to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
    } else {
        v.round_ties_even() as i32
    }
}

/// Below this magnitude a group counts as all zeros.
const GROUP_MAX_EPS: f32 = 1e-15;

/// The value of largest magnitude of `x` and that magnitude.
fn signed_max(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (max, amax)
}

/// Symmetric quantization of `x` to `l` in `0..2*nmax` (offset by `nmax`), minimizing the
/// error weighted by `x^2` over 19 candidate scales; returns the scale (for Q6_K).
pub(super) fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let quant = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for &v in x {
            let q = quant(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * q;
            suml2 += w * q * q;
        }
        (sumlx, suml2)
    };
    let store = |iscale: f32, l: &mut [i8]| {
        for (l, &v) in l.iter_mut().zip(x) {
            *l = (nmax + quant(iscale, v)) as i8;
        }
    };
    let iscale = -(nmax as f32) / max;
    store(iscale, l);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&i| i != 0) {
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            store(iscale, l);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Symmetric 3-bit quantization of `x` to `l` in `0..2*nmax`, refined by coordinate descent on
/// the `x^2`-weighted error; returns the scale (for Q3_K).
pub(super) fn make_q3_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (l, &v) in l.iter_mut().zip(x) {
        let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *l = q as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * (q * q) as f32;
    }
    for _ in 0..5 {
        let mut changed = 0;
        for (l, &v) in l.iter_mut().zip(x) {
            let w = v * v;
            let cur = f32::from(*l);
            let mut slx = sumlx - w * v * cur;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * cur * cur;
                let new = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new != i32::from(*l) {
                    slx += w * v * new as f32;
                    sl2 += w * (new * new) as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *l = new as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed += 1;
                    }
                }
            }
        }
        if changed == 0 {
            break;
        }
    }
    for l in l.iter_mut() {
        *l += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// The search parameters of [`make_qkx2_quants`].
pub(super) struct Qkx2 {
    /// The largest quant (3, 15 or 31).
    pub nmax: i32,
    /// The first candidate's offset from `nmax`.
    pub rmin: f32,
    /// The step between candidates.
    pub rdelta: f32,
    /// The number of steps.
    pub nstep: i32,
    /// Minimize the weighted absolute error (else the weighted squared error).
    pub use_mad: bool,
}

/// Asymmetric quantization `x ~ scale * l - min` with `l` in `0..=nmax`, searching candidate
/// scales and refitting scale and min by weighted least squares; returns each sub-block's
/// `(scale, min)` with `min >= 0` (for Q2_K, Q4_K, Q5_K).
///
/// `x` and `w` hold `S` sub-blocks of `L` values each (sub-block `j` at `L * j..L * j + L`),
/// and `l` receives their quants in the same order. The sub-blocks are searched in lockstep,
/// lane `j` for sub-block `j`, so that the compiler can keep the `S` lanes in vector registers:
/// each lane still adds its terms in value order, so the result is bit-identical to searching
/// the sub-blocks one by one (and to ggml's `make_qkx2_quants`).
pub(super) fn make_qkx2_quants<const S: usize, const L: usize>(
    p: &Qkx2,
    x: &[f32],
    w: &[f32],
    l: &mut [u8],
) -> ([f32; S], [f32; S]) {
    if p.use_mad {
        qkx2_lanes::<S, L, true>(p, x, w, l)
    } else {
        qkx2_lanes::<S, L, false>(p, x, w, l)
    }
}

/// Rounds `v` to the nearest integer, halfway cases to even, for `|v| < 2^22` (a NaN gives an
/// arbitrary integer that the caller's clamp keeps in range): [`nearest_int`] without its
/// range check, so that a loop over lanes vectorizes.
#[inline(always)]
fn nearest_int_small(v: f32) -> i32 {
    ((v + 12_582_912.0).to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

fn qkx2_lanes<const S: usize, const L: usize, const MAD: bool>(
    p: &Qkx2,
    x: &[f32],
    w: &[f32],
    l: &mut [u8],
) -> ([f32; S], [f32; S]) {
    let err = |d: f32| if MAD { d.abs() } else { d * d };
    // Value-major copies: xt[i][j] is value i of sub-block j.
    let (mut xt, mut wt) = ([[0f32; S]; L], [[0f32; S]; L]);
    for j in 0..S {
        for i in 0..L {
            xt[i][j] = x[L * j + i];
            wt[i][j] = w[L * j + i];
        }
    }
    let (mut min, mut max) = (xt[0], xt[0]);
    let (mut sum_w, mut sum_x) = ([0f32; S], [0f32; S]);
    for i in 0..L {
        for j in 0..S {
            let v = xt[i][j];
            min[j] = if v < min[j] { v } else { min[j] };
            max[j] = if v > max[j] { v } else { max[j] };
            sum_w[j] += wt[i][j];
            sum_x[j] += wt[i][j] * v;
        }
    }
    let nmax = p.nmax;
    let (mut iscale, mut scale) = ([0f32; S], [0f32; S]);
    // A sub-block whose range (with 0 in it) is empty has nothing to search: all its quants
    // are 0 and its min is its value. Its lane runs along and is overwritten at the end.
    let mut flat = [false; S];
    for j in 0..S {
        if min[j] > 0.0 {
            min[j] = 0.0;
        }
        flat[j] = max[j] == min[j];
        iscale[j] = nmax as f32 / (max[j] - min[j]);
        scale[j] = 1.0 / iscale[j];
    }
    let mut best = [[0u8; S]; L];
    let mut best_error = [0f32; S];
    for i in 0..L {
        for j in 0..S {
            let q = nearest_int_small(iscale[j] * (xt[i][j] - min[j])).clamp(0, nmax);
            best[i][j] = q as u8;
            best_error[j] += wt[i][j] * err(scale[j] * q as f32 + min[j] - xt[i][j]);
        }
    }
    let mut aux = [[0u8; S]; L];
    for is in 0..=p.nstep {
        let step = p.rmin + p.rdelta * is as f32 + nmax as f32;
        for j in 0..S {
            iscale[j] = step / (max[j] - min[j]);
        }
        let (mut sum_l, mut sum_l2, mut sum_xl) = ([0f32; S], [0f32; S], [0f32; S]);
        for i in 0..L {
            for j in 0..S {
                let v = xt[i][j];
                let q = nearest_int_small(iscale[j] * (v - min[j])).clamp(0, nmax);
                aux[i][j] = q as u8;
                let (q, w) = (q as f32, wt[i][j]);
                sum_l[j] += w * q;
                sum_l2[j] += w * q * q;
                sum_xl[j] += w * q * v;
            }
        }
        let (mut this_scale, mut this_min) = ([0f32; S], [0f32; S]);
        let mut fits = [false; S];
        for j in 0..S {
            let det = sum_w[j] * sum_l2[j] - sum_l[j] * sum_l[j];
            fits[j] = det > 0.0;
            this_scale[j] = (sum_w[j] * sum_xl[j] - sum_x[j] * sum_l[j]) / det;
            this_min[j] = (sum_l2[j] * sum_x[j] - sum_l[j] * sum_xl[j]) / det;
            if this_min[j] > 0.0 {
                this_min[j] = 0.0;
                this_scale[j] = sum_xl[j] / sum_l2[j];
            }
        }
        if !fits.contains(&true) {
            continue;
        }
        let mut cur = [0f32; S];
        for i in 0..L {
            for j in 0..S {
                let d = this_scale[j] * f32::from(aux[i][j]) + this_min[j] - xt[i][j];
                cur[j] += wt[i][j] * err(d);
            }
        }
        for j in 0..S {
            if fits[j] && !flat[j] && cur[j] < best_error[j] {
                for i in 0..L {
                    best[i][j] = aux[i][j];
                }
                best_error[j] = cur[j];
                scale[j] = this_scale[j];
                min[j] = this_min[j];
            }
        }
    }
    let mut mins = [0f32; S];
    for j in 0..S {
        for i in 0..L {
            l[L * j + i] = if flat[j] { 0 } else { best[i][j] };
        }
        if flat[j] {
            scale[j] = 0.0;
        }
        mins[j] = -min[j];
    }
    (scale, mins)
}

/// Scale and min `j` (0..8) of a Q4_K/Q5_K 12-byte scales field, 6 bits each: sub-blocks 0..4
/// keep them in the low 6 bits of bytes `j` and `j + 4`; sub-blocks 4..8 keep their low 4 bits
/// in byte `j + 4` (scale low nibble, min high nibble) and their top 2 bits in the top bits of
/// bytes `j - 4` (scale) and `j` (min).
#[inline(always)]
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Packs 8 six-bit scales and mins into the 12-byte field [`scale_min_k4`] reads.
pub(super) fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8], q: &mut [u8]) {
    q[..12].fill(0);
    for j in 0..8 {
        if j < 4 {
            q[j] = ls[j];
            q[j + 4] = lm[j];
        } else {
            q[j + 4] = (ls[j] & 15) | ((lm[j] & 15) << 4);
            q[j - 4] |= (ls[j] >> 4) << 6;
            q[j] |= (lm[j] >> 4) << 6;
        }
    }
}

/// Quantizes the 8 sub-block scales and mins of a Q4_K/Q5_K block to 6 bits against their
/// maxima; returns the packed field's super-scales `(d, dmin)` (before f16 rounding).
pub(super) fn quantize_scales_k4(scales: &[f32; 8], mins: &[f32; 8], q: &mut [u8]) -> (f32, f32) {
    let max_scale = scales.iter().fold(0f32, |a, &v| if v > a { v } else { a });
    let max_min = mins.iter().fold(0f32, |a, &v| if v > a { v } else { a });
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        ls[j] = nearest_int(inv_scale * scales[j]).clamp(0, 63) as u8;
        lm[j] = nearest_int(inv_min * mins[j]).clamp(0, 63) as u8;
    }
    pack_scale_min_k4(&ls, &lm, q);
    (max_scale / 63.0, max_min / 63.0)
}

/// The weights Q4_K and Q5_K give each value of a 32-value sub-block: `rms(x) + |x_i|`.
pub(super) fn k4_weights(x: &[f32]) -> [f32; 32] {
    let sum_x2: f32 = x.iter().map(|v| v * v).sum();
    let av = (sum_x2 / 32.0).sqrt();
    let mut w = [0f32; 32];
    for (w, &v) in w.iter_mut().zip(x) {
        *w = av + v.abs();
    }
    w
}
