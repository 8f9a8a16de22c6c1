//! Q5_K: 256 values in 176 bytes; 8 sub-blocks of 32 values, `x = d * sc * q - dmin * m`.
//!
//! Layout: f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales and mins as in Q4_K, 32 bytes `qh`,
//! 128 bytes `qs`. Value `64 k + l` (l < 32) is `(qs[32 k + l] & 15) + 16 * (qh[l] >> 2k & 1)`,
//! value `64 k + 32 + l` is `(qs[32 k + l] >> 4) + 16 * (qh[l] >> (2k + 1) & 1)`.

use super::k_search::Qkx2;
use super::q4_k::{dequantize_k4, dot_k4, fit_k4};

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
    dequantize_k4(b, &unpack(&b[16..48], &b[48..176]), y);
}

/// Q5_K weights times Q8_K activations.
pub(super) fn dot(x: &[u8], y: &[u8]) -> f32 {
    x.chunks_exact(176)
        .zip(y.chunks_exact(292))
        .map(|(bx, by)| dot_k4(bx, &unpack(&bx[16..48], &bx[48..176]), by))
        .sum()
}
