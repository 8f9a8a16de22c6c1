//! Scalar activation functions shared by the unary ops and the gated linear units.

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

/// The error function, to about 1e-15 relative (more than f32 needs).
///
/// For |x| < 6 it sums erf(x) = 2/sqrt(pi) e^(-x^2) sum_n 2^n x^(2n+1) / (1*3*...*(2n+1)), a
/// series of positive terms, so no digits cancel; beyond 6, erf is 1 to within f64 precision.
fn erf(x: f64) -> f64 {
    let a = x.abs();
    if a.is_nan() {
        return x;
    }
    if a >= 6.0 {
        return 1f64.copysign(x);
    }
    let a2 = a * a;
    let (mut term, mut sum) = (a, a);
    for n in 1..400 {
        term *= 2.0 * a2 / f64::from(2 * n + 1);
        sum += term;
        if term < sum * 1e-17 {
            break;
        }
    }
    let r = std::f64::consts::FRAC_2_SQRT_PI * (-a2).exp() * sum;
    r.min(1.0).copysign(x)
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
    fn erf_matches_known_values() {
        // erf values from tables (Abramowitz and Stegun 7.1).
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (3.5, 0.999_999_256_901_627_7),
        ] {
            assert!((erf(x) - want).abs() < 1e-14, "erf({x}) = {}", erf(x));
            assert!((erf(-x) + want).abs() < 1e-14);
        }
        assert_eq!(erf(10.0), 1.0);
    }

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
