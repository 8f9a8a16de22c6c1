//! The element-wise families: unary functions, scale, clamp and copies with conversion
//! (`unary.wgsl`), binary ops with broadcasting (`binary.wgsl`), gated linear units
//! (`glu.wgsl`).

use tessera_core::{BinaryOp, DType, GluOp, Op, UnaryOp};

use super::{ew, readable_quant, Node, Params, PlanOut, FLOATS};
use crate::keys::{BinaryKey, GluKey, Key, UnaryKey, UnaryKind};

/// The unary key of `op` from `src` to `dst`.
fn unary_key(op: UnaryKind, src: DType, dst: DType) -> Key {
    Key::Unary(UnaryKey { op, src, dst })
}

/// Unary functions, scale and clamp.
pub(super) fn unary(n: &Node, mut p: Params) -> Result<Vec<PlanOut>, String> {
    let t = n.t;
    let a = n.srcs[0].dtype;
    let op = match &t.op {
        Op::Scale { scale, bias } => {
            p.f[0] = *scale;
            p.f[1] = *bias;
            UnaryKind::Scale
        }
        Op::Clamp { min, max } => {
            p.f[0] = *min;
            p.f[1] = *max;
            UnaryKind::Clamp
        }
        _ => UnaryKind::Function(
            UnaryOp::ALL
                .iter()
                .position(|x| Op::Unary(*x) == t.op)
                .unwrap_or(0) as u32,
        ),
    };
    if !FLOATS.contains(&a) {
        return Err(format!("type {a}"));
    }
    let count = t.nelements();
    Ok(ew(
        unary_key(op, a, t.dtype),
        vec![n.id, t.src[0]],
        p,
        count,
    ))
}

/// Copies: between float types, of 4-byte values as they are, quantized blocks to f32 or as
/// they are, floats to quantized blocks.
pub(super) fn copy(n: &Node, mut p: Params) -> Result<Vec<PlanOut>, String> {
    let t = n.t;
    let a = n.srcs[0];
    let (from, to) = (a.dtype, t.dtype);
    let bind = vec![n.id, t.src[0]];
    let count = t.nelements();
    let op = if FLOATS.contains(&from) && FLOATS.contains(&to) {
        UnaryKind::Convert
    } else if from == to && from.type_size() == 4 && !from.is_quantized() {
        UnaryKind::Raw
    } else if readable_quant(from) && to == DType::F32 && a.rows_contiguous() {
        UnaryKind::Dequantize
    } else if from == to && from.is_quantized() && t.is_contiguous() {
        p.u[1] = t.nbytes() as u32;
        p.u[2] = t.row_bytes() as u32;
        let key = unary_key(UnaryKind::Blocks, from, to);
        return Ok(ew(key, bind, p, t.nbytes() / 4 + 2));
    } else if FLOATS.contains(&from) && DType::QUANTIZED.contains(&to) && t.is_contiguous() {
        let key = unary_key(UnaryKind::Quantize, from, to);
        return Ok(ew(key, bind, p, count / to.block_size()));
    } else {
        return Err(format!("copy from {from} to {to}"));
    };
    Ok(ew(unary_key(op, from, to), bind, p, count))
}

/// Binary element-wise ops.
pub(super) fn binary(n: &Node, p: Params, op: BinaryOp) -> Result<Vec<PlanOut>, String> {
    let t = n.t;
    let (a, b) = (n.srcs[0].dtype, n.srcs[1].dtype);
    if !FLOATS.contains(&a) || !FLOATS.contains(&b) {
        return Err(format!("types {a} and {b}"));
    }
    let key = Key::Binary(BinaryKey { op, a, b });
    Ok(ew(key, vec![n.id, t.src[0], t.src[1]], p, t.nelements()))
}

/// Gated linear units (the gate and up halves of one tensor, or two tensors).
pub(super) fn glu(
    n: &Node,
    mut p: Params,
    op: GluOp,
    swapped: bool,
) -> Result<Vec<PlanOut>, String> {
    let t = n.t;
    let a = n.srcs[0].dtype;
    if !matches!(a, DType::F32 | DType::F16) {
        return Err(format!("type {a}"));
    }
    p.u[1] = u32::from(n.srcs.len() == 2);
    p.u[2] = u32::from(swapped);
    let up = t.src.get(1).copied().unwrap_or(n.id);
    let key = Key::Glu(GluKey {
        op,
        t: a,
        oai: false,
    });
    Ok(ew(key, vec![n.id, t.src[0], up], p, t.nelements()))
}

/// gpt-oss's clamped SwiGLU of two f32 sources.
pub(super) fn swiglu_oai(
    n: &Node,
    mut p: Params,
    alpha: f32,
    limit: f32,
) -> Result<Vec<PlanOut>, String> {
    let t = n.t;
    if n.srcs.iter().any(|s| s.dtype != DType::F32) || t.dtype != DType::F32 {
        return Err("clamped swiglu of f32 only".into());
    }
    p.u[1] = 1;
    p.f[0] = alpha;
    p.f[1] = limit;
    let key = Key::Glu(GluKey {
        op: GluOp::Swiglu,
        t: DType::F32,
        oai: true,
    });
    Ok(ew(key, vec![n.id, t.src[0], t.src[1]], p, t.nelements()))
}

/// Every unary-family key the plans can ask for.
#[cfg(test)]
pub(super) fn unary_variants() -> Vec<Key> {
    let mut v = Vec::new();
    let functions = (0..UnaryOp::ALL.len() as u32).map(UnaryKind::Function);
    for &a in &FLOATS {
        for op in [UnaryKind::Scale, UnaryKind::Clamp]
            .into_iter()
            .chain(functions.clone())
        {
            v.push(unary_key(op, a, a));
        }
        for &b in &FLOATS {
            v.push(unary_key(UnaryKind::Convert, a, b));
        }
    }
    v.push(unary_key(UnaryKind::Raw, DType::F32, DType::F32));
    v.push(unary_key(UnaryKind::Raw, DType::I32, DType::I32));
    for &q in DType::QUANTIZED.iter().chain(&super::READ_ONLY_QUANTS) {
        v.push(unary_key(UnaryKind::Dequantize, q, DType::F32));
        v.push(unary_key(UnaryKind::Blocks, q, q));
    }
    for &a in &FLOATS {
        for &q in &DType::QUANTIZED {
            v.push(unary_key(UnaryKind::Quantize, a, q));
        }
    }
    v
}

/// Every binary key the plans can ask for.
#[cfg(test)]
pub(super) fn binary_variants() -> Vec<Key> {
    let mut v = Vec::new();
    for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div] {
        for &a in &FLOATS {
            for &b in &FLOATS {
                v.push(Key::Binary(BinaryKey { op, a, b }));
            }
        }
    }
    v
}

/// Every glu key the plans can ask for.
#[cfg(test)]
pub(super) fn glu_variants() -> Vec<Key> {
    let mut v = Vec::new();
    for op in [GluOp::Swiglu, GluOp::Geglu] {
        for t in [DType::F32, DType::F16] {
            v.push(Key::Glu(GluKey { op, t, oai: false }));
        }
    }
    v.push(Key::Glu(GluKey {
        op: GluOp::Swiglu,
        t: DType::F32,
        oai: true,
    }));
    v
}
