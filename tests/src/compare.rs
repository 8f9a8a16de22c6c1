//! Comparing a device's output with the reference's: NaN never passes, infinities must match
//! in place and sign (f32::MAX counts as infinity, as in ggml), the rest by NMSE.

use crate::case::Tolerance;

/// The outcome of a comparison.
pub(crate) struct Comparison {
    /// `sum((ref - out)^2) / sum(ref^2)` over the finite values.
    pub nmse: f64,
    /// Why the output fails, if it does.
    pub failure: Option<String>,
}

/// ggml accepts the largest finite f32 as an infinity (backends that clamp).
fn inf_or_max(v: f64) -> bool {
    v.is_infinite() || v.abs() == f32::MAX as f64
}

/// Compares `out` (device under test) with `reference` under `tol`.
pub(crate) fn compare(reference: &[f64], out: &[f64], tol: Tolerance) -> Comparison {
    if reference.len() != out.len() {
        let failure = Some(format!(
            "{} values, the reference has {}",
            out.len(),
            reference.len()
        ));
        return Comparison {
            nmse: f64::INFINITY,
            failure,
        };
    }
    let (mut err, mut norm) = (0.0, 0.0);
    for (i, (&r, &o)) in reference.iter().zip(out).enumerate() {
        if r.is_nan() || o.is_nan() {
            let failure = Some(format!("NaN at index {i} (out {o}, reference {r})"));
            return Comparison {
                nmse: f64::NAN,
                failure,
            };
        }
        if inf_or_max(r) || inf_or_max(o) {
            if !(inf_or_max(r) && inf_or_max(o) && r.is_sign_negative() == o.is_sign_negative()) {
                let failure = Some(format!(
                    "inf mismatch at index {i} (out {o}, reference {r})"
                ));
                return Comparison {
                    nmse: f64::INFINITY,
                    failure,
                };
            }
            continue;
        }
        if tol == Tolerance::Exact && r != o {
            let failure = Some(format!("value {i} differs (out {o}, reference {r})"));
            return Comparison {
                nmse: finite_nmse(reference, out),
                failure,
            };
        }
        if let Tolerance::Quantized { max_abs, .. } = tol {
            if (r - o).abs() > max_abs {
                let failure = Some(format!(
                    "value {i} differs by more than {max_abs:.3e} (out {o}, reference {r})"
                ));
                return Comparison {
                    nmse: finite_nmse(reference, out),
                    failure,
                };
            }
        }
        err += (r - o) * (r - o);
        norm += r * r;
    }
    let nmse = if err == 0.0 { 0.0 } else { err / norm };
    let failure =
        (nmse > tol.threshold()).then(|| format!("NMSE {nmse:.3e} > {:.3e}", tol.threshold()));
    Comparison { nmse, failure }
}

/// The suite's error metric for a backend's own tests: the NMSE of `out` against `reference`
/// under [`compare`]'s rules (infinite where a NaN appears, or an infinity is not matched in
/// place and sign, or the lengths differ).
pub fn nmse(reference: &[f32], out: &[f32]) -> f64 {
    let wide = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
    let c = compare(&wide(reference), &wide(out), Tolerance::Nmse(f64::INFINITY));
    if c.failure.is_some() {
        f64::INFINITY
    } else {
        c.nmse
    }
}

/// NMSE over the finite pairs (for reporting a failed exact comparison).
fn finite_nmse(reference: &[f64], out: &[f64]) -> f64 {
    let (mut err, mut norm) = (0.0, 0.0);
    for (&r, &o) in reference.iter().zip(out) {
        if r.is_finite() && o.is_finite() {
            err += (r - o) * (r - o);
            norm += r * r;
        }
    }
    if err == 0.0 {
        0.0
    } else {
        err / norm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_and_inf_rules() {
        let t = Tolerance::DEFAULT;
        assert!(compare(&[1.0, 2.0], &[1.0, 2.0], t).failure.is_none());
        assert!(compare(&[1.0, 2.0], &[1.0, f64::NAN], t).failure.is_some());
        assert!(compare(&[f64::NAN], &[f64::NAN], t).failure.is_some());
        assert!(
            compare(&[f64::NEG_INFINITY, 1.0], &[f64::NEG_INFINITY, 1.0], t)
                .failure
                .is_none()
        );
        assert!(
            compare(&[f64::NEG_INFINITY, 1.0], &[f32::MIN as f64, 1.0], t)
                .failure
                .is_none()
        );
        assert!(compare(&[f64::NEG_INFINITY, 1.0], &[f64::INFINITY, 1.0], t)
            .failure
            .is_some());
        assert!(compare(&[f64::NEG_INFINITY, 1.0], &[0.0, 1.0], t)
            .failure
            .is_some());
        assert!(compare(&[1.0, 2.0], &[1.0, 2.0 + 1e-9], Tolerance::Exact)
            .failure
            .is_some());
        assert!(compare(&[1.0, 2.0], &[1.0, 2.1], t).failure.is_some());
        assert!(compare(&[1.0], &[1.0, 2.0], t).failure.is_some());
    }

    #[test]
    fn the_public_nmse_is_infinite_where_compare_fails() {
        assert_eq!(nmse(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!((nmse(&[3.0, 4.0], &[3.0, 4.5]) - 0.25 / 25.0).abs() < 1e-12);
        assert_eq!(nmse(&[1.0], &[f32::NAN]), f64::INFINITY);
        assert_eq!(nmse(&[f32::NEG_INFINITY], &[f32::NEG_INFINITY]), 0.0);
        assert_eq!(nmse(&[f32::NEG_INFINITY], &[0.0]), f64::INFINITY);
        assert_eq!(nmse(&[1.0], &[1.0, 2.0]), f64::INFINITY);
    }
}
