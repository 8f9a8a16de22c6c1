//! Rotary position embedding (kernels/rope.cu).

use tessera_core::{Result, RopeMode, RopeParams, TensorId};

use super::{params, Encoder};

/// Rope of src0 at the positions in src1.
pub(super) fn rope(enc: &mut Encoder, id: TensorId, rp: &RopeParams) -> Result<()> {
    let t = enc.graph.get(id);
    let d = enc.arg(id)?;
    let p = rope_params(d, enc.arg(t.src[0])?, enc.arg(t.src[1])?, rp);
    let shape = [d.ne[0] / 2, d.ne[1], d.ne[2], d.ne[3]];
    enc.launch_elems("rope", &format!("rope_{}", t.dtype.name()), shape, p)
}

/// The kernel parameters of a rope (shared with the fused rope + set_rows).
pub(super) fn rope_params(
    d: crate::cmd::TArg,
    s: crate::cmd::TArg,
    pos: crate::cmd::TArg,
    rp: &RopeParams,
) -> crate::cmd::KParams {
    let mut p = params(d, &[s, pos]);
    p.f[0] = rp.freq_scale;
    p.f[1] = theta_scale(rp);
    p.i[0] = rp.n_dims as i32;
    p.i[1] = i32::from(rp.mode == RopeMode::Neox);
    p
}

/// The ratio of one rotated pair's angle to the one before it: freq_base^(-2 / n_dims).
pub(super) fn theta_scale(rp: &RopeParams) -> f32 {
    rp.freq_base.powf(-2.0 / rp.n_dims as f32)
}
