//! Q2_K: 256 values in 84 bytes; 16 sub-blocks of 16 values, `x = d * sc * q - dmin * m`.
//!
//! Layout: 16 bytes `scales` (sub-block `s`: low nibble the scale `sc`, high nibble the min
//! `m`), 64 bytes `qs`, f16 `d`, f16 `dmin`. Value `e = 128 n + 32 j + l` (n < 2, j < 4,
//! l < 32) is `(qs[32 n + l] >> 2 j) & 3` and belongs to sub-block `e / 16`.

use super::k_search::{make_qkx2_quants, nearest_int, Qkx2};
use super::q8::{q8k_bsum, q8k_parts};
use super::{get_f16, put_f16};

/// The 2-bit quant of value `e` of a block's `qs`.
#[inline(always)]
fn quant(qs: &[u8], e: usize) -> u8 {
    (qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3
}

/// Quantizes one block.
pub(super) fn quantize(x: &[f32], b: &mut [u8]) {
    let p = Qkx2 {
        nmax: 3,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: true,
    };
    let mut l = [0u8; 256];
    let mut w = [0f32; 256];
    for (w, v) in w.iter_mut().zip(x) {
        *w = v.abs();
    }
    let (scales, mins) = make_qkx2_quants::<16, 16>(&p, x, &w, &mut l);
    let max_scale = scales.iter().fold(0f32, |a, &v| if v > a { v } else { a });
    let max_min = mins.iter().fold(0f32, |a, &v| if v > a { v } else { a });
    b[..16].fill(0);
    if max_scale > 0.0 {
        let iscale = 15.0 / max_scale;
        for j in 0..16 {
            b[j] = nearest_int(iscale * scales[j]).clamp(0, 15) as u8;
        }
    }
    put_f16(b, 80, max_scale / 15.0);
    if max_min > 0.0 {
        let iscale = 15.0 / max_min;
        for j in 0..16 {
            b[j] |= (nearest_int(iscale * mins[j]).clamp(0, 15) as u8) << 4;
        }
    }
    put_f16(b, 82, max_min / 15.0);
    let (d, dmin) = (get_f16(b, 80), get_f16(b, 82));
    for ((&sc, xs), ls) in b[..16]
        .iter()
        .zip(x.chunks_exact(16))
        .zip(l.chunks_exact_mut(16))
    {
        let dl = d * f32::from(sc & 15);
        if dl == 0.0 {
            continue;
        }
        let ml = dmin * f32::from(sc >> 4);
        for (l, &v) in ls.iter_mut().zip(xs) {
            *l = nearest_int((v + ml) / dl).clamp(0, 3) as u8;
        }
    }
    let qs = &mut b[16..80];
    for n in 0..2 {
        for i in 0..32 {
            let e = 128 * n + i;
            qs[32 * n + i] = l[e] | (l[e + 32] << 2) | (l[e + 64] << 4) | (l[e + 96] << 6);
        }
    }
}

/// Dequantizes one block.
pub(super) fn dequantize(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (get_f16(b, 80), get_f16(b, 82));
    let qs = &b[16..80];
    for (e, y) in y.iter_mut().enumerate().take(256) {
        let sc = b[e / 16];
        *y = d * f32::from(sc & 15) * f32::from(quant(qs, e)) - dmin * f32::from(sc >> 4);
    }
}

/// Q2_K weights times Q8_K activations.
pub(super) fn dot(x: &[u8], y: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (bx, by) in x.chunks_exact(84).zip(y.chunks_exact(292)) {
        let (dy, qy) = q8k_parts(by);
        let qs = &bx[16..80];
        let (mut sum_q, mut sum_m) = (0i32, 0i32);
        for (s, &sc) in bx[..16].iter().enumerate() {
            let part: i32 = (16 * s..16 * s + 16)
                .map(|e| i32::from(quant(qs, e)) * i32::from(qy[e] as i8))
                .sum();
            sum_q += i32::from(sc & 15) * part;
            sum_m += i32::from(sc >> 4) * q8k_bsum(by, s);
        }
        acc += dy * (get_f16(bx, 80) * sum_q as f32 - get_f16(bx, 82) * sum_m as f32);
    }
    acc
}
