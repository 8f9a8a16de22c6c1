//! rms_norm and norm: several eps, row lengths from 33 to past 64k, permuted input.

use tessera_core::{DType, TensorId};

use super::{ne_str, permuted};
use crate::case::{Case, CaseGraph, Tolerance};
use crate::init::Init;

type NormFn = fn(&mut CaseGraph, TensorId, f32) -> tessera_core::Result<TensorId>;

/// Every rms_norm and norm case.
pub(super) fn cases(v: &mut Vec<Case>) {
    let ops: [(&'static str, NormFn); 2] = [
        ("RMS_NORM", |g, a, eps| g.rms_norm(a, eps)),
        ("NORM", |g, a, eps| g.norm(a, eps)),
    ];
    for (name, f) in ops {
        for eps in [1e-6f32, 1e-5] {
            // 4,100: a row longer than a workgroup's 256 invocations x 16.
            for ne in [
                [64, 5, 4, 3],
                [4096, 3, 1, 1],
                [4100, 2, 1, 1],
                [33, 7, 1, 1],
            ] {
                v.push(norm_case(name, f, ne, [0, 1, 2, 3], eps));
            }
            v.push(norm_case(name, f, [64, 5, 4, 3], [0, 2, 1, 3], eps));
        }
        v.push(norm_case(name, f, [70000, 2, 1, 1], [0, 1, 2, 3], 1e-6).large());
    }
}

fn norm_case(name: &'static str, f: NormFn, ne: [usize; 4], per: [usize; 4], eps: f32) -> Case {
    let params = format!(
        "type=f32,ne={},per={},eps={eps:e}",
        ne_str(&ne),
        ne_str(&per)
    );
    Case::new(name, params, &[DType::F32], Tolerance::DEFAULT, move |g| {
        let a = permuted(g, DType::F32, ne, per, Init::Uniform(-1.0, 1.0))?;
        f(g, a, eps)
    })
}
