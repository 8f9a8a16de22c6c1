//! Row-wise normalisation and masking: rms_norm, norm, soft_max, diag_mask_inf
//! (kernels/norm.cu, softmax.cu).

use tessera_core::dtype::DType;
use tessera_core::{Result, TensorId};

use super::{params, Encoder};

/// Threads per row for a row of `n` elements.
pub(super) fn row_block(n: i64) -> u32 {
    if n >= 1024 {
        1024
    } else {
        (n.max(32) as u32).div_ceil(32) * 32
    }
}

fn row_kernel(
    enc: &mut Encoder,
    id: TensorId,
    file: &'static str,
    name: &str,
    eps: f32,
) -> Result<()> {
    let t = enc.graph.get(id);
    let d = enc.arg(id)?;
    let s = enc.arg(t.src[0])?;
    let mut p = params(d, &[s]);
    p.f[0] = eps;
    let rows = (t.nrows() as u64).min(u32::MAX as u64) as u32;
    enc.launch(file, name, [rows, 1, 1], [row_block(s.ne[0]), 1, 1], 0, p)
}

/// x / sqrt(mean(x^2) + eps) per row.
pub(super) fn rms_norm(enc: &mut Encoder, id: TensorId, eps: f32) -> Result<()> {
    row_kernel(enc, id, "norm", "rms_norm_f32", eps)
}

/// (x - mean) / sqrt(var + eps) per row.
pub(super) fn norm(enc: &mut Encoder, id: TensorId, eps: f32) -> Result<()> {
    row_kernel(enc, id, "norm", "norm_f32", eps)
}

/// ALiBi constants (m0, m1, n_head_log2) for `n_head` heads.
pub(super) fn alibi(max_bias: f32, n_head: usize) -> (f32, f32, i32) {
    let nl = 1u32 << (usize::BITS - 1 - n_head.max(1).leading_zeros());
    let m0 = 2f32.powf(-max_bias / nl as f32);
    let m1 = 2f32.powf(-(max_bias / 2.0) / nl as f32);
    (m0, m1, nl as i32)
}

/// softmax(x * scale + slope * mask) per row.
pub(super) fn soft_max(enc: &mut Encoder, id: TensorId, scale: f32, max_bias: f32) -> Result<()> {
    let t = enc.graph.get(id);
    let d = enc.arg(id)?;
    let s = enc.arg(t.src[0])?;
    let mask = t.src.get(1).copied();
    let (m, mt) = match mask {
        Some(m) => (enc.arg(m)?, enc.graph.get(m).dtype),
        None => (s, DType::F32),
    };
    let mut p = params(d, &[s, m]);
    p.f[0] = scale;
    p.f[1] = max_bias;
    let (m0, m1, nl) = alibi(max_bias, t.ne[2]);
    p.f[2] = m0;
    p.f[3] = m1;
    p.i[1] = nl;
    let name = match (mask, mt) {
        (None, _) => "soft_max_f32",
        (Some(_), DType::F16) => "soft_max_f32_mask_f16",
        _ => "soft_max_f32_mask_f32",
    };
    let rows = (t.nrows() as u64).min(u32::MAX as u64) as u32;
    enc.launch(
        "softmax",
        name,
        [rows, 1, 1],
        [row_block(s.ne[0]), 1, 1],
        0,
        p,
    )
}

/// Elements above the diagonal shifted by n_past set to -inf.
pub(super) fn diag_mask_inf(enc: &mut Encoder, id: TensorId, n_past: usize) -> Result<()> {
    let t = enc.graph.get(id);
    let d = enc.arg(id)?;
    let mut p = params(d, &[enc.arg(t.src[0])?]);
    p.i[0] = n_past.min(i32::MAX as usize) as i32;
    enc.launch_elems("softmax", "diag_mask_inf_f32", d.ne, p)
}
