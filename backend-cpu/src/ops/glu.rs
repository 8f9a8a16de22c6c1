//! Gated linear units: `act(gate) * up`, from one tensor whose rows hold both halves or from
//! two tensors of one shape; and gpt-oss's clamped SwiGLU of two tensors.

use tessera_core::{GluOp, Result};

use super::act::{gelu, silu};
use crate::parallel::for_ranges;
use crate::view::TView;

/// Runs swiglu / geglu. With `up` absent each row of `a` is gate then up (up then gate when
/// `swapped`); with `up` present `a` is the gate.
pub(crate) fn run(
    op: GluOp,
    swapped: bool,
    dst: &TView,
    a: &TView,
    up: Option<&TView>,
) -> Result<()> {
    let act: fn(f32) -> f32 = match op {
        GluOp::Swiglu => silu,
        GluOp::Geglu => gelu,
    };
    let n = dst.ne[0];
    for_ranges(dst.nrows(), n * 8, |rows| {
        let mut ra = vec![0f32; a.ne[0]];
        let mut ru = vec![0f32; if up.is_some() { n } else { 0 }];
        let mut out = vec![0f32; n];
        for r in rows {
            let i = dst.row_index(r);
            a.load_row(i, &mut ra)?;
            let (g, u) = match up {
                Some(u) => {
                    u.load_row(i, &mut ru)?;
                    (&ra[..n], &ru[..])
                }
                None if swapped => (&ra[n..], &ra[..n]),
                None => (&ra[..n], &ra[n..]),
            };
            for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
                *o = act(g) * u;
            }
            dst.store_row(i, &out)?;
        }
        Ok(())
    })
}

/// gpt-oss's clamped SwiGLU: x * sigmoid(alpha * x) * (y + 1) with x = min(gate, limit) and
/// y = clamp(up, -limit, limit).
pub(crate) fn swiglu_oai(
    dst: &TView,
    gate: &TView,
    up: &TView,
    alpha: f32,
    limit: f32,
) -> Result<()> {
    let n = dst.ne[0];
    for_ranges(dst.nrows(), n * 8, |rows| {
        let mut rg = vec![0f32; n];
        let mut ru = vec![0f32; n];
        for r in rows {
            let i = dst.row_index(r);
            gate.load_row(i, &mut rg)?;
            up.load_row(i, &mut ru)?;
            for (g, &u) in rg.iter_mut().zip(&ru) {
                let x = g.min(limit);
                let y = u.clamp(-limit, limit);
                *g = x / (1.0 + (-alpha * x).exp()) * (y + 1.0);
            }
            dst.store_row(i, &rg)?;
        }
        Ok(())
    })
}
