//! Q8_0, Q8_1 (32 values) and Q8_K (256 values): 8-bit types, mostly for activations.
//!
//! Q8_0 (34 bytes): f16 `d`, 32 x i8; value = `q * d`.
//! Q8_1 (36 bytes): f16 `d`, f16 `s` (= `d * sum(q)`, with `d` before its f16 rounding), 32 x i8.
//! Q8_K (292 bytes): f32 `d`, 256 x i8, 16 x i16 `bsums` (the sum of each 16 values' `q`).
//!
//! All three round halfway cases to even, so that the SIMD quantizers give the same bytes.

use super::{bytes, get_f16, inverse, put_f16};

/// The largest absolute value in `x`.
fn abs_max(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, v| m.max(v.abs()))
}

/// Quantizes 32 values to i8 with scale `amax / 127`; returns the scale and the sum of the q.
#[inline(always)]
fn quantize_32(x: &[f32], q: &mut [u8]) -> (f32, i32) {
    let d = abs_max(x) / 127.0;
    let id = inverse(d);
    let mut sum = 0i32;
    for (q, &v) in q.iter_mut().zip(x) {
        let i = (v * id).round_ties_even() as i8;
        sum += i32::from(i);
        *q = i as u8;
    }
    (d, sum)
}

/// Quantizes one Q8_0 block.
pub(super) fn quantize_q8_0(x: &[f32], b: &mut [u8]) {
    let (d, _) = quantize_32(x, &mut b[2..34]);
    put_f16(b, 0, d);
}

/// Dequantizes one Q8_0 block.
pub(super) fn dequantize_q8_0(b: &[u8], y: &mut [f32]) {
    let d = get_f16(b, 0);
    for (y, &q) in y.iter_mut().zip(&b[2..34]) {
        *y = q as i8 as f32 * d;
    }
}

/// Quantizes one Q8_1 block.
pub(super) fn quantize_q8_1(x: &[f32], b: &mut [u8]) {
    let (d, sum) = quantize_32(x, &mut b[4..36]);
    put_f16(b, 0, d);
    put_f16(b, 2, sum as f32 * d);
}

/// Dequantizes one Q8_1 block (`s` is redundant and not read).
pub(super) fn dequantize_q8_1(b: &[u8], y: &mut [f32]) {
    let d = get_f16(b, 0);
    for (y, &q) in y.iter_mut().zip(&b[4..36]) {
        *y = q as i8 as f32 * d;
    }
}

/// Quantizes one Q8_K block: `d = max / -127` where `max` is the value of largest magnitude.
pub(super) fn quantize_q8_k(x: &[f32], b: &mut [u8]) {
    let max = super::q4::max_magnitude(x);
    b.fill(0);
    if max == 0.0 {
        return;
    }
    let iscale = -127.0 / max;
    for (q, &v) in b[4..260].iter_mut().zip(x) {
        *q = ((iscale * v).round_ties_even() as i32).clamp(-128, 127) as i8 as u8;
    }
    for j in 0..16 {
        let s: i16 = b[4 + 16 * j..20 + 16 * j]
            .iter()
            .map(|&q| i16::from(q as i8))
            .sum();
        b[260 + 2 * j..262 + 2 * j].copy_from_slice(&s.to_le_bytes());
    }
    b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
}

/// Dequantizes one Q8_K block.
pub(super) fn dequantize_q8_k(b: &[u8], y: &mut [f32]) {
    let d = f32::from_le_bytes(bytes(b));
    for (y, &q) in y.iter_mut().zip(&b[4..260]) {
        *y = q as i8 as f32 * d;
    }
}

/// The exact integer dot product of two i8 slices.
#[inline(always)]
pub(super) fn dot_i8(a: &[u8], b: &[u8]) -> i32 {
    a.iter()
        .zip(b)
        .map(|(&a, &b)| i32::from(a as i8) * i32::from(b as i8))
        .sum()
}

/// Q8_0 weights times Q8_0 activations.
pub(super) fn dot_q8_0(x: &[u8], y: &[u8]) -> f32 {
    x.chunks_exact(34)
        .zip(y.chunks_exact(34))
        .map(|(bx, by)| dot_i8(&bx[2..], &by[2..]) as f32 * get_f16(bx, 0) * get_f16(by, 0))
        .sum()
}

/// Q8_1 times Q8_1.
pub(super) fn dot_q8_1(x: &[u8], y: &[u8]) -> f32 {
    x.chunks_exact(36)
        .zip(y.chunks_exact(36))
        .map(|(bx, by)| dot_i8(&bx[4..], &by[4..]) as f32 * get_f16(bx, 0) * get_f16(by, 0))
        .sum()
}

/// Q8_K times Q8_K.
pub(super) fn dot_q8_k(x: &[u8], y: &[u8]) -> f32 {
    x.chunks_exact(292)
        .zip(y.chunks_exact(292))
        .map(|(bx, by)| {
            let d = f32::from_le_bytes(bytes(bx)) * f32::from_le_bytes(bytes(by));
            dot_i8(&bx[4..260], &by[4..260]) as f32 * d
        })
        .sum()
}

/// The scale `d` and the 256 quants of a Q8_K activation block (for the K-type dots).
#[inline(always)]
pub(super) fn q8k_parts(by: &[u8]) -> (f32, &[u8]) {
    (f32::from_le_bytes(bytes(by)), &by[4..260])
}

/// The sum of the quants of 16-value group `g` of a Q8_K block.
#[inline(always)]
pub(super) fn q8k_bsum(by: &[u8], g: usize) -> i32 {
    i32::from(i16::from_le_bytes([by[260 + 2 * g], by[261 + 2 * g]]))
}

/// The exact integer dot product of unsigned quants `q` with i8 activations `a`.
#[inline(always)]
pub(super) fn dot_i8_u8(q: &[u8], a: &[u8]) -> i32 {
    q.iter()
        .zip(a)
        .map(|(&q, &a)| i32::from(q) * i32::from(a as i8))
        .sum()
}
