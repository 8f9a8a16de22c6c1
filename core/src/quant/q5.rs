//! Q5_0 and Q5_1: 32 values per block, 5 bits each.
//!
//! Q5_0 (22 bytes): f16 `d`, u32 `qh`, 16 bytes `qs`. Value `j` (0..16) has low bits
//! `qs[j] & 15` and fifth bit `qh >> j & 1`; value `j + 16` has low bits `qs[j] >> 4` and fifth
//! bit `qh >> (j + 16) & 1`. The value is `(q - 16) * d`.
//! Q5_1 (24 bytes): f16 `d`, f16 `m`, u32 `qh`, 16 bytes `qs`, unsigned: value = `q * d + m`.

use super::q4::{max_magnitude, min_max};
use super::{bytes, get_f16, inverse, put_f16};

/// The 5-bit values of a block from its `qh` word and 16 `qs` bytes.
#[inline(always)]
fn unpack(qh: u32, qs: &[u8]) -> [u8; 32] {
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = (qs[j] & 15) | (((qh >> j) & 1) << 4) as u8;
        q[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4) as u8;
    }
    q
}

/// Packs 32 5-bit values into `qh` (returned) and 16 `qs` bytes.
fn pack(q: &[u8; 32], qs: &mut [u8]) -> u32 {
    let mut qh = 0u32;
    for j in 0..16 {
        qs[j] = (q[j] & 15) | ((q[j + 16] & 15) << 4);
        qh |= u32::from(q[j] >> 4) << j;
        qh |= u32::from(q[j + 16] >> 4) << (j + 16);
    }
    qh
}

/// Quantizes one Q5_0 block: `d = max / -16` where `max` is the value of largest magnitude.
pub(super) fn quantize_q5_0(x: &[f32], b: &mut [u8]) {
    let d = max_magnitude(x) / -16.0;
    let id = inverse(d);
    put_f16(b, 0, d);
    let mut q = [0u8; 32];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = ((v * id + 16.5) as i8).min(31) as u8;
    }
    let qh = pack(&q, &mut b[6..22]);
    b[2..6].copy_from_slice(&qh.to_le_bytes());
}

/// Dequantizes one Q5_0 block.
pub(super) fn dequantize_q5_0(b: &[u8], y: &mut [f32]) {
    let d = get_f16(b, 0);
    let q = unpack(u32::from_le_bytes(bytes(&b[2..])), &b[6..22]);
    for (y, &q) in y.iter_mut().zip(&q) {
        *y = (q as i32 - 16) as f32 * d;
    }
}

/// Quantizes one Q5_1 block: `d = (max - min) / 31`, `m = min`.
pub(super) fn quantize_q5_1(x: &[f32], b: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inverse(d);
    put_f16(b, 0, d);
    put_f16(b, 2, min);
    let mut q = [0u8; 32];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (((v - min) * id + 0.5) as u8).min(31);
    }
    let qh = pack(&q, &mut b[8..24]);
    b[4..8].copy_from_slice(&qh.to_le_bytes());
}

/// Dequantizes one Q5_1 block.
pub(super) fn dequantize_q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (get_f16(b, 0), get_f16(b, 2));
    let q = unpack(u32::from_le_bytes(bytes(&b[4..])), &b[8..24]);
    for (y, &q) in y.iter_mut().zip(&q) {
        *y = q as f32 * d + m;
    }
}

/// Q5_0 weights times Q8_0 activations.
pub(super) fn dot_q5_0(x: &[u8], y: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (bx, by) in x.chunks_exact(22).zip(y.chunks_exact(34)) {
        let q = unpack(u32::from_le_bytes(bytes(&bx[2..])), &bx[6..22]);
        let s: i32 = q
            .iter()
            .zip(&by[2..34])
            .map(|(&q, &v)| (q as i32 - 16) * v as i8 as i32)
            .sum();
        acc += s as f32 * get_f16(bx, 0) * get_f16(by, 0);
    }
    acc
}

/// Q5_1 weights times Q8_1 activations: `d_x d_y sum(q_x q_y) + m_x s_y` per block.
pub(super) fn dot_q5_1(x: &[u8], y: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (bx, by) in x.chunks_exact(24).zip(y.chunks_exact(36)) {
        let q = unpack(u32::from_le_bytes(bytes(&bx[4..])), &bx[8..24]);
        let s: i32 = q
            .iter()
            .zip(&by[4..36])
            .map(|(&q, &v)| q as i32 * v as i8 as i32)
            .sum();
        acc += s as f32 * get_f16(bx, 0) * get_f16(by, 0) + get_f16(bx, 2) * get_f16(by, 2);
    }
    acc
}
