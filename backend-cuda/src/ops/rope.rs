//! Rotary position embedding (kernels/rope.cu).

use tessera_core::{Result, RopeMode, RopeParams, TensorId};

use super::{params, Encoder};
use crate::cmd::{KParams, TArg};

/// Rope of src0 at the positions in src1, with the frequency factors of src2 where there are.
pub(super) fn rope(enc: &mut Encoder, id: TensorId, rp: &RopeParams) -> Result<()> {
    let t = enc.graph.get(id);
    let d = enc.arg(id)?;
    let factors = factors_arg(enc, id)?;
    let p = rope_params(d, enc.arg(t.src[0])?, enc.arg(t.src[1])?, rp, factors);
    let shape = [d.ne[0] / 2, d.ne[1], d.ne[2], d.ne[3]];
    enc.launch_elems("rope", &format!("rope_{}", t.dtype.name()), shape, p)
}

/// The frequency factors (source 2) of rope node `id`, where it has them.
pub(super) fn factors_arg(enc: &Encoder, id: TensorId) -> Result<Option<TArg>> {
    enc.graph
        .get(id)
        .src
        .get(2)
        .map(|&f| enc.arg(f))
        .transpose()
}

/// The kernel parameters of a rope (shared with the fused rope + set_rows and rope_kv).
pub(super) fn rope_params(
    d: TArg,
    s: TArg,
    pos: TArg,
    rp: &RopeParams,
    factors: Option<TArg>,
) -> KParams {
    let mut p = params(d, &[s, pos]);
    p.i[0] = rp.n_dims as i32;
    p.i[1] = i32::from(rp.mode == RopeMode::Neox);
    set_rotation(&mut p, rp, factors);
    p
}

/// The slots every rope kernel (rope.cu's and mmvq_multi_rope) reads the rotation from, as
/// common.cuh's `rope_rotate` says: the plain rotation in f[0] and f[1]; for rope_ext's
/// additions a flag in i[7], the frequency factors' address in aux[3] and the blend and
/// magnitude in f[2..6], YaRN's correction range computed here once.
pub(super) fn set_rotation(p: &mut KParams, rp: &RopeParams, factors: Option<TArg>) {
    const FACTORS: i32 = 1;
    const BLEND: i32 = 2;
    p.f[0] = rp.freq_scale;
    p.f[1] = rp.freq_base.powf(-2.0 / rp.n_dims as f32);
    p.i[7] = 0;
    if let Some(f) = factors {
        p.i[7] |= FACTORS;
        p.aux[3] = f.ptr;
    }
    if !rp.is_plain() {
        p.i[7] |= BLEND;
        let corr = rp.yarn_corr_dims();
        p.f[2] = rp.ext_factor;
        p.f[3] = corr[0];
        p.f[4] = 1.0 / (corr[1] - corr[0]).max(0.001);
        // cos_sin at angle 0 gives (magnitude, 0): the attention factor, with YaRN's correction
        // where it blends.
        let (mag, _) = rp.cos_sin(0.0, 0, corr);
        p.f[5] = mag;
    }
}
