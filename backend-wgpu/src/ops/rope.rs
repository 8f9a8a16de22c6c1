//! Rotary position embedding (`rope.wgsl`), and its fused form that stores the rotated K and V
//! into their caches.

use tessera_core::{DType, RopeMode, RopeParams};

use super::{ew, Node, Params, PlanOut};
use crate::keys::{Key, RopeKey};

/// The rope of src0 at the positions of src1, with the frequency factors of src2 where there
/// are (FACTORS) and rope_ext's blend and magnitude where the rotation is not the plain one
/// (BLEND: f.z ext_factor, f.w YaRN's first corrected pair, g.x the inverse of the correction
/// range's width, g.y the magnitude).
pub(super) fn rope(n: &Node, mut p: Params, r: &RopeParams) -> Result<Vec<PlanOut>, String> {
    let t = n.t;
    let a = n.srcs[0].dtype;
    if !matches!(a, DType::F32 | DType::F16) {
        return Err(format!("type {a}"));
    }
    let per_row = r.n_dims / 2 + t.ne[0] - r.n_dims;
    let count = per_row * t.nrows();
    p.f[0] = r.freq_base.log2();
    p.f[1] = r.freq_scale;
    p.u[1] = r.n_dims as u32;
    p.u[2] = if r.mode == RopeMode::Neox { 2 } else { 0 };
    let blend = !r.is_plain();
    if blend {
        let corr = r.yarn_corr_dims();
        p.f[2] = r.ext_factor;
        p.f[3] = corr[0];
        p.g[0] = 1.0 / (corr[1] - corr[0]).max(0.001);
        // cos_sin's magnitude: the attention factor, with YaRN's correction where it blends.
        p.g[1] = r.cos_sin(0.0, 0, corr).0;
    }
    let key = Key::Rope(RopeKey {
        t: a,
        kv_cache: None,
        factors: t.src.len() > 2,
        blend,
    });
    let mut bind = vec![n.id];
    bind.extend(&t.src);
    Ok(ew(key, bind, p, count))
}

/// The fused rope of K (f32) with the stores of K and V into caches of type `cache` (KV), with
/// rope_ext's blend and magnitude (`blend`, parameters as [`rope`] sets them) and frequency
/// factors (`factors`, in a ninth storage binding: source 2 holds the cache rows there).
pub(crate) fn rope_kv_key(cache: DType, blend: bool, factors: bool) -> Key {
    Key::Rope(RopeKey {
        t: DType::F32,
        kv_cache: Some(cache),
        factors,
        blend,
    })
}

/// Every rope key the plans can ask for.
#[cfg(test)]
pub(super) fn variants() -> Vec<Key> {
    let both = [(false, false), (true, false), (false, true), (true, true)];
    let mut v = Vec::new();
    for t in [DType::F32, DType::F16] {
        for (factors, blend) in both {
            v.push(Key::Rope(RopeKey {
                t,
                kv_cache: None,
                factors,
                blend,
            }));
        }
    }
    for cache in [DType::F32, DType::F16] {
        for (factors, blend) in both {
            v.push(rope_kv_key(cache, blend, factors));
        }
    }
    v
}
