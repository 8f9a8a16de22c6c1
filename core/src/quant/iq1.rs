//! IQ1_S and IQ1_M (256 values): groups of 8 values in {-1, 0, 1} from a 2048-entry grid
//! ([`super::iq_grids::IQ1S_GRID`]), shifted by a delta of +-1/8 and scaled.
//!
//! IQ1_S (50 bytes): f16 `d`, 32 bytes of index low bits, then 8 x u16 `qh`, one per 32 values:
//! bits `3l..3l+3` are the top bits of group `l`'s 11-bit index, bits 12..15 the scale
//! `s` (`d * (2s + 1)`), bit 15 the sign of the delta (set: -1/8). Value = `scale * (g + delta)`.
//! IQ1_M (56 bytes): 32 bytes of index low bits, 16 bytes `qh` (one per 16 values: bits 0..3 and
//! 4..7 the top bits of its two groups' indices, bits 3 and 7 their delta signs), then 8 bytes
//! as 4 x u16 of 3-bit scales (four per u16, one per 16 values: `d * (2s + 1)`) whose top
//! nibbles together are the f16 `d` (u16 `k`'s top nibble is bits `4k..4k+4` of `d`).

use half::f16;

use super::iq_grids::IQ1S_GRID;

/// The magnitude of the delta added to every grid value.
const DELTA: f32 = 0.125;

/// Writes the 8 values of grid entry `g` plus `delta`, times `dl`.
#[inline(always)]
fn put_group(y: &mut [f32], dl: f32, g: u64, delta: f32) {
    for (j, y) in y.iter_mut().enumerate().take(8) {
        *y = dl * (f32::from((g >> (8 * j)) as u8 as i8) + delta);
    }
}

/// Dequantizes one IQ1_S block.
pub(super) fn dequantize_s(b: &[u8], y: &mut [f32]) {
    let d = super::get_f16(b, 0);
    for ib in 0..8 {
        let qh = u16::from_le_bytes([b[34 + 2 * ib], b[35 + 2 * ib]]);
        let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
        let delta = if qh & 0x8000 != 0 { -DELTA } else { DELTA };
        for l in 0..4 {
            let idx = usize::from(b[2 + 4 * ib + l]) | (usize::from((qh >> (3 * l)) & 7) << 8);
            put_group(&mut y[32 * ib + 8 * l..], dl, IQ1S_GRID[idx], delta);
        }
    }
}

/// Dequantizes one IQ1_M block.
pub(super) fn dequantize_m(b: &[u8], y: &mut [f32]) {
    let sc: [u16; 4] = std::array::from_fn(|k| u16::from_le_bytes([b[48 + 2 * k], b[49 + 2 * k]]));
    let bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
    let d = f16::from_bits(bits).to_f32();
    for ib in 0..8 {
        let s = sc[ib / 2] >> (6 * (ib % 2));
        let dl = [
            d * (2 * (s & 7) + 1) as f32,
            d * (2 * ((s >> 3) & 7) + 1) as f32,
        ];
        let qh = [usize::from(b[32 + 2 * ib]), usize::from(b[33 + 2 * ib])];
        for l in 0..4 {
            let h = qh[l / 2] >> (4 * (l % 2));
            let idx = usize::from(b[4 * ib + l]) | ((h & 7) << 8);
            let delta = if h & 8 != 0 { -DELTA } else { DELTA };
            put_group(&mut y[32 * ib + 8 * l..], dl[l / 2], IQ1S_GRID[idx], delta);
        }
    }
}
