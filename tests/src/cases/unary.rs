//! Every unary op in f32 and f16, contiguous and permuted; the gated linear units fused
//! (plain and swapped) and split, at small and feed-forward sizes; logit soft-capping (scale,
//! tanh, scale).

use tessera_core::{DType, GluOp, UnaryOp};

use super::{ne_str, permuted};
use crate::case::{Case, Tolerance};
use crate::init::Init;

/// Inputs in the op's domain: positive for sqrt and log.
fn domain(op: UnaryOp) -> Init {
    match op {
        UnaryOp::Sqrt | UnaryOp::Log => Init::Uniform(0.1, 2.0),
        _ => Init::Uniform(-2.0, 2.0),
    }
}

/// Every unary and glu case.
pub(super) fn cases(v: &mut Vec<Case>) {
    soft_cap(v);
    for op in UnaryOp::ALL {
        let name = tessera_core::Op::Unary(op).name();
        for t in [DType::F32, DType::F16] {
            for (ne, per) in [([128, 2, 2, 2], [0, 1, 2, 3]), ([7, 5, 3, 2], [0, 2, 1, 3])] {
                let params = format!("type={t},ne={},per={}", ne_str(&ne), ne_str(&per));
                v.push(Case::new(
                    name,
                    params,
                    &[t],
                    Tolerance::DEFAULT,
                    move |g| {
                        let a = permuted(g, t, ne, per, domain(op))?;
                        g.unary(a, op)
                    },
                ));
            }
        }
    }
    for (op, name) in [(GluOp::Swiglu, "SWIGLU"), (GluOp::Geglu, "GEGLU")] {
        for t in [DType::F32, DType::F16] {
            // Last, a feed-forward width of one token and of a short prompt (Gemma 3 270M's
            // 2048).
            for ne in [
                [128, 2, 2, 2],
                [10, 5, 4, 3],
                [2048, 1, 1, 1],
                [2048, 5, 1, 1],
            ] {
                for swapped in [false, true] {
                    let params = format!(
                        "type={t},ne={},swapped={},split=0",
                        ne_str(&ne),
                        swapped as u8
                    );
                    v.push(Case::new(
                        name,
                        params,
                        &[t],
                        Tolerance::DEFAULT,
                        move |g| {
                            let a = g.input(
                                t,
                                &[2 * ne[0], ne[1], ne[2], ne[3]],
                                Init::Uniform(-2.0, 2.0),
                            )?;
                            g.glu(a, op, swapped)
                        },
                    ));
                }
                let params = format!("type={t},ne={},swapped=0,split=1", ne_str(&ne));
                v.push(Case::new(
                    name,
                    params,
                    &[t],
                    Tolerance::DEFAULT,
                    move |g| {
                        let gate = g.input(t, &ne, Init::Uniform(-2.0, 2.0))?;
                        let up = g.leaf(t, &ne)?;
                        g.glu_split(gate, up, op)
                    },
                ));
            }
        }
    }
}

/// Logit soft-capping as Gemma 2 writes it, `cap * tanh(x / cap)`: scale, tanh, scale, over
/// the attention scores' and the output logits' shapes, with values well past the cap.
fn soft_cap(v: &mut Vec<Case>) {
    for (ne, cap) in [([300, 4, 2, 1], 50.0f32), ([1000, 3, 1, 1], 30.0)] {
        v.push(Case::new(
            "SCALE_TANH_SCALE",
            format!("type=f32,ne={},cap={cap}", ne_str(&ne)),
            &[DType::F32],
            Tolerance::DEFAULT,
            move |g| {
                let a = g.input(DType::F32, &ne, Init::Uniform(-4.0 * cap, 4.0 * cap))?;
                let a = g.scale(a, 1.0 / cap)?;
                let a = g.unary(a, UnaryOp::Tanh)?;
                g.scale(a, cap)
            },
        ));
    }
}
