//! Q3_K: 256 values in 110 bytes; 16 sub-blocks of 16 values, `x = d * (sc - 32) * (q - 4)`.
//!
//! Layout: 32 bytes `hmask`, 64 bytes `qs`, 12 bytes `scales`, f16 `d`. Value
//! `e = 128 n + 32 j + l` (n < 2, j < 4, l < 32) has low bits `(qs[32 n + l] >> 2 j) & 3` and
//! high bit `hmask[l] >> (4 n + j) & 1`; `q` = low bits + 4 * high bit. Sub-block `s = e / 16`
//! has a 6-bit scale: low nibble from `scales[s]` (s < 8) or `scales[s - 8] >> 4`, top two bits
//! `scales[8 + s % 4] >> (2 (s / 4)) & 3`.

use super::k_search::{make_q3_quants, nearest_int};
use super::q8::q8k_parts;
use super::{get_f16, put_f16};

/// The 3-bit quant (0..8) of value `e`, from the block's `hmask` and `qs`.
#[inline(always)]
fn quant(hmask: &[u8], qs: &[u8], e: usize) -> i32 {
    let (n, j, l) = (e / 128, (e / 32) % 4, e % 32);
    let low = (qs[32 * n + l] >> (2 * j)) & 3;
    let high = (hmask[l] >> (4 * n + j)) & 1;
    i32::from(low | (high << 2))
}

/// The signed 6-bit scale (-32..32) of sub-block `s` from the 12-byte `scales` field.
#[inline(always)]
fn scale(sc: &[u8], s: usize) -> i32 {
    let low = if s < 8 { sc[s] & 15 } else { sc[s - 8] >> 4 };
    let high = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
    i32::from(low | (high << 4)) - 32
}

/// Quantizes one block.
pub(super) fn quantize(x: &[f32], b: &mut [u8]) {
    let mut l = [0i8; 256];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut amax) = (0f32, 0f32);
    for j in 0..16 {
        scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
        if scales[j].abs() > amax {
            amax = scales[j].abs();
            max_scale = scales[j];
        }
    }
    b[96..108].fill(0);
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        let sc = &mut b[96..108];
        for (j, &s) in scales.iter().enumerate() {
            let v = (nearest_int(iscale * s).clamp(-32, 31) + 32) as u8;
            if j < 8 {
                sc[j] = v & 15;
            } else {
                sc[j - 8] |= (v & 15) << 4;
            }
            sc[8 + j % 4] |= (v >> 4) << (2 * (j / 4));
        }
        put_f16(b, 108, 1.0 / iscale);
    } else {
        put_f16(b, 108, 0.0);
    }
    let d = get_f16(b, 108);
    for j in 0..16 {
        let dl = d * scale(&b[96..108], j) as f32;
        if dl == 0.0 {
            continue;
        }
        for i in 16 * j..16 * j + 16 {
            l[i] = (nearest_int(x[i] / dl).clamp(-4, 3) + 4) as i8;
        }
    }
    let (hmask, rest) = b.split_at_mut(32);
    hmask.fill(0);
    let qs = &mut rest[..64];
    qs.fill(0);
    for (e, &q) in l.iter().enumerate() {
        let (n, j, i) = (e / 128, (e / 32) % 4, e % 32);
        let q = q as u8;
        qs[32 * n + i] |= (q & 3) << (2 * j);
        hmask[i] |= (q >> 2) << (4 * n + j);
    }
}

/// Dequantizes one block.
pub(super) fn dequantize(b: &[u8], y: &mut [f32]) {
    let d = get_f16(b, 108);
    let (hmask, qs, sc) = (&b[..32], &b[32..96], &b[96..108]);
    for (e, y) in y.iter_mut().enumerate().take(256) {
        *y = d * scale(sc, e / 16) as f32 * (quant(hmask, qs, e) - 4) as f32;
    }
}

/// Q3_K weights times Q8_K activations.
pub(super) fn dot(x: &[u8], y: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (bx, by) in x.chunks_exact(110).zip(y.chunks_exact(292)) {
        let (dy, qy) = q8k_parts(by);
        let (hmask, qs, sc) = (&bx[..32], &bx[32..96], &bx[96..108]);
        let mut sum = 0i32;
        for s in 0..16 {
            let part: i32 = (16 * s..16 * s + 16)
                .map(|e| (quant(hmask, qs, e) - 4) * i32::from(qy[e] as i8))
                .sum();
            sum += scale(sc, s) * part;
        }
        acc += dy * get_f16(bx, 108) * sum as f32;
    }
    acc
}
