//! The mixture-of-experts ops (`moe.wgsl`): mul_mat_id, add_id, argsort and top_k.

use tessera_core::{DType, Op};

use super::{ew, per_row, Node, Params, PlanOut, FLOATS};
use crate::keys::{Key, MoeKey, MoeKind};

/// Longest row argsort and top_k sort in one workgroup's memory (`SORT_MAX` in the shader).
const SORT_MAX: usize = 1024;

fn key(op: MoeKind, a: DType, b: DType) -> Key {
    Key::Moe(MoeKey { op, a, b })
}

/// mul_mat_id: one workgroup per result; `first` is the id of the first expert src0 holds.
pub(super) fn mul_mat_id(n: &Node, mut p: Params, first: usize) -> Result<Vec<PlanOut>, String> {
    let t = n.t;
    let (a, b) = (n.srcs[0].dtype, n.srcs[1].dtype);
    if !(FLOATS.contains(&a) || DType::QUANTIZED.contains(&a)) {
        return Err(format!("expert type {a}"));
    }
    if !matches!(b, DType::F32 | DType::F16) {
        return Err(format!("row type {b}"));
    }
    if a.is_quantized() && !n.srcs[0].rows_contiguous() {
        return Err("quantized expert rows must be contiguous".into());
    }
    p.u[0] = t.nelements() as u32;
    p.u[1] = u32::try_from(first).map_err(|_| "expert id too large".to_string())?;
    let k = key(MoeKind::MulMatId, a, b);
    Ok(per_row(
        k,
        vec![n.id, t.src[0], t.src[1], t.src[2]],
        p,
        t.nelements(),
    ))
}

/// add_id: one invocation per element.
pub(super) fn add_id(n: &Node, p: Params) -> Result<Vec<PlanOut>, String> {
    let t = n.t;
    let k = key(MoeKind::AddId, DType::F32, DType::F32);
    Ok(ew(
        k,
        vec![n.id, t.src[0], t.src[1], t.src[2]],
        p,
        t.nelements(),
    ))
}

/// argsort and top_k: one workgroup sorts each row.
pub(super) fn sort(n: &Node, mut p: Params) -> Result<Vec<PlanOut>, String> {
    let t = n.t;
    let s = n.srcs[0];
    if s.dtype != DType::F32 {
        return Err(format!("type {}", s.dtype));
    }
    if s.ne[0] > SORT_MAX {
        return Err(format!("rows of {} values (at most {SORT_MAX})", s.ne[0]));
    }
    let rows = s.nrows();
    p.u[0] = rows as u32;
    p.u[1] = u32::from(!matches!(t.op, Op::Argsort { descending: false }));
    p.u[2] = (s.ne[0].max(1) as u32).next_power_of_two();
    let k = key(MoeKind::Sort, DType::F32, DType::F32);
    Ok(per_row(k, vec![n.id, t.src[0], n.id, n.id], p, rows))
}

/// Every moe key the plans can ask for.
#[cfg(test)]
pub(super) fn variants() -> Vec<Key> {
    let mut v = Vec::new();
    for &a in FLOATS.iter().chain(&DType::QUANTIZED) {
        for b in [DType::F32, DType::F16] {
            v.push(key(MoeKind::MulMatId, a, b));
        }
    }
    v.push(key(MoeKind::AddId, DType::F32, DType::F32));
    v.push(key(MoeKind::Sort, DType::F32, DType::F32));
    v
}
