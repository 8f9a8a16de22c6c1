//! soft_max (no mask, f32 or f16 mask, broadcast masks, scale, ALiBi, rows past 64k) and
//! diag_mask_inf.

use tessera_core::DType;

use super::ne_str;
use crate::case::{Case, Tolerance};
use crate::init::Init;

/// One soft_max case's parameters.
#[derive(Clone, Copy)]
pub(super) struct SoftMax {
    pub ne: [usize; 4],
    /// The mask's type, if there is one.
    pub mask: Option<DType>,
    /// Whether the mask has one matrix for every batch (dims 2-3 of 1, broadcast).
    pub mask_broadcast: bool,
    pub scale: f32,
    pub max_bias: f32,
}

impl SoftMax {
    pub(super) fn case(self) -> Case {
        let SoftMax {
            ne,
            mask,
            mask_broadcast,
            scale,
            max_bias,
        } = self;
        let m = mask.map_or("none", |t| t.name());
        let params = format!(
            "type=f32,ne={},mask={m},mask_bcast={},scale={scale},max_bias={max_bias}",
            ne_str(&ne),
            mask_broadcast as u8
        );
        let mut types = vec![DType::F32];
        types.extend(mask);
        Case::new("SOFT_MAX", params, &types, Tolerance::SOFT_MAX, move |g| {
            let a = g.input(DType::F32, &ne, Init::Uniform(-3.0, 3.0))?;
            let mk = match mask {
                Some(t) => {
                    // The mask has more rows than the input (as padded KQ masks do).
                    let (m2, m3) = if mask_broadcast {
                        (1, 1)
                    } else {
                        (ne[2], ne[3])
                    };
                    Some(g.input(t, &[ne[0], ne[1] + 2, m2, m3], Init::Mask(0.2))?)
                }
                None => None,
            };
            g.soft_max_ext(a, mk, scale, max_bias)
        })
    }
}

/// Every soft_max and diag_mask_inf case.
pub(super) fn cases(v: &mut Vec<Case>) {
    let shapes = [[16, 2, 3, 1], [64, 7, 4, 2], [1024, 4, 1, 1], [33, 5, 8, 1]];
    for ne in shapes {
        for mask in [None, Some(DType::F32), Some(DType::F16)] {
            for scale in [1.0, 0.1] {
                let mask_broadcast = mask == Some(DType::F16);
                v.push(
                    SoftMax {
                        ne,
                        mask,
                        mask_broadcast,
                        scale,
                        max_bias: 0.0,
                    }
                    .case(),
                );
            }
            if mask.is_some() {
                v.push(
                    SoftMax {
                        ne,
                        mask,
                        mask_broadcast: true,
                        scale: 0.5,
                        max_bias: 8.0,
                    }
                    .case(),
                );
            }
        }
    }
    for mask in [None, Some(DType::F16)] {
        v.push(
            SoftMax {
                ne: [70000, 2, 1, 1],
                mask,
                mask_broadcast: true,
                scale: 1.0,
                max_bias: 0.0,
            }
            .case()
            .large(),
        );
    }
    for (ne, n_past) in [
        ([10, 10, 1, 1], 0),
        ([10, 10, 1, 1], 5),
        ([16, 8, 3, 2], 0),
        ([16, 8, 3, 2], 3),
    ] {
        let params = format!("type=f32,ne={},n_past={n_past}", ne_str(&ne));
        v.push(Case::new(
            "DIAG_MASK_INF",
            params,
            &[DType::F32],
            Tolerance::DEFAULT,
            move |g| {
                let a = g.leaf(DType::F32, &ne)?;
                g.diag_mask_inf(a, n_past)
            },
        ));
    }
}
