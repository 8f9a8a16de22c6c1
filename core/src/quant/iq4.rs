//! IQ4_NL (32 values) and IQ4_XS (256 values): 4-bit indices into a fixed non-linear table.
//!
//! IQ4_NL (18 bytes): f16 `d`, 16 bytes `qs`; value `j` (0..16) is `d * T[qs[j] & 15]` and value
//! `j + 16` is `d * T[qs[j] >> 4]`, with `T` = [`IQ4_VALUES`].
//! IQ4_XS (136 bytes): f16 `d`, u16 `scales_h`, 4 bytes `scales_l`, 128 bytes `qs`. Sub-block `i`
//! (32 values) has the 6-bit scale `ls` = low nibble `i % 2` of `scales_l[i / 2]` plus bits
//! `2i..2i+2` of `scales_h` as its top two bits; its values are `d * (ls - 32) * T[q]`, its 16
//! bytes of `qs` packed as in IQ4_NL.
//!
//! The quantizers are ggml's (`quantize_iq4_nl` / `quantize_iq4_xs` without an importance matrix,
//! as llama-quantize runs them): each 32-value group's scale is the best of 15 trial scales by
//! the squared error weighted with `x^2`; IQ4_XS then quantizes the group scales to 6 bits
//! against the super-block's largest.

use super::k_search::nearest_int;
use super::{get_f16, put_f16};

/// The non-linear 4-bit table of IQ4_NL and IQ4_XS (sorted).
pub const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Below this magnitude a group counts as all zeros.
const GROUP_MAX_EPS: f32 = 1e-15;
/// The trial scales on each side of the first guess.
const NTRY: i32 = 7;

/// The index of the value of sorted `vals` nearest `x` (the upper one of a tie).
pub(super) fn best_index(vals: &[i8], x: f32) -> usize {
    let n = vals.len();
    if x <= f32::from(vals[0]) {
        return 0;
    }
    if x >= f32::from(vals[n - 1]) {
        return n - 1;
    }
    let (mut lo, mut hi) = (0, n - 1);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < f32::from(vals[mid]) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - f32::from(vals[hi - 1]) < f32::from(vals[hi]) - x {
        hi - 1
    } else {
        hi
    }
}

/// The best scale of one 32-value group, and its indices in `l`; 0 for a group of zeros.
fn group_scale(x: &[f32], l: &mut [u8]) -> f32 {
    let t = |i: usize| f32::from(IQ4_VALUES[i]);
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    // Weighted sums for the scale `1 / id`: sum(w q x) and sum(w q^2), with w = x^2.
    let sums = |id: f32, l: Option<&mut [u8]>| {
        let (mut sqx, mut sq2) = (0f32, 0f32);
        let mut out = l;
        for (j, &v) in x.iter().enumerate() {
            let i = best_index(&IQ4_VALUES, id * v);
            if let Some(o) = out.as_deref_mut() {
                o[j] = i as u8;
            }
            let (q, w) = (t(i), v * v);
            sqx += w * q * v;
            sq2 += w * q * q;
        }
        (sqx, sq2)
    };
    let d0 = -max / t(0);
    let (sqx, sq2) = sums(1.0 / d0, Some(l));
    let mut d = if sq2 > 0.0 { sqx / sq2 } else { 0.0 };
    let mut best = d * sqx;
    for itry in -NTRY..=NTRY {
        let id = (itry as f32 + t(0)) / max;
        let (sqx, sq2) = sums(id, None);
        if sq2 > 0.0 && sqx * sqx > best * sq2 {
            d = sqx / sq2;
            best = d * sqx;
        }
    }
    d
}

/// Packs 32 indices into 16 bytes: value j in the low nibble of byte j, value j + 16 in its
/// high nibble.
fn pack(l: &[u8], q: &mut [u8]) {
    for j in 0..16 {
        q[j] = l[j] | (l[j + 16] << 4);
    }
}

/// Quantizes one IQ4_NL block.
pub(super) fn quantize_nl(x: &[f32], b: &mut [u8]) {
    let mut l = [0u8; 32];
    let d = group_scale(x, &mut l);
    put_f16(b, 0, d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (l, &v) in l.iter_mut().zip(x) {
        *l = best_index(&IQ4_VALUES, id * v) as u8;
    }
    pack(&l, &mut b[2..18]);
}

/// Dequantizes one IQ4_NL block.
pub(super) fn dequantize_nl(b: &[u8], y: &mut [f32]) {
    let d = get_f16(b, 0);
    for j in 0..16 {
        y[j] = d * f32::from(IQ4_VALUES[(b[2 + j] & 15) as usize]);
        y[j + 16] = d * f32::from(IQ4_VALUES[(b[2 + j] >> 4) as usize]);
    }
}

/// Quantizes one IQ4_XS block.
pub(super) fn quantize_xs(x: &[f32], b: &mut [u8]) {
    let mut l = [0u8; 256];
    let mut scales = [0f32; 8];
    let (mut amax, mut max) = (0f32, 0f32);
    for (ib, s) in scales.iter_mut().enumerate() {
        *s = group_scale(&x[32 * ib..32 * ib + 32], &mut l[32 * ib..32 * ib + 32]);
        if s.abs() > amax {
            amax = s.abs();
            max = *s;
        }
    }
    let d = -max / 32.0;
    put_f16(b, 0, d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let (mut sh, mut sl) = (0u16, [0u8; 4]);
    for (ib, &s) in scales.iter().enumerate() {
        let ls = nearest_int(id * s).clamp(-32, 31);
        let dl = d * ls as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        for j in 32 * ib..32 * ib + 32 {
            l[j] = best_index(&IQ4_VALUES, idl * x[j]) as u8;
        }
        let u = (ls + 32) as u8;
        sl[ib / 2] |= (u & 15) << (4 * (ib % 2));
        sh |= u16::from(u >> 4) << (2 * ib);
    }
    b[2..4].copy_from_slice(&sh.to_le_bytes());
    b[4..8].copy_from_slice(&sl);
    for i in 0..8 {
        pack(&l[32 * i..32 * i + 32], &mut b[8 + 16 * i..24 + 16 * i]);
    }
}

/// The 6-bit scale of sub-block `ib` of an IQ4_XS block, less 32.
#[inline(always)]
pub(super) fn xs_scale(b: &[u8], ib: usize) -> i32 {
    let sh = u16::from_le_bytes([b[2], b[3]]);
    let lo = (b[4 + ib / 2] >> (4 * (ib % 2))) & 15;
    let hi = (sh >> (2 * ib)) & 3;
    i32::from(lo) | (i32::from(hi) << 4)
}

/// Dequantizes one IQ4_XS block.
pub(super) fn dequantize_xs(b: &[u8], y: &mut [f32]) {
    let d = get_f16(b, 0);
    for ib in 0..8 {
        let dl = d * (xs_scale(b, ib) - 32) as f32;
        let q = &b[8 + 16 * ib..24 + 16 * ib];
        let y = &mut y[32 * ib..32 * ib + 32];
        for j in 0..16 {
            y[j] = dl * f32::from(IQ4_VALUES[(q[j] & 15) as usize]);
            y[j + 16] = dl * f32::from(IQ4_VALUES[(q[j] >> 4) as usize]);
        }
    }
}
