//! Element-wise ops: binary with broadcasting, scale, the unary functions, clamp, and the gated
//! linear units.

use tessera_core::math::erf;
use tessera_core::{BinaryOp, GluOp, Graph, Result, TensorId, UnaryOp};

use super::io;

/// out = a op b, b broadcast over a (each of b's dims divides a's).
pub(super) fn binary(g: &Graph, id: TensorId, op: BinaryOp) -> Result<()> {
    let (a, b) = (io::src(g, id, 0)?, io::src(g, id, 1)?);
    let ne = a.ne;
    let mut out = Vec::with_capacity(a.v.len());
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                for i0 in 0..ne[0] {
                    let x = a.at(i0, i1, i2, i3);
                    let y = b.at(i0 % b.ne[0], i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3]);
                    out.push(match op {
                        BinaryOp::Add => x + y,
                        BinaryOp::Sub => x - y,
                        BinaryOp::Mul => x * y,
                        BinaryOp::Div => x / y,
                    });
                }
            }
        }
    }
    io::write(g, id, &out)
}

/// out = f(src0), element by element.
pub(super) fn map(g: &Graph, id: TensorId, f: impl Fn(f64) -> f64) -> Result<()> {
    let a = io::src(g, id, 0)?;
    let out: Vec<f64> = a.v.iter().map(|&x| f(x)).collect();
    io::write(g, id, &out)
}

/// GELU, tanh approximation.
fn gelu(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// One unary function.
pub(super) fn unary(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Sqr => x * x,
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Gelu => gelu(x),
        UnaryOp::GeluErf => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
        UnaryOp::Silu => x * sigmoid(x),
        UnaryOp::Sigmoid => sigmoid(x),
        UnaryOp::Tanh => x.tanh(),
    }
}

fn act(op: GluOp, x: f64) -> f64 {
    match op {
        GluOp::Swiglu => x * sigmoid(x),
        GluOp::Geglu => gelu(x),
    }
}

/// act(gate) * up: with one source each row holds gate then up (up then gate when swapped);
/// with two, src0 is the gate and src1 the up.
pub(super) fn glu(g: &Graph, id: TensorId, op: GluOp, swapped: bool) -> Result<()> {
    let a = io::src(g, id, 0)?;
    let out: Vec<f64> = if g.get(id).src.len() == 2 {
        let up = io::src(g, id, 1)?;
        a.v.iter()
            .zip(&up.v)
            .map(|(&x, &u)| act(op, x) * u)
            .collect()
    } else {
        let n = a.ne[0] / 2;
        let mut out = Vec::with_capacity(a.v.len() / 2);
        for row in a.v.chunks_exact(a.ne[0].max(1)) {
            let (first, second) = row.split_at(n);
            let (gate, up) = if swapped {
                (second, first)
            } else {
                (first, second)
            };
            out.extend(gate.iter().zip(up).map(|(&x, &u)| act(op, x) * u));
        }
        out
    };
    io::write(g, id, &out)
}

/// gpt-oss's clamped SwiGLU: x * sigmoid(alpha * x) * (y + 1), x = min(gate, limit),
/// y = clamp(up, -limit, limit).
pub(super) fn swiglu_oai(g: &Graph, id: TensorId, alpha: f64, limit: f64) -> Result<()> {
    let (gate, up) = (io::src(g, id, 0)?, io::src(g, id, 1)?);
    let out: Vec<f64> = gate
        .v
        .iter()
        .zip(&up.v)
        .map(|(&x, &y)| {
            let x = x.min(limit);
            let y = y.clamp(-limit, limit);
            x / (1.0 + (-alpha * x).exp()) * (y + 1.0)
        })
        .collect();
    io::write(g, id, &out)
}
