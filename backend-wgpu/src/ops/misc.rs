//! Reductions (`reduce.wgsl`: sums, means, argmax) and shape ops (`shape.wgsl`: concat,
//! repeat, pad, diag_mask_inf, arange).

use tessera_core::{DType, Op};

use super::{ew, per_row, Node, Params, PlanOut, FLOATS};
use crate::keys::{Key, ReduceKey, ReduceKind, ShapeKey, ShapeKind};

/// sum_rows, mean and argmax (one workgroup per row), and sum (one workgroup).
pub(super) fn reduce(n: &Node, mut p: Params) -> Result<Vec<PlanOut>, String> {
    let t = n.t;
    let a = n.srcs[0].dtype;
    if !FLOATS.contains(&a) {
        return Err(format!("type {a}"));
    }
    let op = match t.op {
        Op::SumRows => ReduceKind::SumRows,
        Op::Mean => ReduceKind::Mean,
        Op::Argmax => ReduceKind::Argmax,
        _ => ReduceKind::Sum,
    };
    let rows_n = if op == ReduceKind::Sum {
        1
    } else {
        n.srcs[0].nrows()
    };
    p.u[0] = rows_n as u32;
    let key = Key::Reduce(ReduceKey {
        op,
        src: a,
        dst: t.dtype,
    });
    Ok(per_row(key, vec![n.id, t.src[0]], p, rows_n))
}

/// The shape key.
fn shape_key(op: ShapeKind, t: DType, dst: DType) -> Key {
    Key::Shape(ShapeKey { op, t, dst })
}

/// concat, repeat, pad, diag_mask_inf and arange.
pub(super) fn shape(n: &Node, mut p: Params) -> Result<Vec<PlanOut>, String> {
    let t = n.t;
    let count = t.nelements();
    match t.op {
        Op::Concat(axis) => {
            let a = n.srcs[0].dtype;
            if !FLOATS.contains(&a) && a != DType::I32 {
                return Err(format!("type {a}"));
            }
            p.u[1] = axis as u32;
            let key = shape_key(ShapeKind::Concat, a, a);
            Ok(ew(key, vec![n.id, t.src[0], t.src[1]], p, count))
        }
        Op::Arange { start, step, .. } => {
            p.f[0] = start;
            p.f[1] = step;
            let key = shape_key(ShapeKind::Arange, DType::F32, DType::F32);
            Ok(ew(key, vec![n.id, n.id, n.id], p, count))
        }
        _ => {
            let a = n.srcs[0].dtype;
            if !(FLOATS.contains(&a) || (a == DType::I32 && t.op == Op::Repeat)) {
                return Err(format!("type {a}"));
            }
            let op = match t.op {
                Op::Repeat => ShapeKind::Repeat,
                Op::Pad(_) => ShapeKind::Pad,
                _ => ShapeKind::DiagMaskInf,
            };
            if let Op::DiagMaskInf(n_past) = t.op {
                p.u[1] = n_past as u32;
            }
            let key = shape_key(op, a, t.dtype);
            Ok(ew(key, vec![n.id, t.src[0], n.id], p, count))
        }
    }
}

/// Every reduce key the plans can ask for.
#[cfg(test)]
pub(super) fn reduce_variants() -> Vec<Key> {
    let mut v = Vec::new();
    for &src in &FLOATS {
        for op in [ReduceKind::SumRows, ReduceKind::Mean, ReduceKind::Sum] {
            v.push(Key::Reduce(ReduceKey {
                op,
                src,
                dst: DType::F32,
            }));
        }
    }
    v.push(Key::Reduce(ReduceKey {
        op: ReduceKind::Argmax,
        src: DType::F32,
        dst: DType::I32,
    }));
    v
}

/// Every shape key the plans can ask for.
#[cfg(test)]
pub(super) fn shape_variants() -> Vec<Key> {
    let mut v = Vec::new();
    for &a in &FLOATS {
        for op in [
            ShapeKind::Concat,
            ShapeKind::Repeat,
            ShapeKind::Pad,
            ShapeKind::DiagMaskInf,
        ] {
            v.push(shape_key(op, a, a));
        }
    }
    v.push(shape_key(ShapeKind::Concat, DType::I32, DType::I32));
    v.push(shape_key(ShapeKind::Repeat, DType::I32, DType::I32));
    v.push(shape_key(ShapeKind::Arange, DType::F32, DType::F32));
    v
}
