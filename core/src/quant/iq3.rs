//! IQ3_XXS and IQ3_S (256 values): groups of 4 magnitudes from a lattice grid
//! ([`super::iq_grids`]), with sign bits, scaled per 32 values.
//!
//! IQ3_XXS (98 bytes): f16 `d`, 64 bytes of grid indices (one per 4 values, 256-entry grid),
//! then 8 x u32, one per 32 values: bits `7l..7l+7` are the seven sign bits of the 8 values
//! `8l..8l+8` (the eighth from parity, as IQ2_XXS), the top 4 bits `s` the scale
//! `d * (0.5 + s) / 2`.
//! IQ3_S (110 bytes): f16 `d`, 64 bytes of index low bits, 8 bytes `qh` (bit `k` of byte `i` is
//! bit 8 of index `k` of sub-block `i`, a 512-entry grid), 32 bytes of signs (one byte per 8
//! values, all eight bits), then 4 bytes of two 4-bit scales per 64 values (low nibble for the
//! first 32): `d * (1 + 2s)`.

use super::get_f16;
use super::iq2::signs;
use super::iq_grids::{IQ3S_GRID, IQ3XXS_GRID};

/// Writes the 8 values of grid entries `g1`, `g2` (4 each) with sign byte `s`, times `db`.
#[inline(always)]
fn put_pair(y: &mut [f32], db: f32, g1: u32, g2: u32, s: u8) {
    let g = u64::from(g1) | (u64::from(g2) << 32);
    super::iq2::put_group(y, db, g, s);
}

/// Dequantizes one IQ3_XXS block.
pub(super) fn dequantize_xxs(b: &[u8], y: &mut [f32]) {
    let d = get_f16(b, 0);
    for ib in 0..8 {
        let q = &b[2 + 8 * ib..10 + 8 * ib];
        let at = 66 + 4 * ib;
        let aux = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for l in 0..4 {
            let (g1, g2) = (
                IQ3XXS_GRID[q[2 * l] as usize],
                IQ3XXS_GRID[q[2 * l + 1] as usize],
            );
            put_pair(&mut y[32 * ib + 8 * l..], db, g1, g2, signs(aux >> (7 * l)));
        }
    }
}

/// Dequantizes one IQ3_S block.
pub(super) fn dequantize_s(b: &[u8], y: &mut [f32]) {
    let d = get_f16(b, 0);
    for ib in 0..8 {
        let sc = b[106 + ib / 2] >> (4 * (ib % 2)) & 15;
        let db = d * (1 + 2 * i32::from(sc)) as f32;
        let qh = usize::from(b[66 + ib]);
        let q = &b[2 + 8 * ib..10 + 8 * ib];
        for l in 0..4 {
            let i1 = usize::from(q[2 * l]) | ((qh << (8 - 2 * l)) & 256);
            let i2 = usize::from(q[2 * l + 1]) | ((qh << (7 - 2 * l)) & 256);
            let s = b[74 + 4 * ib + l];
            put_pair(
                &mut y[32 * ib + 8 * l..],
                db,
                IQ3S_GRID[i1],
                IQ3S_GRID[i2],
                s,
            );
        }
    }
}
