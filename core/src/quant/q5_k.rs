//! Q5_K: 256 values in 176 bytes; 8 sub-blocks of 32 values, `x = d * sc * q - dmin * m`.
//!
//! Layout: f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales and mins as in Q4_K, 32 bytes `qh`,
//! 128 bytes `qs`. Value `64 k + l` (l < 32) is `(qs[32 k + l] & 15) + 16 * (qh[l] >> 2k & 1)`,
//! value `64 k + 32 + l` is `(qs[32 k + l] >> 4) + 16 * (qh[l] >> (2k + 1) & 1)`.

use super::get_f16;
use super::k_search::{scale_min_k4, Qkx2};
use super::q4_k::fit_k4;
use super::q8::{dot_i8_u8, q8k_bsum, q8k_parts};

/// Search parameters for Q5_K's sub-blocks.
const SEARCH: Qkx2 = Qkx2 {
    nmax: 31,
    rmin: -0.5,
    rdelta: 0.1,
    nstep: 15,
    use_mad: false,
};

/// Quantizes one block.
pub(super) fn quantize(x: &[f32], b: &mut [u8]) {
    let l = fit_k4(&SEARCH, x, b);
    let (qh, qs) = b[16..176].split_at_mut(32);
    qh.fill(0);
    for k in 0..4 {
        for i in 0..32 {
            let (l1, l2) = (l[64 * k + i], l[64 * k + 32 + i]);
            qs[32 * k + i] = (l1 & 15) | ((l2 & 15) << 4);
            qh[i] |= ((l1 >> 4) << (2 * k)) | ((l2 >> 4) << (2 * k + 1));
        }
    }
}

/// The 5-bit quants of a block in value order.
#[inline(always)]
fn unpack(qh: &[u8], qs: &[u8]) -> [u8; 256] {
    let mut q = [0u8; 256];
    for k in 0..4 {
        for i in 0..32 {
            q[64 * k + i] = (qs[32 * k + i] & 15) | (((qh[i] >> (2 * k)) & 1) << 4);
            q[64 * k + 32 + i] = (qs[32 * k + i] >> 4) | (((qh[i] >> (2 * k + 1)) & 1) << 4);
        }
    }
    q
}

/// Dequantizes one block.
pub(super) fn dequantize(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (get_f16(b, 0), get_f16(b, 2));
    let q = unpack(&b[16..48], &b[48..176]);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &b[4..16]);
        let (dl, ml) = (d * f32::from(sc), dmin * f32::from(m));
        for i in 32 * j..32 * j + 32 {
            y[i] = dl * f32::from(q[i]) - ml;
        }
    }
}

/// Q5_K weights times Q8_K activations.
pub(super) fn dot(x: &[u8], y: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (bx, by) in x.chunks_exact(176).zip(y.chunks_exact(292)) {
        let (dy, qy) = q8k_parts(by);
        let q = unpack(&bx[16..48], &bx[48..176]);
        let (mut sum_q, mut sum_m) = (0i32, 0i32);
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, &bx[4..16]);
            sum_q += i32::from(sc) * dot_i8_u8(&q[32 * j..32 * j + 32], &qy[32 * j..32 * j + 32]);
            sum_m += i32::from(m) * (q8k_bsum(by, 2 * j) + q8k_bsum(by, 2 * j + 1));
        }
        acc += dy * (get_f16(bx, 0) * sum_q as f32 - get_f16(bx, 2) * sum_m as f32);
    }
    acc
}
