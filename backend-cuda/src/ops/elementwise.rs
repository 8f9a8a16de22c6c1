//! Element-wise ops: unary functions, scale, clamp, binary ops with broadcasting, and gated
//! linear units (kernels/unary.cu, binary.cu, glu.cu).

use tessera_core::{BinaryOp, DType, GluOp, Result, TensorId, UnaryOp};

use super::{flat4, params, Encoder};

/// The function code of a unary op in kernels/unary.cu.
pub(super) fn unary_code(u: UnaryOp) -> i32 {
    match u {
        UnaryOp::Sqr => 0,
        UnaryOp::Sqrt => 1,
        UnaryOp::Neg => 2,
        UnaryOp::Abs => 3,
        UnaryOp::Exp => 4,
        UnaryOp::Log => 5,
        UnaryOp::Sin => 6,
        UnaryOp::Cos => 7,
        UnaryOp::Relu => 8,
        UnaryOp::Gelu => 9,
        UnaryOp::GeluErf => 10,
        UnaryOp::Silu => 11,
        UnaryOp::Sigmoid => 12,
        UnaryOp::Tanh => 13,
    }
}

/// A unary function (code `op`, parameters `a`, `b`) of src0.
pub(super) fn unary(enc: &mut Encoder, id: TensorId, op: i32, a: f32, b: f32) -> Result<()> {
    let t = enc.graph.get(id);
    let d = enc.arg(id)?;
    let s = enc.arg(t.src[0])?;
    let mut p = params(d, &[s]);
    p.i[0] = op;
    p.f[0] = a;
    p.f[1] = b;
    let name = format!("unary_{}", t.dtype.name());
    enc.launch_elems("unary", &name, d.ne, p)
}

/// a op b, b broadcast.
pub(super) fn binary(enc: &mut Encoder, id: TensorId, op: BinaryOp) -> Result<()> {
    let t = enc.graph.get(id);
    let (a, b) = (t.src[0], t.src[1]);
    let d = enc.arg(id)?;
    let p0 = enc.arg(a)?;
    let p1 = enc.arg(b)?;
    let mut p = params(d, &[p0, p1]);
    p.i[0] = match op {
        BinaryOp::Add => 0,
        BinaryOp::Sub => 1,
        BinaryOp::Mul => 2,
        BinaryOp::Div => 3,
    };
    let types = [t.dtype, enc.graph.get(a).dtype, enc.graph.get(b).dtype];
    if types == [DType::F32; 3]
        && p0.ne == d.ne
        && p1.ne == d.ne
        && [d, p0, p1].iter().all(|x| flat4(x, 4))
    {
        let n: i64 = d.ne.iter().product();
        return enc.launch_flat("binary", "binary_flat_f32", n / 4, p);
    }
    let name = format!("binary_{}_{}", types[1].name(), types[2].name());
    enc.launch_elems("binary", &name, d.ne, p)
}

/// A gated linear unit, from one source (both halves in each row) or two.
pub(super) fn glu(enc: &mut Encoder, id: TensorId, op: GluOp, swapped: bool) -> Result<()> {
    let t = enc.graph.get(id);
    let d = enc.arg(id)?;
    let a = enc.arg(t.src[0])?;
    let split = t.src.len() > 1;
    let b = if split { enc.arg(t.src[1])? } else { a };
    let mut p = params(d, &[a, b]);
    p.i[0] = match op {
        GluOp::Swiglu => 0,
        GluOp::Geglu => 1,
    };
    p.i[1] = i32::from(swapped);
    p.i[2] = i32::from(split);
    if split
        && t.dtype == DType::F32
        && a.ne == d.ne
        && b.ne == d.ne
        && [d, a, b].iter().all(|x| flat4(x, 4))
    {
        let n: i64 = d.ne.iter().product();
        return enc.launch_flat("glu", "glu_flat_f32", n / 4, p);
    }
    let name = format!("glu_{}", t.dtype.name());
    enc.launch_elems("glu", &name, d.ne, p)
}

/// gpt-oss's clamped SwiGLU of two f32 tensors of dst's shape.
pub(super) fn swiglu_oai(enc: &mut Encoder, id: TensorId, alpha: f32, limit: f32) -> Result<()> {
    let t = enc.graph.get(id);
    let d = enc.arg(id)?;
    let a = enc.arg(t.src[0])?;
    let b = enc.arg(t.src[1])?;
    let mut p = params(d, &[a, b]);
    p.f[0] = alpha;
    p.f[1] = limit;
    enc.launch_elems("glu", "swiglu_oai_f32", d.ne, p)
}
