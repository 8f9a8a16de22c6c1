//! concat (each dim, contiguous and permuted), repeat, pad and arange.

use tessera_core::DType;

use super::{ne_str, permuted};
use crate::case::{Case, Tolerance};
use crate::init::Init;

/// Every concat, repeat, pad and arange case.
pub(super) fn cases(v: &mut Vec<Case>) {
    for t in [DType::F32, DType::F16, DType::I32] {
        for dim in 0..4 {
            let perms: &[[usize; 4]] = if t == DType::I32 {
                &[[0, 1, 2, 3]]
            } else {
                &[[0, 1, 2, 3], [0, 2, 1, 3]]
            };
            for &per in perms {
                let ne_a = [10, 5, 4, 3];
                let mut ne_b = ne_a;
                ne_b[dim] = 3;
                let params = format!(
                    "type={t},ne_a={},ne_b={},dim={dim},per_b={}",
                    ne_str(&ne_a),
                    ne_str(&ne_b),
                    ne_str(&per)
                );
                let init = if t == DType::I32 {
                    Init::Uniform(-1000.0, 1000.0)
                } else {
                    Init::Uniform(-1.0, 1.0)
                };
                v.push(Case::new(
                    "CONCAT",
                    params,
                    &[t],
                    Tolerance::Exact,
                    move |g| {
                        let a = g.input(t, &ne_a, init)?;
                        let b = permuted(g, t, ne_b, per, init)?;
                        g.concat(a, b, dim)
                    },
                ));
            }
        }
    }
    for t in [DType::F32, DType::F16] {
        for nr in [
            [2, 1, 1, 1],
            [1, 2, 1, 1],
            [1, 1, 2, 1],
            [1, 1, 1, 2],
            [2, 2, 2, 2],
        ] {
            let ne = [10, 5, 4, 3];
            let params = format!("type={t},ne={},nr={}", ne_str(&ne), ne_str(&nr));
            v.push(Case::new(
                "REPEAT",
                params,
                &[t],
                Tolerance::Exact,
                move |g| {
                    let a = g.leaf(t, &ne)?;
                    g.repeat(
                        a,
                        &[ne[0] * nr[0], ne[1] * nr[1], ne[2] * nr[2], ne[3] * nr[3]],
                    )
                },
            ));
        }
    }
    for p in [[1, 0, 0, 0], [0, 2, 0, 0], [3, 2, 1, 1], [0, 0, 0, 2]] {
        let ne = [10, 5, 4, 3];
        v.push(Case::new(
            "PAD",
            format!("type=f32,ne={},pad={}", ne_str(&ne), ne_str(&p)),
            &[DType::F32],
            Tolerance::Exact,
            move |g| {
                let a = g.leaf(DType::F32, &ne)?;
                g.pad(a, p)
            },
        ));
    }
    for (start, stop, step) in [
        (0.0f32, 10.0f32, 1.0f32),
        (-3.5, 20.0, 0.75),
        (5.0, -5.0, -0.5),
    ] {
        let params = format!("type=f32,start={start},stop={stop},step={step}");
        v.push(Case::new(
            "ARANGE",
            params,
            &[DType::F32],
            Tolerance::DEFAULT,
            move |g| g.arange(start, stop, step),
        ));
    }
}
