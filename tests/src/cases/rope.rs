//! rope: normal and neox, full and partial n_dims, freq_scale 1 and 0.5, f32 and f16, small and
//! large positions.

use tessera_core::{DType, RopeMode, RopeParams};

use super::ne_str;
use crate::case::{Case, Tolerance};
use crate::init::Init;

/// One rope case's parameters.
#[derive(Clone, Copy)]
pub(super) struct Rope {
    pub dtype: DType,
    /// [head_dim, heads, tokens, 1]
    pub ne: [usize; 4],
    pub n_dims: usize,
    pub mode: RopeMode,
    pub freq_scale: f32,
    /// Positions are drawn from 0..pos_max.
    pub pos_max: usize,
}

impl Rope {
    pub(super) fn case(self) -> Case {
        let Rope {
            dtype,
            ne,
            n_dims,
            mode,
            freq_scale,
            pos_max,
        } = self;
        let m = match mode {
            RopeMode::Normal => 0,
            RopeMode::Neox => 2,
        };
        let params = format!(
            "type={dtype},ne={},n_dims={n_dims},mode={m},freq_scale={freq_scale},pos_max={pos_max}",
            ne_str(&ne)
        );
        // An f32 angle pos * theta carries an error of about pos * 2^-24 radians, which every
        // implementation has; at large positions the threshold allows for it (a wrong
        // position or frequency still gives an error of order one).
        let tol = if pos_max > 1024 {
            Tolerance::Nmse(1e-5)
        } else {
            Tolerance::DEFAULT
        };
        let p = RopeParams::new(n_dims, mode, 10000.0, freq_scale);
        Case::new("ROPE", params, &[dtype], tol, move |g| {
            let a = g.leaf(dtype, &ne)?;
            let pos = g.input(DType::I32, &[ne[2]], Init::Indices(pos_max))?;
            g.rope(a, pos, p)
        })
    }
}

/// Every rope case.
pub(super) fn cases(v: &mut Vec<Case>) {
    for dtype in [DType::F32, DType::F16] {
        for mode in [RopeMode::Normal, RopeMode::Neox] {
            for n_dims in [64, 32] {
                for freq_scale in [1.0, 0.5] {
                    for pos_max in [512, 100_000] {
                        v.push(
                            Rope {
                                dtype,
                                ne: [64, 8, 7, 1],
                                n_dims,
                                mode,
                                freq_scale,
                                pos_max,
                            }
                            .case(),
                        );
                    }
                }
            }
            for (ne, n_dims) in [
                ([128, 4, 3, 1], 128),
                ([128, 4, 3, 1], 64),
                ([80, 6, 5, 1], 80),
                ([80, 6, 5, 1], 20),
            ] {
                v.push(
                    Rope {
                        dtype,
                        ne,
                        n_dims,
                        mode,
                        freq_scale: 1.0,
                        pos_max: 4096,
                    }
                    .case(),
                );
            }
        }
    }
}
