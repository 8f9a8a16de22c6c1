//! Q6_K: 256 values in 210 bytes; 16 sub-blocks of 16 values, `x = d * sc * (q - 32)`.
//!
//! Layout: 128 bytes `ql` (low 4 bits), 64 bytes `qh` (high 2 bits), 16 x i8 `scales`, f16 `d`.
//! Value `e = 128 n + 32 m + l` (n < 2, m < 4, l < 32) has low bits
//! `ql[64 n + 32 (m % 2) + l] >> 4 (m / 2) & 15` and high bits `qh[32 n + l] >> 2 m & 3`; it
//! belongs to sub-block `e / 16`.

use super::k_search::{make_qx_quants, nearest_int};
use super::q8::q8k_parts;
use super::{get_f16, put_f16};

/// Quantizes one block.
pub(super) fn quantize(x: &[f32], b: &mut [u8]) {
    let mut l = [0i8; 256];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut amax) = (0f32, 0f32);
    for j in 0..16 {
        scales[j] = make_qx_quants(32, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
        if scales[j].abs() > amax {
            amax = scales[j].abs();
            max_scale = scales[j];
        }
    }
    b.fill(0);
    if amax < 1e-15 {
        return;
    }
    let iscale = -128.0 / max_scale;
    put_f16(b, 208, 1.0 / iscale);
    for j in 0..16 {
        b[192 + j] = nearest_int(iscale * scales[j]).clamp(-128, 127) as i8 as u8;
    }
    let d = get_f16(b, 208);
    for j in 0..16 {
        let dl = d * f32::from(b[192 + j] as i8);
        if dl == 0.0 {
            continue;
        }
        for i in 16 * j..16 * j + 16 {
            l[i] = (nearest_int(x[i] / dl).clamp(-32, 31) + 32) as i8;
        }
    }
    let (ql, qh) = b[..192].split_at_mut(128);
    for (e, &q) in l.iter().enumerate() {
        let (n, m, i) = (e / 128, (e / 32) % 4, e % 32);
        let q = q as u8;
        ql[64 * n + 32 * (m % 2) + i] |= (q & 15) << (4 * (m / 2));
        qh[32 * n + i] |= (q >> 4) << (2 * m);
    }
}

/// The signed quants (-32..32) of a block in value order.
#[inline(always)]
fn unpack(b: &[u8]) -> [i8; 256] {
    let mut q = [0i8; 256];
    for (n, qn) in q.chunks_exact_mut(128).enumerate() {
        let (ql, qh) = (&b[64 * n..64 * n + 64], &b[128 + 32 * n..160 + 32 * n]);
        for (m, qm) in qn.chunks_exact_mut(32).enumerate() {
            let ql = &ql[32 * (m % 2)..32 * (m % 2) + 32];
            for ((q, &lo), &hi) in qm.iter_mut().zip(ql).zip(qh) {
                let low = (lo >> (4 * (m / 2))) & 15;
                let high = (hi >> (2 * m)) & 3;
                *q = (low | (high << 4)) as i8 - 32;
            }
        }
    }
    q
}

/// Dequantizes one block.
pub(super) fn dequantize(b: &[u8], y: &mut [f32]) {
    let d = get_f16(b, 208);
    let q = unpack(b);
    for (e, y) in y.iter_mut().enumerate().take(256) {
        *y = d * f32::from(b[192 + e / 16] as i8) * f32::from(q[e]);
    }
}

/// Q6_K weights times Q8_K activations.
pub(super) fn dot(x: &[u8], y: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (bx, by) in x.chunks_exact(210).zip(y.chunks_exact(292)) {
        let (dy, qy) = q8k_parts(by);
        let q = unpack(bx);
        let mut sum = 0i32;
        for ((qs, ys), &sc) in q
            .chunks_exact(16)
            .zip(qy.chunks_exact(16))
            .zip(&bx[192..208])
        {
            let part: i32 = qs
                .iter()
                .zip(ys)
                .map(|(&a, &b)| i32::from(a) * i32::from(b as i8))
                .sum();
            sum += i32::from(sc as i8) * part;
        }
        acc += dy * get_f16(bx, 208) * sum as f32;
    }
    acc
}
