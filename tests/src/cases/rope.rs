//! rope: normal and neox, full and partial n_dims, freq_scale 1 and 0.5, f32 and f16, small and
//! large positions; then rope_ext's additions: per-pair frequency factors (Llama 3's
//! `rope_freqs`, LongRoPE's), YaRN's blend of interpolated and extrapolated angles with its
//! magnitude correction, and a plain factor on the result (LongRoPE's attention factor).

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
    /// Frequency factors (a third source, uniform in [1, 8) as Llama 3's lie).
    pub factors: bool,
    /// YaRN's blend (0: none); with it the original context is 4096 and beta 32 / 1.
    pub ext_factor: f32,
    /// The factor on cos and sin.
    pub attn_factor: f32,
}

impl Rope {
    /// The plain rotation (no factors, no YaRN, magnitude 1).
    pub(super) fn plain(
        dtype: DType,
        ne: [usize; 4],
        n_dims: usize,
        mode: RopeMode,
        freq_scale: f32,
        pos_max: usize,
    ) -> Rope {
        Rope {
            dtype,
            ne,
            n_dims,
            mode,
            freq_scale,
            pos_max,
            factors: false,
            ext_factor: 0.0,
            attn_factor: 1.0,
        }
    }

    pub(super) fn case(self) -> Case {
        let Rope {
            dtype,
            ne,
            n_dims,
            mode,
            freq_scale,
            pos_max,
            factors,
            ext_factor,
            attn_factor,
        } = self;
        let m = match mode {
            RopeMode::Normal => 0,
            RopeMode::Neox => 2,
        };
        let mut params = format!(
            "type={dtype},ne={},n_dims={n_dims},mode={m},freq_scale={freq_scale},pos_max={pos_max}",
            ne_str(&ne)
        );
        // The plain cases keep their names; the additions name themselves.
        if factors {
            params.push_str(",factors");
        }
        if ext_factor != 0.0 {
            params.push_str(&format!(",ext_factor={ext_factor}"));
        }
        if attn_factor != 1.0 {
            params.push_str(&format!(",attn_factor={attn_factor}"));
        }
        // An f32 angle pos * theta carries an error of about pos * 2^-24 radians, which every
        // implementation has; at large positions the threshold allows for it (a wrong
        // position or frequency still gives an error of order one).
        let tol = if pos_max > 1024 {
            Tolerance::Nmse(1e-5)
        } else {
            Tolerance::DEFAULT
        };
        let mut p = RopeParams::new(n_dims, mode, 10000.0, freq_scale);
        p.ext_factor = ext_factor;
        p.attn_factor = attn_factor;
        if ext_factor != 0.0 {
            p.n_ctx_orig = 4096;
            p.beta_fast = 32.0;
            p.beta_slow = 1.0;
        }
        Case::new("ROPE", params, &[dtype], tol, move |g| {
            let a = g.leaf(dtype, &ne)?;
            let pos = g.input(DType::I32, &[ne[2]], Init::Indices(pos_max))?;
            let f = if factors {
                Some(g.input(DType::F32, &[n_dims / 2], Init::Uniform(1.0, 8.0))?)
            } else {
                None
            };
            g.rope_ext(a, pos, f, p)
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
                            Rope::plain(dtype, [64, 8, 7, 1], n_dims, mode, freq_scale, pos_max)
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
                v.push(Rope::plain(dtype, ne, n_dims, mode, 1.0, 4096).case());
            }
            ext_cases(v, dtype, mode);
        }
    }
}

/// rope_ext's additions, alone and together, over full and partial rotations.
fn ext_cases(v: &mut Vec<Case>, dtype: DType, mode: RopeMode) {
    // (factors, freq_scale, ext_factor, attn_factor): Llama 3 (factors), LongRoPE (factors and
    // a magnitude), a magnitude alone, YaRN (quarter scale, with and without a magnitude),
    // and YaRN over factors.
    let kinds = [
        (true, 1.0, 0.0, 1.0),
        (true, 1.0, 0.0, 1.19),
        (false, 1.0, 0.0, 0.75),
        (false, 0.25, 1.0, 1.0),
        (false, 0.25, 1.0, 0.9),
        (true, 0.25, 1.0, 1.0),
    ];
    for (factors, freq_scale, ext_factor, attn_factor) in kinds {
        for (ne, n_dims, pos_max) in [
            ([128, 4, 5, 1], 128, 8192),
            ([96, 3, 4, 1], 64, 512),
            ([64, 8, 7, 1], 32, 100_000),
        ] {
            v.push(
                Rope {
                    factors,
                    ext_factor,
                    attn_factor,
                    ..Rope::plain(dtype, ne, n_dims, mode, freq_scale, pos_max)
                }
                .case(),
            );
        }
    }
}
