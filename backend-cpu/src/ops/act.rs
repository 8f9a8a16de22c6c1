//! Scalar activation functions shared by the unary ops and the gated linear units.

use tessera_core::math::erf;
use tessera_core::UnaryOp;

/// sqrt(2 / pi), the GELU tanh approximation's factor.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic coefficient of the GELU tanh approximation.
const GELU_COEF_A: f32 = 0.044_715;

/// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))).
pub(crate) fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
}

/// GELU with the exact error function: 0.5 x (1 + erf(x / sqrt 2)).
pub(crate) fn gelu_erf(x: f32) -> f32 {
    let x = f64::from(x);
    (0.5 * x * (1.0 + erf(x * std::f64::consts::FRAC_1_SQRT_2))) as f32
}

/// x * sigmoid(x).
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// 1 / (1 + e^-x).
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// The scalar function of a unary op.
pub(crate) fn unary_fn(op: UnaryOp) -> fn(f32) -> f32 {
    match op {
        UnaryOp::Sqr => |x| x * x,
        UnaryOp::Sqrt => f32::sqrt,
        UnaryOp::Neg => |x| -x,
        UnaryOp::Abs => f32::abs,
        UnaryOp::Exp => f32::exp,
        UnaryOp::Log => f32::ln,
        UnaryOp::Sin => f32::sin,
        UnaryOp::Cos => f32::cos,
        UnaryOp::Relu => |x| x.max(0.0),
        UnaryOp::Gelu => gelu,
        UnaryOp::GeluErf => gelu_erf,
        UnaryOp::Silu => silu,
        UnaryOp::Sigmoid => sigmoid,
        UnaryOp::Tanh => f32::tanh,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activations_at_known_points() {
        assert_eq!(silu(0.0), 0.0);
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
        assert!((gelu(1.0) - 0.841_192).abs() < 1e-5);
        assert!((gelu_erf(1.0) - 0.841_344_7).abs() < 1e-6);
        assert!((gelu_erf(-3.0) + 0.004_049_69).abs() < 1e-7);
        assert_eq!(unary_fn(UnaryOp::Relu)(-2.0), 0.0);
    }
}
