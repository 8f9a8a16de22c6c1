//! The lattice grids of the i-quants (core's [`tessera_core::quant::iq_grids`]) as the one
//! read-only buffer the shaders that read those types bind (`grids` in
//! `shaders/dequant.wgsl`, at [`crate::context::GRID_BINDING`]).
//!
//! The grids are facts of the formats: a block stores indices into them. They are laid out
//! one after the other as little-endian words, each grid from the word offset `dequant.wgsl`
//! names for it ([`OFFSETS`]): the 8-byte entries of IQ1_S / IQ1_M, IQ2_XXS, IQ2_XS and IQ2_S as
//! two words each (values 0..3 in the first), then the 4-byte entries of IQ3_XXS and IQ3_S.

use tessera_core::quant::iq_grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID,
};

/// The word offset of each grid in the buffer, by the name of its constant in
/// `shaders/dequant.wgsl`.
pub(crate) const OFFSETS: [(&str, usize); 6] = [
    ("GRID_IQ1S", 0),
    ("GRID_IQ2XXS", 2 * 2048),
    ("GRID_IQ2XS", 2 * (2048 + 256)),
    ("GRID_IQ2S", 2 * (2048 + 256 + 512)),
    ("GRID_IQ3XXS", 2 * (2048 + 256 + 512 + 1024)),
    ("GRID_IQ3S", 2 * (2048 + 256 + 512 + 1024) + 256),
];

/// The buffer's words.
pub(crate) fn words() -> Vec<u32> {
    let mut w = Vec::with_capacity(OFFSETS[5].1 + IQ3S_GRID.len());
    for grid in [&IQ1S_GRID[..], &IQ2XXS_GRID, &IQ2XS_GRID, &IQ2S_GRID] {
        for &e in grid {
            w.push(e as u32);
            w.push((e >> 32) as u32);
        }
    }
    w.extend_from_slice(&IQ3XXS_GRID);
    w.extend_from_slice(&IQ3S_GRID);
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The offsets match the grids' sizes and the shader's constants.
    #[test]
    fn offsets_match_the_shader() {
        let w = words();
        assert_eq!(w.len(), OFFSETS[5].1 + IQ3S_GRID.len());
        assert_eq!(w[OFFSETS[4].1], IQ3XXS_GRID[0]);
        assert_eq!(w[OFFSETS[3].1 + 3], (IQ2S_GRID[1] >> 32) as u32);
        let src = include_str!("../../shaders/dequant.wgsl");
        for (name, off) in OFFSETS {
            let line = format!("const {name}: u32 = {off}u;");
            assert!(src.contains(&line), "dequant.wgsl lacks `{line}`");
        }
    }
}
