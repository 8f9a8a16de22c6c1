//! IQ2_XXS, IQ2_XS and IQ2_S (256 values): groups of 8 magnitudes from a lattice grid
//! ([`super::iq_grids`]), each with 8 sign bits, scaled per 32 (IQ2_XXS) or 16 values.
//!
//! IQ2_XXS (66 bytes): f16 `d`, then 8 x 8 bytes, one per 32 values: 4 grid indices (one byte
//! each, 256-entry grid), then a u32 whose bits `7l..7l+7` pick group `l`'s signs (seven sign
//! bits, the eighth making the count of minus signs even: [`signs`]) and whose top 4 bits `s`
//! give the scale `d * (0.5 + s) / 4`.
//! IQ2_XS (74 bytes): f16 `d`, 32 x u16 (9-bit grid index of a 512-entry grid, 7 sign bits as
//! above), then 8 bytes of two 4-bit scales per 32 values (low nibble for the first 16 values),
//! each `d * (0.5 + s) / 4`.
//! IQ2_S (82 bytes): f16 `d`, 32 bytes of grid index low bits, 32 bytes of signs (one byte per
//! group, all eight bits), 8 bytes `qh` (bits `2l..2l+2` of byte `i` are the top two bits of
//! group `l` of sub-block `i`'s 10-bit index), then 8 bytes of scales as in IQ2_XS.

use super::get_f16;
use super::iq_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID};

/// The eight signs of a group from seven bits: bit 7 is set when bits 0..7 hold an odd count.
#[inline(always)]
pub(super) fn signs(b7: u32) -> u8 {
    let b = (b7 & 127) as u8;
    b | (((b.count_ones() & 1) as u8) << 7)
}

/// Writes the 8 values of grid entry `g` with sign byte `s`, times `db`.
#[inline(always)]
pub(super) fn put_group(y: &mut [f32], db: f32, g: u64, s: u8) {
    for (j, y) in y.iter_mut().enumerate().take(8) {
        let v = db * f32::from((g >> (8 * j)) as u8);
        // Negation is the sign bit flipped; done without a branch, as random signs defeat
        // branch prediction.
        let sign = u32::from((s >> j) & 1) << 31;
        *y = f32::from_bits(v.to_bits() ^ sign);
    }
}

/// Dequantizes one IQ2_XXS block.
pub(super) fn dequantize_xxs(b: &[u8], y: &mut [f32]) {
    let d = get_f16(b, 0);
    for ib in 0..8 {
        let q = &b[2 + 8 * ib..10 + 8 * ib];
        let aux = u32::from_le_bytes([q[4], q[5], q[6], q[7]]);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
        for l in 0..4 {
            let s = signs(aux >> (7 * l));
            put_group(&mut y[32 * ib + 8 * l..], db, IQ2XXS_GRID[q[l] as usize], s);
        }
    }
}

/// The two scales (first and second 16 values) of sub-block `ib` of an IQ2_XS / IQ2_S block,
/// whose scale bytes start at `at`.
#[inline(always)]
fn scales16(b: &[u8], at: usize, ib: usize, d: f32) -> [f32; 2] {
    let s = b[at + ib];
    [
        d * (0.5 + (s & 15) as f32) * 0.25,
        d * (0.5 + (s >> 4) as f32) * 0.25,
    ]
}

/// Dequantizes one IQ2_XS block.
pub(super) fn dequantize_xs(b: &[u8], y: &mut [f32]) {
    let d = get_f16(b, 0);
    for ib in 0..8 {
        let db = scales16(b, 66, ib, d);
        for l in 0..4 {
            let at = 2 + 2 * (4 * ib + l);
            let q = u16::from_le_bytes([b[at], b[at + 1]]);
            let g = IQ2XS_GRID[(q & 511) as usize];
            put_group(
                &mut y[32 * ib + 8 * l..],
                db[l / 2],
                g,
                signs(u32::from(q >> 9)),
            );
        }
    }
}

/// Dequantizes one IQ2_S block.
pub(super) fn dequantize_s(b: &[u8], y: &mut [f32]) {
    let d = get_f16(b, 0);
    for ib in 0..8 {
        let db = scales16(b, 74, ib, d);
        let qh = usize::from(b[66 + ib]);
        for l in 0..4 {
            let idx = usize::from(b[2 + 4 * ib + l]) | ((qh << (8 - 2 * l)) & 0x300);
            let s = b[34 + 4 * ib + l];
            put_group(&mut y[32 * ib + 8 * l..], db[l / 2], IQ2S_GRID[idx], s);
        }
    }
}
