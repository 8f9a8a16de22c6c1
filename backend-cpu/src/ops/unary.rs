//! Element-wise maps of one tensor: the unary functions, scale (+ bias) and clamp.

use tessera_core::Result;

use super::map_rows;
use crate::view::TView;

/// `dst = f(src)` element by element, in f32; `dst` may share `src`'s memory.
pub(crate) fn map(dst: &TView, src: &TView, f: impl Fn(f32) -> f32 + Sync) -> Result<()> {
    map_rows(dst, src, 4, |_, a, out| {
        for (o, &x) in out.iter_mut().zip(a) {
            *o = f(x);
        }
    })
}
