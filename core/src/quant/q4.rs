//! Q4_0 and Q4_1: 32 values per block, 4 bits each.
//!
//! Q4_0 (18 bytes): f16 `d`, then 16 bytes `qs`; value `j` (0..16) is `(qs[j] & 15) - 8` and
//! value `j + 16` is `(qs[j] >> 4) - 8`, each times `d`.
//! Q4_1 (20 bytes): f16 `d`, f16 `m`, then 16 bytes `qs` as in Q4_0 but unsigned: value =
//! `q * d + m`.

use super::{get_f16, inverse, put_f16};

/// Quantizes one Q4_0 block: `d = max / -8` where `max` is the value of largest magnitude.
pub(super) fn quantize_q4_0(x: &[f32], b: &mut [u8]) {
    let max = max_magnitude(x);
    let d = max / -8.0;
    let id = inverse(d);
    put_f16(b, 0, d);
    for j in 0..16 {
        let q0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
        let q1 = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
        b[2 + j] = q0 | (q1 << 4);
    }
}

/// The value of largest magnitude in `x` (the first one on ties), or 0.
pub(super) fn max_magnitude(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// The minimum and maximum of `x`.
pub(super) fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter().fold((f32::MAX, -f32::MAX), |(lo, hi), &v| {
        (if v < lo { v } else { lo }, if v > hi { v } else { hi })
    })
}

/// Dequantizes one Q4_0 block.
pub(super) fn dequantize_q4_0(b: &[u8], y: &mut [f32]) {
    let d = get_f16(b, 0);
    for j in 0..16 {
        y[j] = ((b[2 + j] & 15) as i32 - 8) as f32 * d;
        y[j + 16] = ((b[2 + j] >> 4) as i32 - 8) as f32 * d;
    }
}

/// Quantizes one Q4_1 block: `d = (max - min) / 15`, `m = min`.
pub(super) fn quantize_q4_1(x: &[f32], b: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inverse(d);
    put_f16(b, 0, d);
    put_f16(b, 2, min);
    for j in 0..16 {
        let q0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
        let q1 = (((x[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
        b[4 + j] = q0 | (q1 << 4);
    }
}

/// Dequantizes one Q4_1 block.
pub(super) fn dequantize_q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (get_f16(b, 0), get_f16(b, 2));
    for j in 0..16 {
        y[j] = (b[4 + j] & 15) as f32 * d + m;
        y[j + 16] = (b[4 + j] >> 4) as f32 * d + m;
    }
}

/// Q4_0 weights times Q8_0 activations.
pub(super) fn dot_q4_0(x: &[u8], y: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (bx, by) in x.chunks_exact(18).zip(y.chunks_exact(34)) {
        let mut s = 0i32;
        for j in 0..16 {
            s += ((bx[2 + j] & 15) as i32 - 8) * by[2 + j] as i8 as i32;
            s += ((bx[2 + j] >> 4) as i32 - 8) * by[18 + j] as i8 as i32;
        }
        acc += s as f32 * get_f16(bx, 0) * get_f16(by, 0);
    }
    acc
}

/// Q4_1 weights times Q8_1 activations: `d_x d_y sum(q_x q_y) + m_x s_y` per block.
pub(super) fn dot_q4_1(x: &[u8], y: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (bx, by) in x.chunks_exact(20).zip(y.chunks_exact(36)) {
        let mut s = 0i32;
        for j in 0..16 {
            s += (bx[4 + j] & 15) as i32 * by[4 + j] as i8 as i32;
            s += (bx[4 + j] >> 4) as i32 * by[20 + j] as i8 as i32;
        }
        acc += s as f32 * get_f16(bx, 0) * get_f16(by, 0) + get_f16(bx, 2) * get_f16(by, 2);
    }
    acc
}
