//! flash_attn_ext: softmax(q k^T * scale + slope * mask) v for every query row, fused, with an
//! online softmax in f32 (the running maximum and sum are rescaled as keys stream past), so the
//! n_q x n_kv score matrix never exists.
//!
//! Shapes (ggml's): q [d, n_q, H, B] F32; k [d, n_kv, H_kv, B_kv] and v [dv, n_kv, H_kv, B_kv]
//! F32/F16, query head h reading kv head h / (H / H_kv) (grouped-query attention); mask
//! [n_kv, >= n_q, m2, m3] broadcast over heads and batches. The result is [dv, H, n_q, B].
//! With a logit softcap c, a score s becomes c * tanh(s / c) before the mask is added. With
//! sinks (F32 [H]), head h's sink joins each row's soft-max as one more logit with no value.

use tessera_core::{Error, Result};

use super::dot::{axpy, dot};
use super::softmax::alibi_slope;
use crate::parallel::for_ranges;
use crate::view::TView;

/// Query rows of one head handled together: each key and value row is converted once for all.
const QUERY_BLOCK: usize = 8;

/// The scalar parameters of the op.
pub(crate) struct Params {
    /// Factor on q k^T.
    pub scale: f32,
    /// ALiBi maximum bias (0: off).
    pub max_bias: f32,
    /// Logit softcap (0: off).
    pub softcap: f32,
}

/// The running state of one query row.
struct Row {
    /// Largest score so far.
    max: f32,
    /// Sum of exp(score - max) so far.
    sum: f32,
    /// Sum of exp(score - max) * v so far.
    acc: Vec<f32>,
}

/// Runs flash_attn_ext into `dst`.
pub(crate) fn run(
    p: &Params,
    dst: &TView,
    [q, k, v]: [&TView; 3],
    mask: Option<&TView>,
    sinks: Option<&TView>,
) -> Result<()> {
    let (d, n_q, heads, batches) = (q.ne[0], q.ne[1], q.ne[2], q.ne[3]);
    let (dv, n_kv) = (v.ne[0], k.ne[1]);
    let fits = k.ne[0] == d
        && v.ne[1] == n_kv
        && k.ne[2] == v.ne[2]
        && k.ne[3] == v.ne[3]
        && heads.checked_rem(k.ne[2]) == Some(0)
        && batches.checked_rem(k.ne[3]) == Some(0)
        && dst.ne == [dv, heads, n_q, batches]
        && mask.is_none_or(|m| m.ne[0] == n_kv && m.ne[1] >= n_q)
        && sinks.is_none_or(|s| s.ne == [heads, 1, 1, 1]);
    if !fits {
        return Err(Error::Invalid(format!(
            "flash_attn_ext: q {:?}, k {:?}, v {:?}, mask {:?} -> {:?} do not fit",
            q.ne,
            k.ne,
            v.ne,
            mask.map(|m| m.ne),
            dst.ne
        )));
    }
    let (gqa, bqa) = (heads / k.ne[2], batches / k.ne[3]);
    let q_blocks = n_q.div_ceil(QUERY_BLOCK);
    let sink_logits = match sinks {
        Some(s) => {
            let mut row = vec![0f32; heads];
            s.load_row([0, 0, 0], &mut row)?;
            Some(row)
        }
        None => None,
    };
    // With a softcap, the scale is applied inside the tanh.
    let (scale, cap) = if p.softcap != 0.0 {
        (p.scale / p.softcap, p.softcap)
    } else {
        (p.scale, 0.0)
    };

    for_ranges(
        heads * batches * q_blocks,
        n_q.min(QUERY_BLOCK) * n_kv * (d + dv),
        |tasks| {
            let mut qs = vec![0f32; QUERY_BLOCK * d];
            let mut masks = vec![
                0f32;
                if mask.is_some() {
                    QUERY_BLOCK * n_kv
                } else {
                    0
                }
            ];
            let mut krow = vec![0f32; d];
            let mut vrow = vec![0f32; dv];
            let mut out = vec![0f32; dv];
            let mut state: Vec<Row> = (0..QUERY_BLOCK)
                .map(|_| Row {
                    max: f32::NEG_INFINITY,
                    sum: 0.0,
                    acc: vec![0f32; dv],
                })
                .collect();
            for task in tasks {
                let qb = task % q_blocks;
                let h = (task / q_blocks) % heads;
                let b = task / (q_blocks * heads);
                let rows = qb * QUERY_BLOCK..((qb + 1) * QUERY_BLOCK).min(n_q);
                let nr = rows.len();
                let slope = alibi_slope(p.max_bias, h, heads);
                for (r, iq) in rows.clone().enumerate() {
                    q.load_row([iq, h, b], &mut qs[r * d..(r + 1) * d])?;
                    if let Some(m) = mask {
                        m.load_row(
                            [iq, h % m.ne[2], b % m.ne[3]],
                            &mut masks[r * n_kv..(r + 1) * n_kv],
                        )?;
                    }
                    let s = &mut state[r];
                    s.max = f32::NEG_INFINITY;
                    s.sum = 0.0;
                    s.acc.fill(0.0);
                }
                let kv = [0, h / gqa, b / bqa];
                for j in 0..n_kv {
                    let bias = |r: usize| {
                        if mask.is_some() {
                            slope * masks[r * n_kv + j]
                        } else {
                            0.0
                        }
                    };
                    if (0..nr).all(|r| bias(r) == f32::NEG_INFINITY) {
                        continue;
                    }
                    k.load_row([j, kv[1], kv[2]], &mut krow)?;
                    v.load_row([j, kv[1], kv[2]], &mut vrow)?;
                    for (r, s) in state.iter_mut().enumerate().take(nr) {
                        let mut score = dot(&qs[r * d..(r + 1) * d], &krow) * scale;
                        if cap != 0.0 {
                            score = cap * score.tanh();
                        }
                        score += bias(r);
                        if score == f32::NEG_INFINITY {
                            continue;
                        }
                        if score > s.max {
                            let shrink = (s.max - score).exp();
                            for a in s.acc.iter_mut() {
                                *a *= shrink;
                            }
                            s.sum = s.sum * shrink + 1.0;
                            s.max = score;
                            axpy(&mut s.acc, 1.0, &vrow);
                        } else {
                            let w = (score - s.max).exp();
                            s.sum += w;
                            axpy(&mut s.acc, w, &vrow);
                        }
                    }
                }
                // A sink adds exp(sink - max) to the sum and nothing to the values; a sum that
                // overflows leaves the row 0, as the keys' share of it is.
                let sink = sink_logits.as_ref().map(|l| l[h]);
                for (r, iq) in rows.enumerate() {
                    let s = &state[r];
                    let sum = match sink {
                        Some(l) => s.sum + (l - s.max).exp(),
                        None => s.sum,
                    };
                    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
                    for (o, &a) in out.iter_mut().zip(&s.acc) {
                        *o = a * inv;
                    }
                    dst.store_row([h, iq, b], &out)?;
                }
            }
            Ok(())
        },
    )
}
