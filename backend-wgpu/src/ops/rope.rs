//! Rotary position embedding (`rope.wgsl`), and its fused form that stores the rotated K and V
//! into their caches.

use tessera_core::{DType, RopeMode, RopeParams};

use super::{ew, Node, Params, PlanOut};
use crate::keys::{Key, RopeKey};

/// The rope of src0 at the positions of src1.
pub(super) fn rope(n: &Node, mut p: Params, r: &RopeParams) -> Result<Vec<PlanOut>, String> {
    let t = n.t;
    let a = n.srcs[0].dtype;
    if !matches!(a, DType::F32 | DType::F16) {
        return Err(format!("type {a}"));
    }
    if !r.is_plain() || t.src.len() > 2 {
        return Err("rope with frequency factors, YaRN or a magnitude factor".into());
    }
    let per_row = r.n_dims / 2 + t.ne[0] - r.n_dims;
    let count = per_row * t.nrows();
    p.f[0] = r.freq_base.log2();
    p.f[1] = r.freq_scale;
    p.u[1] = r.n_dims as u32;
    p.u[2] = if r.mode == RopeMode::Neox { 2 } else { 0 };
    let key = Key::Rope(RopeKey {
        t: a,
        kv_cache: None,
    });
    Ok(ew(key, vec![n.id, t.src[0], t.src[1]], p, count))
}

/// The fused rope of K (f32) with the stores of K and V into caches of type `cache` (KV).
pub(crate) fn rope_kv_key(cache: DType) -> Key {
    Key::Rope(RopeKey {
        t: DType::F32,
        kv_cache: Some(cache),
    })
}

/// Every rope key the plans can ask for.
#[cfg(test)]
pub(super) fn variants() -> Vec<Key> {
    let mut v: Vec<Key> = [DType::F32, DType::F16]
        .map(|t| Key::Rope(RopeKey { t, kv_cache: None }))
        .to_vec();
    v.extend([DType::F32, DType::F16].map(rope_kv_key));
    v
}
