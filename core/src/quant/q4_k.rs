//! Q4_K: 256 values in 144 bytes; 8 sub-blocks of 32 values, `x = d * sc * q - dmin * m`.
//!
//! Layout: f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales and mins (see
//! [`scale_min_k4`](super::k_search::scale_min_k4)), 128 bytes `qs`. Value `e = 64 k + l`
//! (l < 32) is `qs[32 k + l] & 15`, value `64 k + 32 + l` is `qs[32 k + l] >> 4`; value `e`
//! belongs to sub-block `e / 32`.

use super::k_search::{
    k4_weights, make_qkx2_quants, nearest_int, quantize_scales_k4, scale_min_k4, Qkx2,
};
use super::q8::{dot_i8_u8, q8k_bsum, q8k_parts};
use super::{get_f16, put_f16};

/// Search parameters for Q4_K's sub-blocks.
const SEARCH: Qkx2 = Qkx2 {
    nmax: 15,
    rmin: -1.0,
    rdelta: 0.1,
    nstep: 20,
    use_mad: false,
};

/// Fits the 8 sub-blocks of `x` (Q4_K and Q5_K), writes `d`, `dmin` and the scales field
/// (bytes 0, 2 and 4..16) into `b`, and returns each value's quant in `0..=nmax`.
pub(super) fn fit_k4(p: &Qkx2, x: &[f32], b: &mut [u8]) -> [u8; 256] {
    let mut l = [0u8; 256];
    let mut w = [0f32; 256];
    for j in 0..8 {
        w[32 * j..32 * j + 32].copy_from_slice(&k4_weights(&x[32 * j..32 * j + 32]));
    }
    let (scales, mins) = make_qkx2_quants::<8, 32>(p, x, &w, &mut l);
    let (d, dmin) = quantize_scales_k4(&scales, &mins, &mut b[4..16]);
    put_f16(b, 0, d);
    put_f16(b, 2, dmin);
    let (d, dmin) = (get_f16(b, 0), get_f16(b, 2));
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &b[4..16]);
        let dl = d * f32::from(sc);
        if dl == 0.0 {
            continue;
        }
        let ml = dmin * f32::from(m);
        for i in 32 * j..32 * j + 32 {
            l[i] = nearest_int((x[i] + ml) / dl).clamp(0, p.nmax) as u8;
        }
    }
    l
}

/// Quantizes one block.
pub(super) fn quantize(x: &[f32], b: &mut [u8]) {
    let l = fit_k4(&SEARCH, x, b);
    let qs = &mut b[16..144];
    for k in 0..4 {
        for i in 0..32 {
            qs[32 * k + i] = l[64 * k + i] | (l[64 * k + 32 + i] << 4);
        }
    }
}

/// The 4-bit quants of a block in value order.
#[inline(always)]
fn unpack(qs: &[u8]) -> [u8; 256] {
    let mut q = [0u8; 256];
    for k in 0..4 {
        for i in 0..32 {
            q[64 * k + i] = qs[32 * k + i] & 15;
            q[64 * k + 32 + i] = qs[32 * k + i] >> 4;
        }
    }
    q
}

/// Dequantizes one block.
pub(super) fn dequantize(b: &[u8], y: &mut [f32]) {
    dequantize_k4(b, &unpack(&b[16..144]), y);
}

/// Q4_K weights times Q8_K activations.
pub(super) fn dot(x: &[u8], y: &[u8]) -> f32 {
    x.chunks_exact(144)
        .zip(y.chunks_exact(292))
        .map(|(bx, by)| dot_k4(bx, &unpack(&bx[16..144]), by))
        .sum()
}

/// The values of a Q4_K or Q5_K block `b` whose quants, in value order, are `q`:
/// `d * sc * q - dmin * m` with each sub-block's scale and min.
#[inline(always)]
pub(super) fn dequantize_k4(b: &[u8], q: &[u8; 256], y: &mut [f32]) {
    let (d, dmin) = (get_f16(b, 0), get_f16(b, 2));
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &b[4..16]);
        let (dl, ml) = (d * f32::from(sc), dmin * f32::from(m));
        for i in 32 * j..32 * j + 32 {
            y[i] = dl * f32::from(q[i]) - ml;
        }
    }
}

/// The dot product of a Q4_K or Q5_K block `bx`, whose quants in value order are `q`, with the
/// Q8_K block `by`.
#[inline(always)]
pub(super) fn dot_k4(bx: &[u8], q: &[u8; 256], by: &[u8]) -> f32 {
    let (dy, qy) = q8k_parts(by);
    let (mut sum_q, mut sum_m) = (0i32, 0i32);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &bx[4..16]);
        sum_q += i32::from(sc) * dot_i8_u8(&q[32 * j..32 * j + 32], &qy[32 * j..32 * j + 32]);
        sum_m += i32::from(m) * (q8k_bsum(by, 2 * j) + q8k_bsum(by, 2 * j + 1));
    }
    dy * (get_f16(bx, 0) * sum_q as f32 - get_f16(bx, 2) * sum_m as f32)
}
