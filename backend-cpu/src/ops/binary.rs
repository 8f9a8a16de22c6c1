//! add, sub, mul, div: `dst = a op b` with `b` repeated over `a` along every axis whose size
//! it divides (ggml's broadcasting), computed in f32 whatever the storage types.

use tessera_core::{BinaryOp, Result};

use super::wrap;
use crate::parallel::for_ranges;
use crate::view::TView;

/// Runs a binary op; `dst` may share `a`'s memory.
pub(crate) fn run(op: BinaryOp, dst: &TView, a: &TView, b: &TView) -> Result<()> {
    let f: fn(f32, f32) -> f32 = match op {
        BinaryOp::Add => |x, y| x + y,
        BinaryOp::Sub => |x, y| x - y,
        BinaryOp::Mul => |x, y| x * y,
        BinaryOp::Div => |x, y| x / y,
    };
    let n = dst.ne[0];
    let nb0 = b.ne[0];
    for_ranges(dst.nrows(), n, |rows| {
        let mut ra = vec![0f32; n];
        let mut rb = vec![0f32; nb0];
        for r in rows {
            let i = dst.row_index(r);
            a.load_row(i, &mut ra)?;
            b.load_row(wrap(i, b.ne), &mut rb)?;
            for chunk in ra.chunks_mut(nb0.max(1)) {
                for (x, &y) in chunk.iter_mut().zip(&rb) {
                    *x = f(*x, y);
                }
            }
            dst.store_row(i, &ra)?;
        }
        Ok(())
    })
}
