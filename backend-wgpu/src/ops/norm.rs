//! rms_norm and norm (`norm.wgsl`): one workgroup per row.

use tessera_core::Op;

use super::{per_row, Node, Params, PlanOut};
use crate::keys::{Key, NormKey};

/// rms_norm or norm of each row, with epsilon `eps`.
pub(super) fn norm(n: &Node, mut p: Params, eps: f32) -> Vec<PlanOut> {
    let t = n.t;
    p.f[0] = eps;
    p.u[0] = t.nrows() as u32;
    let key = Key::Norm(NormKey {
        layer: matches!(t.op, Op::Norm { .. }),
        mul: false,
        add: false,
    });
    per_row(key, vec![n.id, t.src[0]], p, t.nrows())
}

/// Every norm key the plans (and the fused rms_norm * w, MUL, and rms_norm * w + r, ADD) can
/// ask for.
#[cfg(test)]
pub(super) fn variants() -> Vec<Key> {
    [
        (false, false, false),
        (true, false, false),
        (false, true, false),
        (false, true, true),
    ]
    .map(|(layer, mul, add)| Key::Norm(NormKey { layer, mul, add }))
    .to_vec()
}
