//! TQ1_0 and TQ2_0 (256 values): ternary weights (-1, 0, 1 times an f16 scale).
//!
//! TQ2_0 (66 bytes): 64 bytes `qs`, then f16 `d`. Byte `32c + m` of `qs` holds values
//! `128c + 32l + m` (l = 0..4) in its bits `2l..2l+2`, each `(q - 1) * d`.
//! TQ1_0 (54 bytes): 48 bytes `qs`, 4 bytes `qh`, then f16 `d`. Each byte holds 5 (qs) or 4 (qh)
//! base-3 digits as a fixed-point fraction: the byte is `ceil(n * 256 / 243)` for the base-3
//! number `n` of its digits (first digit most significant; qh's four digits are followed by a 0),
//! and digit `k` is read back as `((byte * 3^k) mod 256) * 3 >> 8`. Values run: qs bytes 0..32
//! (digit k of byte m is value `32k + m`), qs bytes 32..48 (digit k of byte 32 + m is value
//! `160 + 16k + m`), then qh (digit k of byte m is value `240 + 4k + m`).
//!
//! Both quantizers are ggml's: `d` is the largest magnitude, each value rounds to -1, 0 or 1.

use super::{get_f16, put_f16};

/// The scale and its inverse for a ternary block: the largest magnitude.
fn scale(x: &[f32]) -> (f32, f32) {
    let d = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    (d, if d != 0.0 { 1.0 / d } else { 0.0 })
}

/// The digit 0, 1 or 2 of `v` (for -1, 0, 1).
fn trit(v: f32, id: f32) -> u8 {
    ((v * id).round() as i32 + 1) as u8
}

/// Quantizes one TQ1_0 block.
pub(super) fn quantize_tq1(x: &[f32], b: &mut [u8]) {
    let (d, id) = scale(x);
    // The byte of base-3 number n: n / 243 as a fraction of 256, rounded up.
    let fixed = |n: u16| (n * 256).div_ceil(243) as u8;
    for m in 0..32 {
        let n = (0..5).fold(0u16, |n, k| n * 3 + u16::from(trit(x[m + 32 * k], id)));
        b[m] = fixed(n);
    }
    for m in 0..16 {
        let n = (0..5).fold(0u16, |n, k| {
            n * 3 + u16::from(trit(x[160 + m + 16 * k], id))
        });
        b[32 + m] = fixed(n);
    }
    for m in 0..4 {
        let n = (0..4).fold(0u16, |n, k| n * 3 + u16::from(trit(x[240 + m + 4 * k], id)));
        b[48 + m] = fixed(n * 3);
    }
    put_f16(b, 52, d);
}

/// Digit `k` of a TQ1_0 byte, less 1.
#[inline(always)]
pub(super) fn tq1_digit(q: u8, k: u32) -> i32 {
    let q = q.wrapping_mul(3u8.pow(k));
    ((u16::from(q) * 3) >> 8) as i32 - 1
}

/// Dequantizes one TQ1_0 block.
pub(super) fn dequantize_tq1(b: &[u8], y: &mut [f32]) {
    let d = get_f16(b, 52);
    for k in 0..5 {
        for m in 0..32 {
            y[32 * k as usize + m] = tq1_digit(b[m], k) as f32 * d;
        }
        for m in 0..16 {
            y[160 + 16 * k as usize + m] = tq1_digit(b[32 + m], k) as f32 * d;
        }
    }
    for k in 0..4 {
        for m in 0..4 {
            y[240 + 4 * k as usize + m] = tq1_digit(b[48 + m], k) as f32 * d;
        }
    }
}

/// Quantizes one TQ2_0 block.
pub(super) fn quantize_tq2(x: &[f32], b: &mut [u8]) {
    let (d, id) = scale(x);
    for c in 0..2 {
        for m in 0..32 {
            b[32 * c + m] = (0..4).fold(0u8, |q, l| {
                q | (trit(x[128 * c + 32 * l + m], id) << (2 * l))
            });
        }
    }
    put_f16(b, 64, d);
}

/// Dequantizes one TQ2_0 block.
pub(super) fn dequantize_tq2(b: &[u8], y: &mut [f32]) {
    let d = get_f16(b, 64);
    for c in 0..2 {
        for l in 0..4 {
            for m in 0..32 {
                let q = (b[32 * c + m] >> (2 * l)) & 3;
                y[128 * c + 32 * l + m] = (i32::from(q) - 1) as f32 * d;
            }
        }
    }
}
