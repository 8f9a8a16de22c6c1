//! get_rows and set_rows (`rows.wgsl`).

use tessera_core::DType;

use super::{desc, ew, readable_quant, Node, Params, PlanOut, FLOATS};
use crate::keys::{Key, RowsKey, RowsKind};

/// The rows key.
fn key(op: RowsKind, src: DType, idx: DType, dst: DType) -> Key {
    Key::Rows(RowsKey { op, src, idx, dst })
}

/// get_rows: rows of src0 at the indices of src1.
pub(super) fn get_rows(n: &Node, p: Params) -> Result<Vec<PlanOut>, String> {
    let t = n.t;
    let a = n.srcs[0].dtype;
    let k = if FLOATS.contains(&a) || readable_quant(a) {
        key(RowsKind::Get, a, DType::I32, DType::F32)
    } else if a == DType::I32 {
        key(RowsKind::GetRaw, a, DType::I32, DType::I32)
    } else {
        return Err(format!("type {a}"));
    };
    // idx is [m, d2, d3]: its ne/nb move into slots 0..3 of src1's desc as is.
    Ok(ew(k, vec![n.id, t.src[0], t.src[1]], p, t.nelements()))
}

/// set_rows: the f32 rows of src1 into src0 (this node's memory) at the indices of src2.
pub(super) fn set_rows(n: &Node, mut p: Params) -> Result<Vec<PlanOut>, String> {
    let t = n.t;
    let (d, idx) = (t.dtype, n.srcs[2].dtype);
    if !FLOATS.contains(&d) && !DType::QUANTIZED.contains(&d) {
        return Err(format!("destination type {d}"));
    }
    // Slots: dst = a (this node's memory), src0 = the f32 rows, src1 = indices.
    p.desc[1] = desc(n.srcs[1]);
    p.desc[2] = desc(n.srcs[2]);
    let (op, count) = if d.is_quantized() {
        (
            RowsKind::SetQuantized,
            n.srcs[1].nelements() / d.block_size(),
        )
    } else {
        (RowsKind::Set, n.srcs[1].nelements())
    };
    let k = key(op, DType::F32, idx, d);
    Ok(ew(k, vec![n.id, t.src[1], t.src[2]], p, count))
}

/// Every rows key the plans can ask for.
#[cfg(test)]
pub(super) fn variants() -> Vec<Key> {
    let mut v = Vec::new();
    for &a in FLOATS
        .iter()
        .chain(&DType::QUANTIZED)
        .chain(&super::READ_ONLY_QUANTS)
    {
        v.push(key(RowsKind::Get, a, DType::I32, DType::F32));
    }
    v.push(key(RowsKind::GetRaw, DType::I32, DType::I32, DType::I32));
    for idx in [DType::I32, DType::I64] {
        for &d in &FLOATS {
            v.push(key(RowsKind::Set, DType::F32, idx, d));
        }
        for &d in &DType::QUANTIZED {
            v.push(key(RowsKind::SetQuantized, DType::F32, idx, d));
        }
    }
    v
}
